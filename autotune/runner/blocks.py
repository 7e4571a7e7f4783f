"""A model's repeated blocks, found on any model: the units activation checkpointing
recomputes and FSDP shards.

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
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn as nn

from autotune.runner.compile_state import wrapped_module

_CONTAINERS = (nn.ModuleList, nn.Sequential, nn.ModuleDict)
MINOR_SHARE = 0.05
"""A stacked kind whose instances hold under this share of the parameters the heaviest stacked
kind's hold is a part of the layers, not a stack of its own."""
LISTS = (nn.ModuleList, nn.ModuleDict)
"""Containers without a forward: never a block, whose forward checkpointing or FSDP would
wrap (a patched forward nobody calls; "fully_shard does not support containers that do not
implement forward")."""


def find_repeated_blocks(model: nn.Module) -> list[nn.Module]:
    """The model's repeated blocks in forward (registration) order, or [] if it has none. A
    TorchScript module is no block, nor is what it holds: its forward runs in TorchScript's
    interpreter, which neither checkpointing's patched forward nor FSDP's hooks reach."""
    return usable_blocks(model, found_blocks(model)[0])


def usable_blocks(model: nn.Module, blocks: list[nn.Module]) -> list[nn.Module]:
    """``blocks`` without lists (no forward to wrap) and TorchScript modules or their parts."""
    scripted = {id(m) for s in model.modules() if is_scripted(s) for m in s.modules()}
    return [b for b in blocks if id(b) not in scripted and not isinstance(b, LISTS)]


def may_loop(model: nn.Module) -> bool:
    """Whether the model's checkpointing units depend on how often its forward calls its
    modules (``checkpoint_units``): it has no stack of layers, nor blocks it declares, and a
    module with children that a forward could call again."""
    if found_blocks(model)[1]:
        return False
    parents = [m for m in model.modules() if m is not model and any(m.children())]
    return bool(usable_blocks(model, parents))


def is_scripted(module: nn.Module) -> bool:
    """Whether ``module`` is a TorchScript module (``torch.jit.script``'s)."""
    return isinstance(module, torch.jit.ScriptModule)


def found_blocks(model: nn.Module) -> tuple[list[nn.Module], bool]:
    """(blocks, whether they are declared or stacked rather than the fallback's)."""
    named = _declared_blocks(model)
    if named:
        return named, True
    candidates = [
        m
        for m in model.modules()
        if m is not model and not isinstance(m, LISTS) and any(True for _ in m.children())
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
        if isinstance(child, LISTS):
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
    ``fsdp_transformer_layer_cls_to_wrap`` takes them); "" for none. A block the model compiled
    itself (``torch.compile(block)``: an ``OptimizedModule``) is named by the module it wraps,
    which it holds as ``_orig_mod`` and which those wrap policies find."""
    return ",".join(dict.fromkeys(type(wrapped_module(b) or b).__name__ for b in blocks))
