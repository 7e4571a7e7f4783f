"""Activation checkpointing on any model: recompute some of its repeated blocks
(``autotune.runner.blocks`` finds them).

A model with no stack (nor declared blocks) may apply one layer again and again, held once:
ALBERT's shared layer group, a Perceiver's latent tower, a looped transformer. Its units are then
that layer's calls (``looped_modules``), counted by a forward of two samples in eval mode
(``count_calls``: on a rank, on the meta device before any trial, in the trace on fake
tensors), and ``checkpoint_segments = k`` checkpoints its first k calls of each forward; the
fallback blocks (``autotune.runner.blocks``) apply only where no such layer is found.

``checkpoint_segments = k`` wraps the first k blocks, in forward order, each as one non-reentrant
checkpoint segment: their inner activations are dropped after forward and recomputed in backward.
The rest run normally. k must not exceed the number of blocks found. Blocks with a parameter that
trains come first, then the frozen ones from the last (``checkpoint_order``): a frozen block
below every trainable one (a fine-tune's frozen lower layers, a frozen encoder run under
``no_grad``) keeps nothing for backward, so checkpointing it saves nothing, and a k that took it
first would change nothing at all; a frozen block above a trainable one passes gradients back
and keeps its activations like any other. (The search leaves out the k that would reach the
blocks that keep nothing: ``model_facts.idle_blocks``.)

``checkpoint_policy`` "selective" keeps, inside each checkpointed unit, the outputs of its
costly ops (matmuls, convolutions, fused attention: ``selective_checkpoint``) and recomputes
only the rest; "full" keeps the unit's input alone.

Recomputing a block runs its forward again, and a forward that updates the block's buffers
(BatchNorm's running statistics, spectral normalisation's power iteration) would update them
twice a step: running statistics that drift from an unchecked run's (torch's own checkpoint does
this, pytorch/pytorch#96136), and a recomputation that starts from the updated state rather than
the one the forward saw. Here the recomputation starts from the buffers the forward started from
and leaves them as the forward left them, so checkpointing changes no training state: the
buffers a block's ``state_dict`` saves (its state; a constant it derives, such as a mask, is not
saved and not copied) are copied before each forward and held until backward has recomputed
it. Under ``torch.compile`` the compiler recomputes inside its own graphs, which apply a
BatchNorm's update once (torch 2.13, on CPU); it cannot take these copies, so a compiled block
whose graph breaks (spectral normalisation's parametrization did) still updates twice.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

from autotune.config import CHECKPOINT_POLICIES
from autotune.errors import ConfigError
from autotune.runner.blocks import (
    LISTS,
    MINOR_SHARE,
    block_classes,
    found_blocks,
    is_scripted,
    may_loop,
    usable_blocks,
)
from autotune.runner.selective_checkpoint import (
    Contexts,
    compiled_contexts,
    out_of_place,
    selective_contexts,
)

OWN_CHECKPOINTING = ("gradient_checkpointing", "grad_checkpointing")
"""The flags by which a model's modules checkpoint themselves: Hugging Face's (set by
``gradient_checkpointing_enable``) and timm's (``set_grad_checkpointing``)."""


def _own_flags(model: nn.Module) -> list[tuple[nn.Module, str]]:
    """(module, flag) wherever one of ``OWN_CHECKPOINTING`` is on in ``model``."""
    return [
        (m, flag)
        for m in model.modules()
        for flag in OWN_CHECKPOINTING
        if getattr(m, flag, None) is True
    ]


def checkpoints_itself(model: nn.Module) -> bool:
    """Whether one of the model's modules has its own checkpointing on (``OWN_CHECKPOINTING``)."""
    return bool(_own_flags(model))


def refuses_own_checkpointing(model: nn.Module) -> str | None:
    """The model's class name where it says it has no checkpointing of its own (Hugging Face's
    ``supports_gradient_checkpointing = False``: ResNet's, ConvNeXt's, ALBERT's), so that the
    Trainer's ``gradient_checkpointing`` raises "does not support activation checkpointing"
    (transformers 5.17: "gradient checkpointing"); None where it has, or is no such model.
    ``apply_checkpointing`` checkpoints it all the same."""
    if getattr(type(model), "supports_gradient_checkpointing", None) is False:
        return type(model).__name__
    return None


