"""Sizes that a mixture of experts' routing decides, estimated for the memory trace.

Under fake tensors a tensor has a shape and no values, so ``torch.where(mask)`` (``nonzero``:
how many tokens an expert receives) has no size, and the trace stops. This dispatch mode, entered
inside the trace's ``FakeTensorMode``, follows where a mask came from and gives ``nonzero`` the
size it has **if routing is uniform**: indices chosen by ``topk``, ``argmax`` or ``sort`` over a
dimension of D are taken as spread evenly over the D values, so ``indices == e`` (and
``one_hot``, which compares the same way) holds for 1/D of them, a sum of such a mask counts
its share, and "count > 0" holds as often as a count is non-zero. A token's place among its
expert's (``cumsum`` of the routing mask) is within a capacity c where the expected count has
not passed c, and a mask kept where another holds (multiplied) holds at the product of their
shares: Switch Transformers' expert capacity. A load-balancing loss trains routing towards
uniform; what the trials measure shows an imbalance (the calibration follows it).

A comparison of the batch's own integer or boolean values (labels, token ids, masks) with a
number holds as often as it does in the dataset's first samples, those the traced batch is
made of (up to 64: DeBERTa's loss keeps the rows whose label is not negative, all of them;
``x[attention_mask.bool()]`` keeps the unpadded share), masks combined with ``&``, ``|`` and
``~`` hold as those samples' combine, a single value read from them is the first sample's, and
their max, min, any or all is those samples' (a check such as ``labels.max() >= vocab_size``
passes as they do). Where the traced batch holds every value of such a tensor (the micro-batch
is at most 64 samples), its sum is read too, and a reduction of it is not counted as assumed:
a graph batch's number of graphs, ``int(graph.max()) + 1``, which every batch of its size
holds. CTC's loss keeps a table sized by the longest target, a value: the targets' lengths
counted from the labels' mask, at those samples' share (Wav2Vec2's CTC head). Every other such
size is the traced batch's, which another batch's may differ from: the plan says so on its
"assumed" line.

Two more things a training step reads from values it does not have are given theirs: a uniform
random draw (``torch.rand``) compared with p is true with chance p, and a branch on it takes its
likeliest side (Wav2Vec2's LayerDrop, ``torch.rand([]) < 0.1``, skips no layer); a masked
assignment ``x[mask] = v`` (its SpecAugment) holds ``x``'s memory whatever the mask selects, and
backward's selection of ``v``'s gradient by that mask is taken at every element, an upper bound
of a transient the size of ``v``'s broadcast.

Fake tensors also drop a sparse tensor's entries: an ``EmbeddingBag(sparse=True)``'s gradient,
or a clone, sum or product of a sparse COO tensor, may come out with none. A lookup's gradient
gets one entry per index, as the real kernel makes it; any other such output its inputs' (a
sum: all of both, as a real uncoalesced sum holds; else the largest input's, an upper bound for
``coalesce``).

Before any of these rules, an op whose tensors all hold known values runs on those values too
(``fake_shadows``: tensors the model makes from constants, Longformer's global-attention mask,
and the batch's own integer values), so a size or branch read from them is the real one; the
rules answer what such values cannot (routing, draws, masks mixed with activations).

A ``nonzero`` whose mask came from anything else keeps its unknown size, and the trace fails as
before (the search then predicts by its fit over trials). ``torch.utils._python_dispatch`` is
private: ``tests/runner/test_fake_memory.py`` pins what is relied on (a Mixtral-style layer
traced at the uniform share).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves, tree_map_only

from autotune.runner.fake_shadows import LIMIT, Shadows


@dataclass(frozen=True)
class _Values:
    """What is known of a tensor's values: integers spread evenly over ``range(spread)``, or
    each element the number of successes of ``trials`` draws that succeed with ``chance``."""

    spread: int = 0
    chance: float = 0.0
    trials: int = 1
    draw: bool = False
    """Decided by a uniform random draw in [0, 1) (``torch.rand``): the draw itself, or whether
    it lies below p, true with ``chance`` p."""
    sampled: bool = False
    """Decided by the batch's own values, at the share the dataset's first samples show."""
    observed: Any = field(default=None, compare=False)
    """The first samples' values of a batch tensor (a NumPy array), for comparisons to count."""
    whole: bool = False
    """``observed`` is every value the tensor holds (a batch of exactly the micro-batch's
    samples, or a tensor the trace made): a reduction of it reads the traced batch's own
    number."""
    running: bool = False
    """A running count along a dimension of ``trials`` (``cumsum`` of a mask of ``chance``): a
    token's place among those routed to its expert so far (Switch Transformers' priority)."""
    index: int = 0
    of: int = 0
    """Counts read one by one (``.tolist()``): this one's position among ``of`` counts, so
    that their rounding sums to the whole (100 tokens over 7 experts: 15, 15, 14, ...)."""

    @property
    def seen(self) -> bool:
        """Whether there are observed values to answer from (not an empty sample's)."""
        return self.observed is not None and bool(self.observed.size)

    def nonzero_share(self) -> float:
        if self.seen:
            return float((self.observed != 0).mean())  # the first sample's
        if self.spread:
            return 1.0 - 1.0 / self.spread  # one of the values is zero
        return 1.0 - (1.0 - self.chance) ** self.trials


