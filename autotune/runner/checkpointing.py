"""Activation checkpointing on any model: find its repeated blocks, recompute some of them.

The repeated blocks are the layers of the model's stacks: two or more modules of one kind side by
side in one ``nn.ModuleList``/``nn.Sequential`` (a kind is a class, or for a plain
``nn.Sequential`` the classes it holds in order), every stack's kind, so an encoder's layers and a
decoder's are both found (torch's ``nn.Transformer``: two classes). Left out are a kind whose every
instance lies inside a layer of another stack (a mixture of experts' experts, eight to a layer; a
block's own sub-modules), unless a ``Sequential`` runs it in turn (the blocks of timm's stage
classes), and a stage that holds layers (ResNet's ``nn.Sequential`` of blocks). A unit (at most
one weight matrix, with its norm and activation: torchvision's ``Conv2dNormActivation``, stacked
three to a MobileNet's inverted residual) is a part of the layers, not a layer, where the model
has other stacks; where units are its only stacks and lie inside repeated modules (GoogLeNet's
inception branches), those modules are found by the fallback below. A
layer held as a ``ModuleList`` of its parts (x-transformers' ``[norm, attention, residual]``) has
no forward to wrap: its parts stand side by side with the other layers', and a kind holding under
``MINOR_SHARE`` of the heaviest stacked kind's parameters (those norms) is a part, not a layer (a
small stack of its own, a vision tower beside a language model, still is). A
model with no stack falls back to the instances of the most common kind of module with children
that occurs at least twice, ties broken by total parameters, a kind found only inside instances of
another repeated kind not counting. A Hugging Face model names its blocks itself
(``_no_split_modules``, what its own sharding keeps whole): those, where the model has them. This
finds GPT-2's ``GPT2Block`` in a ``ModuleList``, ResNet's ``BasicBlock`` across its stages,
``nn.TransformerEncoderLayer`` and a mixture of experts' decoder layer, without the model being
``nn.Sequential``.

A model with no stack (nor declared blocks) may apply one layer again and again, held once:
ALBERT's shared layer group, a Perceiver's latent tower, a looped transformer. Its units are then
that layer's calls (``looped_modules``), counted by a forward of two samples in eval mode
(``count_calls``: on a rank, on the meta device before any trial, in the trace on fake
tensors), and ``checkpoint_segments = k`` checkpoints its first k calls of each forward; the
fallback below applies only where no such layer is found.

``checkpoint_segments = k`` wraps the first k blocks, in forward order, each as one non-reentrant
checkpoint segment: their inner activations are dropped after forward and recomputed in backward.
The rest run normally. k must not exceed the number of blocks found. Blocks with a parameter that
trains come first, then the frozen ones from the last (``checkpoint_order``): a frozen block
below every trainable one (a fine-tune's frozen lower layers, a frozen encoder run under
``no_grad``) keeps nothing for backward, so checkpointing it saves nothing, and a k that took it
first would change nothing at all; a frozen block above a trainable one passes gradients back
and keeps its activations like any other. (The search leaves out the k that would reach the
blocks that keep nothing: ``probe.idle_blocks``.)

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
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

from autotune.errors import ConfigError

_CONTAINERS = (nn.ModuleList, nn.Sequential, nn.ModuleDict)
MINOR_SHARE = 0.05
"""A stacked kind whose instances hold under this share of the parameters the heaviest stacked
kind's hold is a part of the layers, not a stack of its own."""
_LISTS = (nn.ModuleList, nn.ModuleDict)
"""Containers without a forward: never a block, whose forward checkpointing or FSDP would
wrap (a patched forward nobody calls; "fully_shard does not support containers that do not
implement forward")."""


def find_repeated_blocks(model: nn.Module) -> list[nn.Module]:
    """The model's repeated blocks in forward (registration) order, or [] if it has none. A
    TorchScript module is no block, nor is what it holds: its forward runs in TorchScript's
    interpreter, which neither checkpointing's patched forward nor FSDP's hooks reach."""
    return _usable(model, _found_blocks(model)[0])