LOOPED = "looped "
"""What ``Units.names`` puts before the class of a module the forward calls several times."""


@dataclass(frozen=True)
class Units:
    """What ``checkpoint_segments`` counts in a model: its repeated blocks, or, in a model with
    no stack of layers, the calls of the modules its forward runs several times (``loops``:
    each with its calls per forward)."""

    blocks: tuple[nn.Module, ...] = ()
    loops: tuple[tuple[nn.Module, int], ...] = ()

    @property
    def count(self) -> int:
        return sum(calls for _, calls in self.loops) if self.loops else len(self.blocks)

    @property
    def names(self) -> str:
        """The blocks' classes (``block_classes``); a loop's with ``LOOPED`` before them."""
        if self.loops:
            return LOOPED + block_classes([module for module, _ in self.loops])
        return block_classes(list(self.blocks))


def count_calls(model: nn.Module, forward: Callable[[], object]) -> dict[int, int]:
    """How often ``forward()``, one forward of ``model``, calls each of its modules (by ``id``),
    run in eval mode and without gradients (no dropout drawn, no running statistic moved, as
    ``lazy_modules.materialize`` runs one); {} where it fails (no loop is then found)."""
    calls: Counter[int] = Counter()

    def seen(module: nn.Module, _args: object) -> None:
        calls[id(module)] += 1

    # a TorchScript module refuses hooks, and is never a loop (``looped_modules``)
    handles = [m.register_forward_pre_hook(seen) for m in model.modules() if not is_scripted(m)]
    training = model.training
    model.eval()
    try:
        with torch.no_grad():
            forward()
    except Exception:  # a forward that cannot run here: the structure alone decides
        return {}
    finally:
        for handle in handles:
            handle.remove()
        model.train(training)
    return dict(calls)


def looped_modules(model: nn.Module, calls: Mapping[int, int]) -> list[tuple[nn.Module, int]]:
    """(module, calls per forward) of each module the forward runs several times (``calls``:
    ``count_calls``'s): a layer applied again and again, as ALBERT's shared layer group, a
    Perceiver's latent tower or a looped transformer's block, or a backbone shared by several
    inputs (a Siamese network's, DINO's over crops of two sizes). The outermost such modules with
    children and a parameter that trains, holding at least ``MINOR_SHARE`` of the model's
    parameters (an activation module or a norm reused everywhere is no layer), in registration
    order."""
    total = sum(p.numel() for p in model.parameters())
    found: list[tuple[nn.Module, int]] = []
    inside: set[int] = set()
    for module in model.modules():
        if module is model or id(module) in inside or isinstance(module, LISTS):
            continue
        params = list(module.parameters())
        if (
            calls.get(id(module), 0) >= 2
            and any(module.children())
            and any(p.requires_grad for p in params)
            and sum(p.numel() for p in params) >= MINOR_SHARE * total
            and not is_scripted(module)
        ):
            found.append((module, calls[id(module)]))
            inside.update(id(m) for m in module.modules())
    return found


def checkpoint_units(model: nn.Module, calls: Mapping[int, int] | None = None) -> Units:
    """What ``checkpoint_segments`` counts in ``model``: its declared or stacked blocks where it
    has them, else the calls of the modules its forward loops over (``looped_modules``, from
    ``calls``: ``count_calls``'s, None where no forward was counted), else the fallback's
    blocks (``autotune.runner.blocks``)."""
    blocks, structured = found_blocks(model)
    if not structured and calls:
        loops = looped_modules(model, calls)
        if loops:
            return Units(loops=tuple(loops))
    return Units(blocks=tuple(usable_blocks(model, blocks)))