_aten = torch.ops.aten
_SAME_VALUES = {
    _aten.view.default, _aten._unsafe_view.default, _aten.reshape.default,
    _aten.permute.default, _aten.transpose.int, _aten.t.default, _aten.select.int,
    _aten.slice.Tensor, _aten.squeeze.default, _aten.squeeze.dim, _aten.squeeze.dims,
    _aten.unsqueeze.default, _aten.expand.default, _aten.clone.default, _aten.alias.default,
    _aten._to_copy.default, _aten.detach.default, _aten.index.Tensor, _aten.flatten.using_ints,
}  # fmt: skip
"""Ops that move, select or copy elements: the values keep their spread (a selection of evenly
routed indices is as evenly routed)."""
_INDICES = {
    _aten.topk.default: 1, _aten.sort.default: 1, _aten.sort.stable: 1,
    _aten.max.dim: 1, _aten.min.dim: 1,
}  # fmt: skip
"""Ops whose output (at this position) holds indices into the dimension they reduce."""
_ARG = {_aten.argmax.default, _aten.argmin.default}
_SORTS = {_aten.sort.default, _aten.sort.stable}
_SUM = {_aten.sum.dim_IntList, _aten.sum.default}
_WHOLE_REDUCTIONS = {
    _aten.max.default: "max", _aten.min.default: "min", _aten.sum.default: "sum",
    _aten.any.default: "any", _aten.all.default: "all",
}  # fmt: skip
"""Reductions to one number that the observed values of a whole batch tensor answer (a graph
batch's number of graphs, ``int(graph.max()) + 1``, sizes its pooled output); all but the sum
are taken from a sample's values too, as its check reads them (Wav2Vec2's CTC head refuses
``labels.max() >= vocab_size``)."""
_OBSERVED_LOGIC = {
    _aten.bitwise_and.Tensor: np.logical_and, _aten.logical_and.default: np.logical_and,
    _aten.bitwise_or.Tensor: np.logical_or, _aten.logical_or.default: np.logical_or,
    _aten.bitwise_not.default: np.logical_not, _aten.logical_not.default: np.logical_not,
}  # fmt: skip
"""Masks combined from comparisons of the batch's values (``(labels != -100) & (labels !=
blank)``): the combination of their observed values."""
_NONZERO_TEST = {_aten.gt.Scalar, _aten.ne.Scalar}
_DRAWS = {_aten.rand.default, _aten.rand_like.default, _aten.uniform_.default}
_BELOW = {
    _aten.lt.Scalar: True, _aten.le.Scalar: True, _aten.gt.Scalar: False, _aten.ge.Scalar: False,
}  # fmt: skip
"""Comparisons of a draw with a probability, and whether they hold below it."""
_OBSERVED_COMPARE = {
    _aten.ge.Scalar: "__ge__", _aten.gt.Scalar: "__gt__", _aten.le.Scalar: "__le__",
    _aten.lt.Scalar: "__lt__", _aten.eq.Scalar: "__eq__", _aten.ne.Scalar: "__ne__",
}  # fmt: skip
"""Comparisons a batch tensor's observed values answer (NumPy's, outside the fake mode)."""
_EMBEDDING_BACKWARD = {
    _aten.embedding_backward.default, _aten.embedding_sparse_backward.default,
    _aten._embedding_bag_backward.default, _aten._embedding_bag_sparse_backward.default,
}  # fmt: skip
"""Backwards of a lookup whose sparse gradient holds one entry per index (the second argument)."""
_SPARSE_SUMS = {_aten.add.Tensor, _aten.sub.Tensor}
"""Ops whose sparse output holds the entries of both sparse inputs (uncoalesced)."""
_MASKED_ASSIGN = {_aten.index_put_.default, _aten.index_put.default}
_CTC_LOSS = {_aten._ctc_loss.Tensor, _aten._ctc_loss.default}
"""CTC's loss, whose kernel sizes its table of forward variables by the longest target, a value
(speech recognition heads: Wav2Vec2's, HuBERT's)."""
_COMPARE = {
    _aten.eq.Tensor: True, _aten.eq.Scalar: True, _aten.ne.Tensor: False, _aten.ne.Scalar: False,
}  # fmt: skip
"""Comparisons, and whether they test equality (else inequality)."""


