"""Exact values of the small tensors a traced step makes itself, for what it reads from them.

A model may build a tensor from constants and branch on its values: Longformer makes its
attention mask with ``torch.ones``, marks global tokens in it, and asks
``is_index_global_attn.flatten().any().item()``. Fake tensors hold no values, so the trace
used to stop there. ``Shadows`` keeps beside such a fake tensor a real one on the CPU with its
values: made by a factory (``ones``, ``zeros``, ``full``, ``arange``, ``*_like``, a constant
``torch.tensor``), or by any deterministic op whose tensor inputs all have one (comparisons,
arithmetic, views, in-place writes: a real view shares its base's storage, so
``mask[:, 0] = 1`` writes into the base's values as it does in the model). A size or value
read from a shadowed tensor (``nonzero``, ``masked_select``, ``.item()``, a branch) is then
the real one, and nothing is assumed. A tensor of more than ``LIMIT`` elements gets no shadow
(the attention scores are not control flow), nor does a random draw, an ``empty`` one, or a
tensor an op wrote into from a tensor without one (its values are then unknown, and so are
its views').

The batch's own integer values (``fake_routing``'s observed samples) seed shadows too, and each
shadow says where its values came from (``ORIGINS``): what the batch's values answer holds for
the traced batch, which the plan says on its "assumed" line.

Relies on ``torch.utils._python_dispatch._disable_current_modes`` (private: pinned by
``tests/runner/test_fake_shadows.py``) to run the real op beneath the fake mode.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_map
from torch.utils.weak import WeakIdKeyDictionary

LIMIT = 1 << 20
"""The most elements a shadow holds (4 MiB of fp32): masks, positions and lengths are far
smaller; an activation is not read for its values."""

ORIGINS = ("made", "whole", "sampled")
"""Where a shadow's values came from, from the surest: the trace made them; the traced batch's
own (a micro-batch of exactly the samples observed); the first samples' repeated to the
micro-batch. A value computed from several is as sure as the least sure of them."""

_aten = torch.ops.aten
_SHAPE_ONLY = {
    _aten.zeros_like.default, _aten.ones_like.default, _aten.full_like.default,
    _aten.new_zeros.default, _aten.new_ones.default, _aten.new_full.default,
}  # fmt: skip
"""Factories whose tensor argument gives a shape, dtype and device, not values."""


class Shadows:
    """Real values beside fake tensors (see the module): ``inputs`` finds an op's, ``run`` runs
    the op on them and ``attach`` keeps what it gave."""

    def __init__(self) -> None:
        self.real: Any = WeakIdKeyDictionary()  # fake tensor -> (real tensor, origin)
        self.unknown: set[int] = set()  # real storages written from a tensor without a shadow

    def seed(self, fake: torch.Tensor, values: Any, origin: str) -> bool:
        """``fake`` holds ``values``, a NumPy array, from ``origin`` (``ORIGINS``); False where
        it cannot be shadowed (over ``LIMIT`` elements, or another shape)."""
        from torch.utils._python_dispatch import _disable_current_modes

        if values.size > LIMIT or tuple(values.shape) != tuple(fake.shape):
            return False
        with _disable_current_modes():
            self.real[fake] = (torch.from_numpy(values).to(fake.dtype), origin)
        return True

    def get(self, tensor: Any) -> tuple[torch.Tensor, str] | None:
        """The real values of ``tensor`` and their origin, or None."""
        if not isinstance(tensor, torch.Tensor):
            return None
        if not isinstance(tensor, FakeTensor):  # a real constant: its own values
            return (tensor, "made") if tensor.numel() <= LIMIT else None
        got: tuple[torch.Tensor, str] | None = self.real.get(tensor)
        constant: torch.Tensor | None = getattr(tensor, "constant", None)  # one made from it
        if got is None and constant is not None:
            got = (constant, "made")
        if got is None or got[0].untyped_storage().data_ptr() in self.unknown:
            return None
        return got

    def inputs(self, func: Any, args: Any, kwargs: Any) -> tuple[Any, str] | None:
        """What swaps each of ``func``'s tensors for its shadow, and the least sure origin of
        those; None where an input has no shadow, or the op draws at random or leaves values
        undefined. An op that writes into a shadowed tensor from one without a shadow forgets
        that tensor's values (``unknown``)."""
        kind = _kind(func)
        if kind.unknowable:
            self.forget_written(func, args, kwargs)
            return None
        real: dict[int, torch.Tensor] = {}
        least = 0
        for tensor in _tensors(args, kwargs):
            if kind.shape_only:  # only its shape, dtype and device are read
                continue
            shadow = self.get(tensor)
            if shadow is None:
                self.forget_written(func, args, kwargs)
                return None
            real[id(tensor)] = shadow[0]
            least = max(least, ORIGINS.index(shadow[1]))

        def swap(value: Any) -> Any:
            if not isinstance(value, torch.Tensor):
                return value
            if kind.shape_only:
                return torch.empty((), dtype=value.dtype).expand(value.shape)
            return real[id(value)]

        return swap, ORIGINS[least]

    def run(self, func: Any, args: Any, kwargs: Any, swap: Any) -> Any:
        """``func`` on the shadows ``swap`` (from ``inputs``) gives, beneath the fake mode;
        None where it fails (a shadow is a help: without it the trace goes on as before)."""
        from torch.utils._python_dispatch import _disable_current_modes

        try:
            with _disable_current_modes():
                return func(*tree_map(swap, args), **_on_cpu(tree_map(swap, kwargs)))
        except Exception:  # a shadow is a help: any failure leaves the values unknown
            self.forget_written(func, args, kwargs)
            return None

    def attach(self, out: Any, result: Any, origin: str) -> None:
        """Each fake output of ``out`` gets the real tensor at its place in ``result``."""
        fakes, _ = tree_flatten(out)
        reals, _ = tree_flatten(result)
        for fake, real in zip(fakes, reals, strict=False):
            if isinstance(fake, torch.Tensor) and isinstance(real, torch.Tensor):
                if real.numel() > LIMIT or tuple(real.shape) != tuple(fake.shape):
                    continue
                if not real._is_view():  # a fresh storage: nothing unknown was written to it
                    self.unknown.discard(real.untyped_storage().data_ptr())
                self.real[fake] = (real, origin)

    @staticmethod
    def numpy(real: torch.Tensor) -> Any:
        """``real``'s values as NumPy (its memory where NumPy has the dtype)."""
        from torch.utils._python_dispatch import _disable_current_modes

        with _disable_current_modes():
            return (real.float() if real.dtype is torch.bfloat16 else real).numpy()

    def forget_written(self, func: Any, args: Any, kwargs: Any) -> None:
        for i, name in _kind(func).written:
            value = args[i] if i < len(args) else kwargs.get(name)
            for written in tree_flatten(value)[0]:
                shadow = self.get(written)
                if shadow is not None:
                    self.unknown.add(shadow[0].untyped_storage().data_ptr())