def apply_checkpointing(
    model: nn.Module,
    segments: int,
    calls: Mapping[int, int] | None = None,
    policy: str = "full",
) -> list[nn.Module]:
    """Checkpoint the first ``segments`` units of ``model`` (``checkpoint_units``; of repeated
    blocks, ``checkpoint_order``'s first: those that train); return the modules checkpointed, a
    looped one once for each of its calls checkpointed. Without ``calls``
    (``training.loop_calls``) no looped layer is found: a model whose only units would be one's
    is told to give them; a model with fallback blocks has those checkpointed, where a trial,
    which counts the calls, would have checkpointed a looped layer's first calls. Checkpointing
    the model turned on itself is turned off first, so that ``segments`` is the one control and
    0 is off: a model built
    with Hugging Face's ``gradient_checkpointing_enable()`` measured as "off" recomputed every
    block, and checkpointed again inside its own. ``policy`` "selective" keeps the outputs of
    each checkpointed unit's costly ops (``selective_checkpoint``); "full" keeps none."""
    if policy not in CHECKPOINT_POLICIES:
        accepted = ", ".join(CHECKPOINT_POLICIES)
        raise ConfigError(f"checkpoint_policy={policy!r} is not one of {accepted}")
    for module, flag in _own_flags(model):
        setattr(module, flag, False)
    if segments == 0:
        return []
    units = checkpoint_units(model, calls)
    if calls is None and not units.blocks and may_loop(model):
        raise ConfigError(
            f"checkpoint_segments={segments}: {type(model).__name__} has no repeated blocks; "
            "a layer its forward loops over is found from its calls: apply_checkpointing(model, "
            f"{segments}, loop_calls(model, batch)) (autotune.runner.training.loop_calls, a "
            "batch of your data)"
        )
    check_segments(model, segments, units)
    selective = policy == "selective"
    if units.loops:
        chosen = _checkpoint_calls(model, units.loops, segments, selective)
    else:
        chosen = checkpoint_order(list(units.blocks))[:segments]
        for block in chosen:
            block.forward = _checkpointed(block, selective)
    if selective:
        for unit in set(chosen):
            out_of_place(unit)
    _without_cache(model)
    return chosen


def _checkpoint_calls(
    model: nn.Module,
    loops: tuple[tuple[nn.Module, int], ...],
    segments: int,
    selective: bool,
) -> list[nn.Module]:
    """Checkpoint the first ``segments`` calls the looped modules get in each forward of
    ``model``, in the order the forward makes them: a count that each forward of the model
    starts again (a forward pre-hook), and that a recomputation, which calls the module's own
    forward, does not move."""
    made = [0]

    def new_forward(_model: nn.Module, _args: object) -> None:
        made[0] = 0

    def counted(own: Callable[..., Any], checkpointed: Callable[..., Any]) -> Callable[..., Any]:
        def looped_forward(*args: Any, **kwargs: Any) -> Any:
            made[0] += 1
            return (checkpointed if made[0] <= segments else own)(*args, **kwargs)

        return looped_forward

    model.register_forward_pre_hook(new_forward)
    for module, _ in loops:
        module.forward = counted(module.forward, _checkpointed(module, selective))
    chosen: list[nn.Module] = []
    for module, calls in loops:
        chosen += [module] * min(calls, segments - len(chosen))
    return chosen


def check_segments(model: nn.Module, segments: int, units: Units) -> None:
    """A one-line ``ConfigError`` where ``segments`` asks for more of ``model``'s checkpointing
    ``units`` than there are (on a rank, and before a trial is launched, from a build on the
    meta device)."""
    if units.loops:
        if segments > units.count:
            raise ConfigError(
                f"checkpoint_segments={segments} exceeds the {units.count} calls of "
                f"{type(model).__name__}'s {units.names.replace(',', ', ')} in a forward; use "
                f"0..{units.count}"
            )
        return
    blocks = list(units.blocks)
    if not blocks:
        scripted = (
            " (TorchScript modules are not checkpointed)"
            if any(is_scripted(m) for m in model.modules())
            else ""
        )
        raise ConfigError(
            f"checkpoint_segments={segments}: {type(model).__name__} has no repeated blocks to "
            f"checkpoint{scripted}; use checkpoint_segments=0"
        )
    if segments > len(blocks):
        raise ConfigError(
            f"checkpoint_segments={segments} exceeds the {len(blocks)} repeated "
            f"{block_classes(blocks).replace(',', ', ')} blocks of {type(model).__name__}; use "
            f"0..{len(blocks)}"
        )