class UniformRouting(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Enter inside ``FakeTensorMode`` and below a memory tracker; ``estimated`` counts the
    sizes and values it gave (a ``nonzero``, ``masked_select`` or ``bincount`` at its uniform
    share, a value read out of routing)."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        from torch.utils.weak import WeakIdKeyDictionary

        self.shadows = Shadows()  # exact values of the small tensors the trace makes
        self.known: Any = _Known(self.shadows)
        self.assigned: Any = WeakIdKeyDictionary()  # masks a masked assignment used
        self.estimated = 0
        self.drawn = 0  # branches a random draw decided, taken at their likeliest
        self.sampled = 0  # sizes the batch's values decided, at the first samples' share

    def observe(self, tensor: Any, values: Any) -> None:
        """``tensor`` (of the fake batch) holds values like ``values`` (the first samples')."""
        whole = tuple(values.shape) == tuple(tensor.shape)
        if whole or tuple(values.shape[1:]) == tuple(tensor.shape[1:]):
            rows = np.arange(tensor.shape[0]) % max(1, values.shape[0])  # the samples, again
            if self.shadows.seed(tensor, values[rows], "whole" if whole else "sampled"):
                return  # its shadow holds them, and forgets them when a write it cannot follow
        self.known[tensor] = _Values(observed=values, sampled=True, whole=whole)

    def lengths(self, tensor: Any) -> Any:
        """What the trace knows of a batch tensor of sequence lengths (``fake_recurrent``): the
        first samples', as NumPy; None where it knows none. Counted as sampled."""
        values: _Values | None = (
            self.known.get(tensor) if isinstance(tensor, torch.Tensor) else None
        )
        if values is None or not values.seen:
            return None
        self.sampled += 1
        return values.observed

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        shadowed = self.shadows.inputs(func, args, kwargs)
        if shadowed is not None:
            return self._mirrored(func, args, kwargs, shadowed)
        known = args[0] in self.known if args and isinstance(args[0], torch.Tensor) else False
        if func is _aten.nonzero.default and known:
            mask = args[0]
            rows = round(mask.numel() * self.known[mask].nonzero_share())
            self._count(self.known[mask])
            out = torch.empty((rows, mask.dim()), dtype=torch.long, device=mask.device)
            self.known[out] = _Values(spread=max(mask.shape, default=1))  # coordinates
            return out
        if func is _aten.masked_select.default and args[1] in self.known:
            values, mask = args
            selected = max(values.numel(), mask.numel()) * self.known[mask].nonzero_share()
            self._count(self.known[mask])
            return torch.empty(round(selected), dtype=values.dtype, device=values.device)
        if func is _aten.bincount.default and known and self.known[args[0]].spread:
            indices = args[0]  # its length is the largest index's, a value: the spread's here
            spread = self.known[indices].spread
            length = max(spread, int(kwargs.get("minlength", args[2] if len(args) > 2 else 0)))
            out = torch.empty(length, dtype=torch.long, device=indices.device)
            self.known[out] = _Values(chance=1 / spread, trials=indices.numel())
            self.estimated += 1
            return out
        if func is _aten._local_scalar_dense.default and known:
            self._count(self.known[args[0]])
            return self._likeliest(args[0])
        if func in _MASKED_ASSIGN and any(_is_mask(i) for i in args[1]):
            # x[mask] = v (Wav2Vec2's SpecAugment): x holds the same memory however many
            # elements the mask selects; backward selects v's gradient by the same mask
            for index in args[1]:
                if _is_mask(index):
                    self.assigned[index] = True
            return args[0] if func is _aten.index_put_.default else torch.empty_like(args[0])
        if func is _aten.index.Tensor and any(i in self.assigned for i in args[1] if _is_mask(i)):
            return _selected(*args)
        if func is _aten.index.Tensor and any(_is_mask(i) and i in self.known for i in args[1]):
            # x[mask] with a mask the trace knows the share of (the batch's attention mask:
            # unpadding): that share of the mask's elements
            masks = [self.known[i] for i in args[1] if _is_mask(i) and i in self.known]
            for known_mask in masks:
                self._count(known_mask)
            return _selected(args[0], args[1], share=min(m.nonzero_share() for m in masks))
        if func in _CTC_LOSS:
            return self._ctc_loss(*args)
        if func is _aten._grouped_mm.default and args[0].dtype != torch.bfloat16:
            return _grouped_mm_output(*args, **kwargs)  # its fake kernel knows bf16 only
        out = func(*args, **kwargs)
        if isinstance(out, torch.Tensor) and out.is_sparse and not out._nnz():
            return _with_entries(out, _sparse_entries(func, args))
        if func is _aten.unbind.int and known:  # .tolist(): one value each, in order
            whole: _Values = self.known[args[0]]
            counts = args[0].dim() == 1 and not whole.spread
            for index, part in enumerate(out):
                self.known[part] = replace(whole, index=index, of=len(out)) if counts else whole
            return out
        values = self._values(func, args, kwargs, out)
        if values is not None:
            self.known[out[_INDICES[func]] if func in _INDICES else out] = values
        if func in _SORTS and known and self.known[args[0]].seen:
            self.known[out[0]] = self.known[args[0]]  # the same values, in another order
        return out

    def _mirrored(self, func: Any, args: Any, kwargs: Any, shadowed: tuple[Any, str]) -> Any:
        """``func`` on fake tensors whose values all have shadows (``fake_shadows``): a value
        or size read from them is the real one, counted where the batch's values gave it (a
        reduction of the traced batch's own values excepted, as in ``_values``), and the
        outputs keep their values (``_Known`` gives them to the rules below)."""
        swap, origin = shadowed
        if origin == "whole" and func in _WHOLE_REDUCTIONS:
            origin = "made"  # the traced batch's own number (a graph batch's graphs)
        dependent = torch.Tag.data_dependent_output in func.tags
        if dependent or _sized_by_values(func, args):
            result = self.shadows.run(func, args, kwargs, swap)
            if result is None:
                return func(*args, **kwargs)
            self.sampled += origin != "made"
            if dependent:
                return result
            device = next(a.device for a in tree_leaves(args) if isinstance(a, torch.Tensor))
            out = tree_map_only(
                torch.Tensor,
                lambda r: torch.empty_strided(r.shape, r.stride(), dtype=r.dtype, device=device),
                result,
            )
        else:
            out = func(*args, **kwargs)
            sizes = [t.numel() for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
            if max(sizes, default=0) > LIMIT:  # not control flow: not computed
                self.shadows.forget_written(func, args, kwargs)
                return out
            result = self.shadows.run(func, args, kwargs, swap)
        self.shadows.attach(out, result, origin)
        if func is _aten.arange.default:  # also what one_hot compares routed indices with
            self.known[out] = _Values(spread=out.numel())
        return out

    def _count(self, values: _Values) -> None:
        if values.draw:
            self.drawn += 1
        elif values.sampled:
            self.sampled += 1  # the traced batch's values: another batch's may differ
        elif not values.whole:
            self.estimated += 1
        # else read whole from the traced batch (a graph batch's number of graphs, which every
        # batch of its size holds), or made by the trace itself (a shadow's): not counted

    def _likeliest(self, tensor: Any) -> bool | int | float:
        """A value read out of routing (an expert's index to select its weights, whether a
        count is zero, a count to split by): its likeliest under uniform routing. An index
        selects one of equally shaped slices, so any index in range holds the same memory."""
        values: _Values = self.known[tensor]
        if values.seen:
            first: bool | int | float = values.observed.flat[0].item()  # the first sample's
            return first
        if values.draw and tensor.is_floating_point():
            return 0.5  # a draw read as a number: its median
        if tensor.dtype is torch.bool:
            return values.nonzero_share() >= 0.5
        if values.spread:
            return 0.0 if tensor.is_floating_point() else 0
        count = values.chance * values.trials
        if values.of:  # largest remainder: the first counts take the rounding's leftovers
            total = round(count * values.of)
            count = total // values.of + (values.index < total % values.of)
        return float(count) if tensor.is_floating_point() else round(count)

    def _values(self, func: Any, args: Any, kwargs: Any, out: Any) -> _Values | None:
        source: Any = args[0] if args and isinstance(args[0], torch.Tensor) else None
        if func in _INDICES or func in _ARG:
            dim = _dim(func, args, kwargs)
            return _Values(spread=source.numel() if dim is None else source.shape[dim])
        if func in _DRAWS:
            return _Values(draw=True)
        info: _Values | None = self.known.get(source) if source is not None else None
        if func in _WHOLE_REDUCTIONS and info is not None and info.seen:
            reduction = _WHOLE_REDUCTIONS[func]
            if info.whole or reduction != "sum":  # a sample's extreme: the batch's, as sampled
                number = getattr(info.observed, reduction)()
                sampled = not info.whole  # whole: the traced batch's own number (see _count)
                return _Values(observed=np.asarray(number), sampled=sampled, whole=info.whole)
        if func in _OBSERVED_COMPARE and info is not None and info.seen:
            try:  # a number NumPy cannot compare with (a symbol) leaves the size unknown
                held = getattr(info.observed, _OBSERVED_COMPARE[func])(args[1])
                return _Values(observed=np.asarray(held), sampled=True, whole=info.whole)
            except (TypeError, AttributeError):
                return None
        if func in _OBSERVED_LOGIC:
            return self._logic(func, args)
        if func in _BELOW and info is not None and info.draw and source.is_floating_point():
            chance = min(1.0, max(0.0, float(args[1])))  # LayerDrop: rand([]) < p skips
            return _Values(chance=chance if _BELOW[func] else 1.0 - chance, draw=True)
        if func is _aten.arange.default:  # one_hot compares indices with arange(classes)
            return _Values(spread=out.numel())
        if func in _SAME_VALUES:
            same: _Values | None = self.known.get(source)
            if same is not None and same.seen and same.whole and same.observed.shape != out.shape:
                return replace(same, whole=False)  # a part of them: not all it holds
            return same
        if func in _NONZERO_TEST and args[1] == 0 and source in self.known:
            counts = self.known[source]  # "count > 0"
            return _Values(chance=counts.nonzero_share(), draw=counts.draw, sampled=counts.sampled)
        if func is _aten.cumsum.default and info is not None and _is_share(info):
            trials = source.shape[int(args[1])] if source.dim() else 1
            return replace(info, trials=trials, running=True, index=0, of=0)
        if func in _BELOW and info is not None and info.running:
            # a running count within a capacity c: the places whose count has not passed c
            expected = max(info.chance * info.trials, 1e-9)
            within = min(1.0, float(args[1]) / expected)
            chance = within if _BELOW[func] else 1.0 - within
            return replace(info, chance=chance, trials=1, running=False)
        if func is _aten.mul.Tensor:
            # a mask kept where another holds (the expert's tokens within its capacity)
            first, second = (self._share(a) for a in args[:2])
            if first is not None and second is not None:
                draw, sampled = first.draw or second.draw, first.sampled or second.sampled
                return _Values(chance=first.chance * second.chance, draw=draw, sampled=sampled)
        if func in _COMPARE:
            # values spread evenly over D, compared with one value in range: equal 1 in D
            spread = max((self.known[a].spread for a in args[:2] if a in self.known), default=0)
            if not spread:
                return None
            return _Values(chance=1 / spread if _COMPARE[func] else 1 - 1 / spread)
        if func is _aten.histc.default and source in self.known and self.known[source].spread:
            bins = kwargs.get("bins", args[1] if len(args) > 1 else 100)
            return _Values(chance=1 / max(1, bins), trials=source.numel())  # tokens per expert
        if func in _SUM and source in self.known and not self.known[source].spread:
            mask = self.known[source]
            if mask.observed is not None and source.dtype is not torch.bool:
                return None  # a sum of the batch's own values: not a count of a mask
            trials = max(1, source.numel() // max(1, out.numel()))
            chance = mask.nonzero_share() if mask.seen else mask.chance
            return _Values(chance=chance, trials=trials, draw=mask.draw, sampled=mask.sampled)
        return None

    def _ctc_loss(self, log_probs: Any, targets: Any, _: Any, target_lengths: Any, *__: Any) -> Any:
        """The loss per sequence and the (batch, frames, 2 x longest target + 1) table of forward
        variables the kernel keeps for backward; the longest target from what the trace knows of
        the lengths (a sum of a mask of the labels: the first samples' share), else the padded
        targets' width, or every target at once when they come flattened (upper bounds)."""
        batch = log_probs.shape[1] if log_probs.dim() == 3 else 1
        if not isinstance(target_lengths, torch.Tensor):
            longest = max(target_lengths, default=0)
        elif target_lengths in self.known:
            self._count(self.known[target_lengths])
            longest = int(self._likeliest(target_lengths))
        else:
            longest = targets.shape[-1] if targets.dim() == 2 else targets.numel()
            self.estimated += 1
        options = {"dtype": log_probs.dtype, "device": log_probs.device}
        loss = torch.empty(batch, **options)
        return loss, torch.empty((batch, log_probs.shape[0], 2 * longest + 1), **options)

    def _share(self, tensor: Any) -> _Values | None:
        """What is known of ``tensor`` if it is a mask held at a share (``_is_share``)."""
        if not isinstance(tensor, torch.Tensor) or tensor not in self.known:
            return None
        values: _Values = self.known[tensor]
        return values if _is_share(values) else None

    def _logic(self, func: Any, args: Any) -> _Values | None:
        """A logical combination of masks whose observed values are all known (see
        ``_OBSERVED_LOGIC``); shapes that do not broadcast leave it unknown."""
        masks = [a for a in args if isinstance(a, torch.Tensor)]
        known = [self.known.get(a) for a in masks]
        if not known or any(k is None or not k.seen for k in known):
            return None
        try:
            held = _OBSERVED_LOGIC[func](*(k.observed for k in known))
        except ValueError:
            return None
        return _Values(observed=np.asarray(held), sampled=True, whole=all(k.whole for k in known))


def _is_share(values: _Values) -> bool:
    """Whether ``values`` is a mask held at a share, one success of one draw (a one-hot
    routing, or a comparison of one), not indices, counts or the batch's own values."""
    return not (values.spread or values.seen or values.running) and values.trials == 1


class _Known:
    """What ``UniformRouting`` knows of tensors' values: its notes, and for a fake tensor with
    a shadow (``fake_shadows``) the shadow's values, read each time they are asked for, so that
    a write the shadow could not follow leaves nothing stale (the note keeps what else is known:
    an ``arange``'s spread)."""

    def __init__(self, shadows: Shadows) -> None:
        from torch.utils.weak import WeakIdKeyDictionary

        self.notes: Any = WeakIdKeyDictionary()
        self.shadows = shadows

    def __contains__(self, tensor: Any) -> bool:
        return self.get(tensor) is not None

    def __getitem__(self, tensor: Any) -> _Values:
        values: _Values | None = self.get(tensor)
        if values is None:
            raise KeyError(tensor)
        return values

    def __setitem__(self, tensor: Any, values: _Values) -> None:
        self.notes[tensor] = values

    def get(self, tensor: Any, default: Any = None) -> Any:
        if not isinstance(tensor, torch.Tensor):
            return default
        note: _Values | None = self.notes.get(tensor)
        shadow = self.shadows.get(tensor) if isinstance(tensor, FakeTensor) else None
        if shadow is None:
            return default if note is None else note
        real, origin = shadow
        return _Values(
            note.spread if note is not None else 0,
            observed=Shadows.numpy(real),
            sampled=origin != "made",
            whole=origin != "sampled",
        )


def _sized_by_values(func: Any, args: Any) -> bool:
    """Whether ``func``'s output shape depends on its inputs' values (``nonzero``, a selection
    by a mask; not an index by integers, sized by the index's shape)."""
    if func is _aten.index.Tensor:
        return any(_is_mask(i) for i in args[1])
    return torch.Tag.dynamic_output_shape in func.tags


def _is_mask(index: Any) -> bool:
    return isinstance(index, torch.Tensor) and index.dtype is torch.bool


def _selected(values: Any, indices: Any, share: float = 1.0) -> Any:
    """``values[mask]`` as if the mask selected ``share`` of its elements; every element by
    default, at most what it holds (the gradient of what a masked assignment wrote, a transient
    the size of the assigned value)."""
    shape: list[int] = []
    dim = 0
    for index in indices:
        if _is_mask(index):
            shape.append(round(index.numel() * share))
            dim += index.dim()
        else:  # a full slice (None) or an integer index keeps its dimension's size here
            shape.append(values.shape[dim])
            dim += 1
    shape.extend(values.shape[dim:])
    return torch.empty(shape, dtype=values.dtype, device=values.device)


def _sparse_entries(func: Any, args: Any) -> int:
    """The entries a sparse output of ``func`` holds: its sparse inputs' (see the module)."""
    if func in _EMBEDDING_BACKWARD:
        return int(args[1].numel())  # one entry per index looked up, as the real kernel makes
    counts = [a._nnz() for a in args if isinstance(a, torch.Tensor) and a.is_sparse]
    return sum(counts) if func in _SPARSE_SUMS else max(counts, default=0)


def _with_entries(out: Any, entries: int) -> Any:
    """``out``, a sparse COO tensor the fake kernel left empty, with ``entries`` entries."""
    if not entries:
        return out
    dims = out.sparse_dim()
    indices = torch.empty((dims, entries), dtype=torch.long, device=out.device)
    values = torch.empty((entries, *out.shape[dims:]), dtype=out.dtype, device=out.device)
    return _aten._sparse_coo_tensor_with_dims_and_tensors(
        dims, out.dense_dim(), list(out.shape), indices, values,
        dtype=out.dtype, layout=torch.sparse_coo, device=out.device, is_coalesced=False,
    )  # fmt: skip


def _grouped_mm_output(
    mat_a: Any, mat_b: Any, offs: Any = None, bias: Any = None, out_dtype: Any = None
) -> Any:
    """``torch._grouped_mm``'s output, shaped as its kernel shapes it: experts' weights stacked
    (E, K, N) times tokens grouped by expert (S, K) gives (S, N) (the forward); in backward
    (S, K)^T times (S, N) grouped gives (E, K, N), and (S, N) times (E, N, K)^T gives (S, K)."""
    if mat_a.dim() == 2 and mat_b.dim() == 2:
        shape = [offs.shape[0], mat_a.shape[0], mat_b.shape[1]]
    elif mat_a.dim() == 2:
        shape = [mat_a.shape[0], mat_b.shape[-1]]
    elif mat_b.dim() == 2:
        shape = [mat_a.shape[1], mat_b.shape[1]]
    else:
        shape = [mat_a.shape[0], mat_a.shape[1], mat_b.shape[-1]]
    return torch.empty(shape, dtype=out_dtype or mat_a.dtype, device=mat_a.device)


def _dim(func: Any, args: Any, kwargs: Any) -> int | None:
    if func is _aten.topk.default:
        return int(kwargs.get("dim", args[2] if len(args) > 2 else -1))
    if func is _aten.sort.default:
        return int(kwargs.get("dim", args[1] if len(args) > 1 else -1))
    if func is _aten.sort.stable:
        return int(kwargs.get("dim", -1))
    dim = kwargs.get("dim", args[1] if len(args) > 1 else None)
    return None if dim is None else int(dim)


@contextlib.contextmanager
def unchecked_distributions() -> Iterator[None]:
    """``torch.distributions`` without their argument checks, which the trace cannot make: a
    distribution checks its parameters as it is made (``Normal(mu, sigma)``: sigma positive) and
    each value it scores against its support (a flow's base density, ``log_prob(x)``), and
    raises unless every element holds, a branch on values fake tensors lack (a VAE's posterior
    and a normalizing flow's density stopped the trace). A real step checks, and fails where a
    check does not hold (its trial says so). ``Distribution._validate_args``, the default, is
    private: read to put it back, pinned by a test."""
    from torch.distributions import Distribution

    before = getattr(Distribution, "_validate_args", __debug__)
    Distribution.set_default_validate_args(False)
    try:
        yield
    finally:
        Distribution.set_default_validate_args(before)


class FormattedScalars(TorchFunctionMode):
    """A 0-dim tensor formatted into a string reads its value, as a real tensor's ``format``
    does and a fake one's did not (its repr instead): Switch Transformers names an expert
    ``self[f"expert_{expert_idx[0]}"]``, which ``UniformRouting`` answers as any index read."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is torch.Tensor.__format__ and args[0].dim() == 0:
            return format(args[0].item(), *args[1:])
        return func(*args, **(kwargs or {}))