def _usable(model: nn.Module, blocks: list[nn.Module]) -> list[nn.Module]:
    """``blocks`` without lists (no forward to wrap) and TorchScript modules or their parts."""
    scripted = {id(m) for s in model.modules() if is_scripted(s) for m in s.modules()}
    return [b for b in blocks if id(b) not in scripted and not isinstance(b, _LISTS)]


def may_loop(model: nn.Module) -> bool:
    """Whether the model's checkpointing units depend on how often its forward calls its
    modules (``checkpoint_units``): it has no stack of layers, nor blocks it declares, and a
    module with children that a forward could call again."""
    if _found_blocks(model)[1]:
        return False
    parents = [m for m in model.modules() if m is not model and any(m.children())]
    return bool(_usable(model, parents))


def is_scripted(module: nn.Module) -> bool:
    """Whether ``module`` is a TorchScript module (``torch.jit.script``'s)."""
    return isinstance(module, torch.jit.ScriptModule)


def _found_blocks(model: nn.Module) -> tuple[list[nn.Module], bool]:
    """(blocks, whether they are declared or stacked rather than the fallback's)."""
    named = _declared_blocks(model)
    if named:
        return named, True
    candidates = [
        m
        for m in model.modules()
        if m is not model
        and not isinstance(m, (nn.ModuleList, nn.ModuleDict))
        and any(True for _ in m.children())
    ]
    counts = Counter(_kind(m) for m in candidates)
    stacks = _stacked_kinds(model, counts)
    if stacks:
        return _instances(model, lambda module: _kind(module) in stacks), True
    repeated = [kind for kind, n in counts.items() if n >= 2]
    nested = _nested_kinds(candidates, counts)
    repeated = [kind for kind in repeated if kind not in nested] or repeated
    units = _unit_kinds(candidates)
    repeated = [kind for kind in repeated if kind not in units] or repeated
    if not repeated:
        return [], False

    def weight(kind: object) -> tuple[int, int]:
        params = sum(p.numel() for m in candidates if _kind(m) == kind for p in m.parameters())
        return counts[kind], params

    block_kind = max(repeated, key=weight)
    return _instances(model, lambda module: _kind(module) == block_kind), False


def _stacked_kinds(model: nn.Module, counts: Counter[object]) -> set[object]:
    """The kinds of the model's stacks of layers: two or more of one kind side by side in one
    ``nn.ModuleList``/``nn.Sequential`` (an encoder's layers and a decoder's are two stacks),
    except a kind every instance of which lies inside a stacked layer of another kind (a
    mixture of experts' experts, a block's own sub-modules) and a stage that holds layers of
    a stack (ResNet's ``nn.Sequential`` of blocks); empty when the model has no stack."""
    stacked: set[object] = set()
    parts: set[object] = set()  # kinds stacked as the parts of layers held as lists
    members: set[int] = set()  # the modules found side by side with others of their kind
    in_sequence: set[object] = set()  # kinds stacked in a Sequential, which runs them in turn
    for parent in model.modules():
        if isinstance(parent, _CONTAINERS):
            found = [(c, nested) for c, nested in _parts(parent) if any(c.children())]
            siblings = Counter(_kind(c) for c, _ in found)
            stacked.update(kind for kind, n in siblings.items() if n >= 2)
            members.update(id(c) for c, _ in found if siblings[_kind(c)] >= 2)
            if isinstance(parent, nn.Sequential):
                in_sequence.update(_kind(c) for c, _ in found if siblings[_kind(c)] >= 2)
            parts.update(_kind(c) for c, nested in found if nested and siblings[_kind(c)] >= 2)
    layers = [m for m in model.modules() if m is not model and _kind(m) in stacked]
    # a layer's convolution-norm-activation units (MobileNet's inverted residual holds three in
    # a Sequential) are its parts: no stack of their own, nor do they make it a stage
    units = _unit_kinds(layers)
    if stacked - units:
        stacked -= units
    elif _enclosed(model, members, counts, units):
        return set()  # units stacked only inside repeated modules (GoogLeNet's): those are found
    # a kind found only inside another's layers is a part of them (a mixture's experts, held in
    # a ModuleList), unless a Sequential runs it in turn: the layers of a stage class (timm's
    # ConvNeXtStage holds its blocks in one), which are the layers, not the stages
    inner = _nested_kinds([m for m in layers if not isinstance(m, _CONTAINERS)], counts)
    stacked -= inner - in_sequence
    # a stage: it holds a stack's layers, or a layer of a stacked class (a Sequential is of a
    # stacked kind by the classes it holds, so one outside a stack makes no stage)
    outer = {
        _kind(m)
        for m in layers
        if _kind(m) in stacked
        and any(
            i is not m
            and _kind(i) in stacked
            and (id(i) in members or not isinstance(i, _CONTAINERS))
            for i in m.modules()
        )
    }
    stacked -= outer
    weights = Counter[object]()
    for m in layers:
        if _kind(m) in stacked:
            weights[_kind(m)] += sum(p.numel() for p in m.parameters())
    heaviest = max(weights.values(), default=0)
    # a layer's small parts beside its layers (x-transformers' norms, held in one list with
    # its attention and feed-forward) are no layers; a small stack of its own (a vision tower
    # beside a language model's decoder) still is
    return {k for k in stacked if k not in parts or weights[k] >= MINOR_SHARE * heaviest}