def checkpoint_order(blocks: list[nn.Module]) -> list[nn.Module]:
    """``blocks`` in the order checkpointing takes them: those with a parameter that trains, in
    forward order, then the frozen ones from the last back (the module docstring says why)."""
    trains = [b for b in blocks if any(p.requires_grad for p in b.parameters())]
    taken = {id(b) for b in trains}
    return trains + [b for b in reversed(blocks) if id(b) not in taken]


def _without_cache(model: nn.Module) -> None:
    """Turn off a Hugging Face model's key/value cache, as its own gradient checkpointing does:
    a cache that a block's forward fills is filled again when the block is recomputed, so the
    recomputation saves other tensors than the forward did (T5's decoder: "A different number
    of tensors was saved"). Training never reads the cache."""
    for module in model.modules():
        config = getattr(module, "config", None)
        if getattr(config, "use_cache", False) is True:
            config.use_cache = False  # type: ignore[union-attr]


def _checkpointed(block: nn.Module, selective: bool = False) -> Callable[..., Any]:
    """``block``'s forward, run as one non-reentrant checkpoint segment that keeps its training
    state (``_same_buffers``), and, ``selective``, the outputs of its costly ops
    (``selective_checkpoint``). Set as an instance attribute, ``__call__`` (and with it every
    hook, FSDP's included) still runs."""
    forward = block.forward
    # The block's training state among its buffers: those its state_dict saves (running
    # statistics, a power iteration's vectors), not constants it derives (masks, rotary tables)
    saved = block.state_dict(keep_vars=True)
    state = [name for name, _ in block.named_buffers() if name in saved]

    def checkpointed_forward(*args: Any, **kwargs: Any) -> Any:
        makers: list[Contexts] = []
        # the compiler recomputes in its own graphs, which take no copies (module docstring)
        if state and not torch.compiler.is_compiling():
            makers.append(partial(_same_buffers, block, state))
        if selective:  # entered inside the buffers' copies: its recomputation sees no copy
            compiling = torch.compiler.is_compiling()
            makers.append(compiled_contexts if compiling else selective_contexts)
        if not makers:
            return checkpoint(forward, *args, use_reentrant=False, **kwargs)
        contexts = makers[0] if len(makers) == 1 else partial(_together, makers)
        return checkpoint(forward, *args, use_reentrant=False, context_fn=contexts, **kwargs)

    return checkpointed_forward


def _together(
    makers: list[Contexts],
) -> tuple[AbstractContextManager[None], AbstractContextManager[None]]:
    """The (forward, recomputation) contexts that ``makers`` make, each pair entered as one, the
    first outermost."""
    pairs = [make() for make in makers]
    return _entered([p[0] for p in pairs]), _entered([p[1] for p in pairs])


@contextmanager
def _entered(contexts: list[AbstractContextManager[None]]) -> Iterator[None]:
    with ExitStack() as stack:
        for context in contexts:
            stack.enter_context(context)
        yield


def _same_buffers(
    block: nn.Module, names: list[str]
) -> tuple[AbstractContextManager[None], AbstractContextManager[None]]:
    """(forward, recomputation) contexts for one checkpointed call of ``block``: its buffers
    ``names`` as they were before the forward are kept, the recomputation starts from them,
    and after it they are put back as the forward left them."""
    with torch.no_grad():
        before = {name: block.get_buffer(name).clone() for name in names}

    @contextmanager
    def recomputation() -> Iterator[None]:
        with torch.no_grad():
            after = {name: block.get_buffer(name).clone() for name in before}
            for name, value in before.items():
                _put(block.get_buffer(name), value)
        try:
            yield
        finally:
            with torch.no_grad():
                for name, value in after.items():
                    _put(block.get_buffer(name), value)

    return nullcontext(), recomputation()


def _put(buffer: torch.Tensor, value: torch.Tensor) -> None:
    """``value`` into ``buffer`` in place, resized first where the forward resized it (a
    quantization observer's per-channel minimum starts empty and takes its channels in its
    first forward, as the observer itself resizes it)."""
    if buffer.shape != value.shape:
        buffer.resize_(value.shape)
    buffer.copy_(value)