@dataclass(frozen=True)
class _Kind:
    unknowable: bool  # a random draw, or values left undefined (``empty``)
    shape_only: bool  # ``_SHAPE_ONLY``
    written: tuple[tuple[int, str], ...]  # the arguments it writes into: position, name


_KINDS: dict[Any, _Kind] = {}


def _kind(func: Any) -> _Kind:
    """What ``Shadows`` needs of an op, read from its tags and schema once."""
    if func not in _KINDS:
        _KINDS[func] = _Kind(
            unknowable=torch.Tag.nondeterministic_seeded in func.tags or "empty" in func.__name__,
            shape_only=func in _SHAPE_ONLY,
            written=tuple(
                (i, a.name)
                for i, a in enumerate(func._schema.arguments)
                if a.alias_info is not None and a.alias_info.is_write
            ),
        )
    return _KINDS[func]


def _tensors(args: Any, kwargs: Any) -> Any:
    """The tensors among an op's arguments (a list argument's too: ``index``'s indices)."""
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            yield value
        elif isinstance(value, list | tuple):
            yield from (v for v in value if isinstance(v, torch.Tensor))


def _on_cpu(kwargs: dict[str, Any]) -> dict[str, Any]:
    """A factory's ``device`` is the CPU's for its shadow (a CUDA trace's tensors are fake)."""
    if "device" in kwargs and kwargs["device"] is not None:
        return {**kwargs, "device": torch.device("cpu")}
    return kwargs


class FakeDeepcopies(TorchFunctionMode):
    """``copy.deepcopy`` of a fake tensor as a clone of it, under ``UniformRouting`` keeping its
    shadow. torch's ``Tensor.__deepcopy__`` sets a new tensor's storage to a copy of the fake
    one's, which is on the meta device, and fails ("Attempted to set the storage of a tensor on
    device "meta" to a storage on different device "cpu""): a model that copies a module with
    buffers as it is built (MoCo's and BYOL's momentum encoders, an EMA teacher) could only be
    built on the meta device, where no value is kept. A parameter copies by ``clone`` already."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is torch.Tensor.__deepcopy__ and isinstance(args[0], FakeTensor):
            tensor, memo = args
            copied = tensor.detach().clone().requires_grad_(tensor.requires_grad)
            memo[id(tensor)] = copied
            return copied
        return func(*args, **(kwargs or {}))