def _enclosed(
    model: nn.Module, members: set[int], counts: Counter[object], units: set[object]
) -> bool:
    """Whether every module of ``members`` lies inside a module of a repeated kind (``counts``)
    that is neither a container nor one of ``units``."""
    inside: set[int] = set()
    for module in model.modules():
        kind = _kind(module)
        if module is model or isinstance(module, _CONTAINERS) or kind in units:
            continue
        if counts[kind] >= 2:
            inside.update(id(m) for m in module.modules() if m is not module)
    return members <= inside


def _unit_kinds(modules: list[nn.Module]) -> set[object]:
    """The kinds every instance of which among ``modules`` is a unit: at most one weight matrix
    (a convolution's, a linear layer's) with what normalises and activates it (torchvision's
    ``Conv2dNormActivation``, timm's ``ConvNormAct`` and ``BatchNormAct2d``, GoogLeNet's
    ``BasicConv2d``, ConvNeXt's downsampling ``[norm, conv]``), the parts a layer is built of,
    never a layer itself where a model has layers."""
    verdicts: dict[object, bool] = {}
    for module in modules:
        kind = _kind(module)
        verdicts[kind] = verdicts.get(kind, True) and sum(map(_has_matrix, module.modules())) <= 1
    return {kind for kind, unit in verdicts.items() if unit}


def _has_matrix(module: nn.Module) -> bool:
    """Whether ``module`` itself holds a weight matrix (a norm's or an activation's vectors are
    none; a lazy layer's weight, shapeless until its first forward, counts)."""
    return any(
        isinstance(p, nn.parameter.UninitializedParameter) or p.dim() >= 2
        for p in module.parameters(recurse=False)
    )


def _parts(parent: nn.Module, nested: bool = False) -> Iterator[tuple[nn.Module, bool]]:
    """(child, whether it came from a list inside ``parent``) of ``parent``'s children, a
    ``ModuleList``'s or ``ModuleDict``'s own in its place: a layer held as a list of its parts
    (x-transformers' ``[norms, attention, residual]``) has no forward of its own, so its parts
    are the layers, side by side with the other layers'."""
    for child in parent.children():
        if isinstance(child, _LISTS):
            yield from _parts(child, True)
        else:
            yield child, nested


def _declared_blocks(model: nn.Module) -> list[nn.Module]:
    """The instances of the classes a Hugging Face model declares unsplittable, those repeated
    (BERT declares its embeddings too: one instance, not a block)."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    declared = _instances(model, lambda module: type(module).__name__ in names)
    counts = Counter(type(module) for module in declared)
    return [module for module in declared if counts[type(module)] >= 2]


def _instances(model: nn.Module, is_block: Any) -> list[nn.Module]:
    """The outermost modules that ``is_block``, in registration order."""
    blocks: list[nn.Module] = []
    inside: set[int] = set()
    for module in model.modules():
        if id(module) in inside or module is model:
            continue
        if is_block(module):
            blocks.append(module)
            inside.update(id(m) for m in module.modules())
    return blocks


def _nested_kinds(candidates: list[nn.Module], counts: Counter[object]) -> set[object]:
    """Repeated kinds (``counts``: instances per kind among ``candidates``) whose every instance
    lies inside an instance of another repeated kind that is a module of its own (not a plain
    ``nn.Sequential`` stage)."""
    enclosed: dict[object, set[int]] = {}
    for outer in candidates:
        kind = _kind(outer)
        if counts[kind] < 2 or isinstance(outer, _CONTAINERS):
            continue
        for inner in outer.modules():
            inner_kind = _kind(inner)
            if inner is not outer and inner_kind != kind:
                enclosed.setdefault(inner_kind, set()).add(id(inner))
    return {k for k, ids in enclosed.items() if counts[k] >= 2 and len(ids) == counts[k]}


def _kind(module: nn.Module) -> object:
    """A block's class; for a plain nn.Sequential, also the classes of what it holds."""
    if isinstance(module, _CONTAINERS):
        return (type(module), tuple(type(c) for c in module.children()))
    return type(module)


def block_classes(blocks: list[nn.Module]) -> str:
    """The class names of ``blocks``, each once, in order and comma-separated (as Accelerate's
    ``fsdp_transformer_layer_cls_to_wrap`` takes them); "" for none."""
    return ",".join(dict.fromkeys(type(block).__name__ for block in blocks))


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
        if module is model or id(module) in inside or isinstance(module, _LISTS):
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
    blocks (the module docstring)."""
    blocks, structured = _found_blocks(model)
    if not structured and calls:
        loops = looped_modules(model, calls)
        if loops:
            return Units(loops=tuple(loops))
    return Units(blocks=tuple(_usable(model, blocks)))


def apply_checkpointing(
    model: nn.Module, segments: int, calls: Mapping[int, int] | None = None
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
    block, and checkpointed again inside its own."""
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
    if units.loops:
        chosen = _checkpoint_calls(model, units.loops, segments)
    else:
        chosen = checkpoint_order(list(units.blocks))[:segments]
        for block in chosen:
            block.forward = _checkpointed(block)
    _without_cache(model)
    return chosen


def _checkpoint_calls(
    model: nn.Module, loops: tuple[tuple[nn.Module, int], ...], segments: int
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
        module.forward = counted(module.forward, _checkpointed(module))
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


def _checkpointed(block: nn.Module) -> Callable[..., Any]:
    """``block``'s forward, run as one non-reentrant checkpoint segment that keeps its training
    state (``_same_buffers``). Set as an instance attribute, ``__call__`` (and with it every
    hook, FSDP's included) still runs."""
    forward = block.forward
    # The block's training state among its buffers: those its state_dict saves (running
    # statistics, a power iteration's vectors), not constants it derives (masks, rotary tables)
    saved = block.state_dict(keep_vars=True)
    state = [name for name, _ in block.named_buffers() if name in saved]

    def checkpointed_forward(*args: Any, **kwargs: Any) -> Any:
        if torch.compiler.is_compiling():  # the compiler's own recomputation (module docstring)
            return checkpoint(forward, *args, use_reentrant=False, **kwargs)
        if not state:
            return checkpoint(forward, *args, use_reentrant=False, **kwargs)
        contexts = partial(_same_buffers, block, state)
        return checkpoint(forward, *args, use_reentrant=False, context_fn=contexts, **kwargs)

    return checkpointed_forward


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
