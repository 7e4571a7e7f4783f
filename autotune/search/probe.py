"""What works on this machine: remove the choices that cannot, and say why.

Static facts (device count, CUDA-only features, a C++ compiler for Inductor on CPU) are read
directly. Features that may break at run time on this backend (comm hooks, PowerSGD on gloo,
``torch.compile``) are tried once in a tiny real trial; those outcomes are cached per platform
fingerprint under ``$XDG_CACHE_HOME/autotune``.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.config import TrainConfig, make_config
from autotune.errors import WorkloadError, error_line
from autotune.records import Exclusion, Value
from autotune.result import Platform
from autotune.runner.compile_state import was_compiled
from autotune.runner.instances import copy_with_tensors, names_an_instance
from autotune.runner.launch import run_trial
from autotune.runner.optimizer import accepted_implementations, chosen_optimizer
from autotune.runner.outcome import collate_hint
from autotune.runner.request import TrialOptions
from autotune.runner.workload import (
    WorkloadSpec,
    first_samples,
    load_collate,
    load_dataset,
    load_model,
    load_optimizer,
    model_optimizer,
    parameter_dtype,
)
from autotune.search.recipe import BatchNorm
from autotune.search.space import EVERY_BLOCK, SearchSpace

if TYPE_CHECKING:
    from autotune.search.refusals import Refusal

PROBE_MODEL = "workloads.mlp:mlp_tiny"


def _cache_path(platform: Platform) -> Path:
    root = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "autotune"
    return root / f"probe-{platform.fingerprint()}.json"


COMPILE_CHECK = "compile"
"""The cache key of the torch.compile check (comm hooks are keyed by their name)."""
CUDA_GRAPH_MODES = ("reduce-overhead",)
"""Compile modes whose point is CUDA graphs: on CPU they only repeat the default mode."""


def _check_config(check: str, device: str) -> TrainConfig:
    base: dict[str, Any] = {"global_batch_size": 8, "device": device}
    if check == COMPILE_CHECK:  # one rank is enough to learn whether Inductor works here
        return make_config({**base, "compile": "default"})
    return make_config({**base, "parallel": "ddp", "world_size": 2, "comm_hook": check})


def _runtime_checks(platform: Platform, checks: list[str]) -> dict[str, str]:
    """Try each check (a comm hook in a tiny 2-rank DDP trial, or compilation in a one-rank
    trial); return {check: failure reason}."""
    path = _cache_path(platform)
    try:
        cached: dict[str, str | None] = json.loads(path.read_text())
    except (OSError, ValueError):
        cached = {}
    for check in checks:
        if check in cached:
            continue
        # a check that it works, not a measurement: a few steps, never the adaptive window;
        # compiling from a cold cache takes tens of seconds on a small CPU
        timeout = 300 if check == COMPILE_CHECK else 30
        options = TrialOptions(
            warmup_steps=1, measured_steps=3, target_interval=0, timeout_s=timeout
        )
        config = _check_config(check, platform.device_type)
        result = run_trial(config, WorkloadSpec(model=PROBE_MODEL), options)
        if not result.ok and result.status != "timed_out":
            # once more before a failure is cached for good: a transient gloo reset excluded
            # the fp16 hook on a machine where it works (a hang is not retried: it costs the
            # whole timeout again)
            result = run_trial(config, WorkloadSpec(model=PROBE_MODEL), options)
        cached[check] = None if result.ok else f"{result.status}: {result.message}"[:300]
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(cached, indent=2))
    except OSError:
        pass  # an unwritable cache only costs the probe again next time
    return {check: reason for check, reason in cached.items() if reason and check in checks}


def _cxx_compiler() -> str | None:
    """The C++ compiler Inductor's CPU backend would use (``$CXX``, else g++ or clang++)."""
    for name in (os.environ.get("CXX"), "g++", "clang++", "c++"):
        if name and shutil.which(name):
            return name
    return None


def _compile_exclusions(
    space: SearchSpace, platform: Platform, run_checks: bool
) -> list[tuple[Value, str]]:
    """The compile modes that cannot work here, each with why."""
    modes = (
        [m for m in space.params["compile"].choices if m != "off"]
        if "compile" in space.params
        else []
    )
    out: list[tuple[Value, str]] = []
    if platform.device_type != "cuda":
        graphs = "its CUDA graphs need CUDA; on CPU it is the default mode"
        out += [(m, graphs) for m in modes if m in CUDA_GRAPH_MODES]
        if _cxx_compiler() is None:
            missing = "Inductor's CPU backend needs a C++ compiler (g++, clang++ or $CXX)"
            return out + [(m, missing) for m in modes if m not in CUDA_GRAPH_MODES]
    excluded = {value for value, _ in out}
    left = [m for m in modes if m not in excluded]
    if run_checks and left:
        failure = _runtime_checks(platform, [COMPILE_CHECK]).get(COMPILE_CHECK)
        if failure:
            out += [(m, f"torch.compile failed a probe trial: {failure}") for m in left]
    return out


def every_block(
    space: SearchSpace, repeated_blocks: int | None, block_class: str = ""
) -> tuple[SearchSpace, str | None]:
    """``space`` with its ``all`` choice of ``checkpoint_segments`` (``EVERY_BLOCK``) made the
    model's number of repeated blocks, and the line that says so where that number is a choice
    the space did not list (the default's 0..12 stop short of a 32-layer model: checkpointing
    every block, what a model that barely fits needs most, was never tried); ``all`` dropped
    where it adds nothing (it is listed, or there are no blocks to count)."""
    param = space.params.get("checkpoint_segments")
    if param is None or EVERY_BLOCK not in param.choices:
        return space, None
    new = repeated_blocks if repeated_blocks and repeated_blocks not in param.choices else None
    choices = tuple(new if c == EVERY_BLOCK else c for c in param.choices)
    space = space.replace_choices("checkpoint_segments", tuple(c for c in choices if c is not None))
    if new is None:
        return space, None
    line = (
        f"checkpoint_segments={new}: every one of the model's "
        f"{blocks_phrase(new, block_class)} (the space's '{EVERY_BLOCK}')"
    )
    return space, line


def is_looped(names: str) -> bool:
    """Whether ``repeated_blocks``'s names are a looped layer's (``checkpointing.LOOPED``)."""
    return names.startswith("looped ")


def blocks_phrase(count: int, name: str = "") -> str:
    """The model's repeated blocks in a reason: "4 repeated Block blocks", "6 repeated
    EncoderLayer, DecoderLayer blocks", "6 calls of its looped AlbertLayerGroup", "no repeated
    blocks" (``plan`` and the search's exclusions say it alike)."""
    names = name.replace(",", ", ")
    if is_looped(names):  # "6 calls of its looped AlbertLayerGroup"
        return f"{count} calls of its {names}"
    return (
        f"{count} repeated {names + ' ' if names else ''}blocks" if count else "no repeated blocks"
    )


def restrict_space(
    space: SearchSpace,
    platform: Platform,
    devices: int,
    repeated_blocks: int | None,
    run_checks: bool = True,
    image_batches: bool | None = None,
    optimizer_flags: tuple[str, tuple[str, ...]] | None = None,
    block_class: str = "",
    refusals: tuple[Refusal, ...] = (),
    idle_blocks: int = 0,
) -> tuple[SearchSpace, list[Exclusion]]:
    """Drop the choices that cannot work here; return the space and what was dropped (the
    ``all`` of checkpointing made the model's number of blocks first: ``every_block``)."""
    space, _ = every_block(space, repeated_blocks, block_class)
    cuda = platform.device_type == "cuda"
    dropped: list[Exclusion] = []

    def drop(knob: str, value: Value, reason: str) -> None:
        nonlocal space
        if knob in space.params and value in space.params[knob].choices:
            space = space.without(knob, value)
            dropped.append(Exclusion(knob=knob, value=value, reason=reason))

    params = space.params
    for size in params["world_size"].choices if "world_size" in params else ():
        if isinstance(size, int) and size > devices:
            drop("world_size", size, f"only {devices} device(s) considered")
    if "world_size" not in space.params:  # every trial on one device, whatever is here
        why = (
            f"the space has no world_size knob, so every trial runs on one device; add "
            f"`world_size: [{devices}]` to it"
            if devices > 1
            else f"needs more than one device; {devices} considered"
        )
        for mode in ("dp", "ddp", "fsdp"):
            drop("parallel", mode, why)
    if not cuda:
        drop("parallel", "dp", "DataParallel needs CUDA GPUs")
        drop("comm_hook", "bf16", "the bf16 compression hook needs CUDA and NCCL")
        drop("pin_memory", True, "pinned memory only helps copies to a CUDA device")
        drop("matmul_precision", "high", "TF32 matmuls are CUDA's: on a CPU it changes nothing")
        drop("expandable_segments", True, "a setting of the CUDA caching allocator: none on CPU")
        drop("fsdp_cpu_offload", True, "on a CPU the shards are in host memory already")
    elif devices < 2:
        drop("parallel", "dp", "DataParallel needs at least 2 GPUs")
    if cuda:
        import torch

        if not torch.cuda.is_bf16_supported():
            drop("amp", "bf16", f"{platform.device_name} does not support bf16")
    if repeated_blocks is not None and "checkpoint_segments" in params:
        for segments in params["checkpoint_segments"].choices:
            if isinstance(segments, int) and segments > repeated_blocks:
                drop(
                    "checkpoint_segments",
                    segments,
                    f"the model has {blocks_phrase(repeated_blocks, block_class)}",
                )
            elif isinstance(segments, int) and segments > repeated_blocks - idle_blocks:
                drop(
                    "checkpoint_segments",
                    segments,
                    idle_reason(idle_blocks, blocks_phrase(repeated_blocks, block_class)),
                )
    if optimizer_flags is not None:
        name, accepted = optimizer_flags
        for flag in ("foreach", "fused"):
            if flag not in accepted:
                drop("optimizer_impl", flag, f"the optimizer {name} takes no {flag} flag")
    for refusal in refusals:
        if refusal.holds(platform.device_type):
            drop(refusal.knob, refusal.value, refusal.reason)
    if image_batches is False:
        drop("channels_last", True, "the model is not fed 4-D image batches (N, C, H, W)")
    cores = platform.cpu_count
    for workers in params["num_workers"].choices if "num_workers" in params else ():
        if isinstance(workers, int) and workers > cores:
            drop("num_workers", workers, f"this machine has {cores} CPU cores")
    hooks: list[str] = [
        h
        for h in ("fp16", "bf16", "powersgd")
        if "comm_hook" in space.params and h in space.params["comm_hook"].choices
    ]
    if run_checks and hooks and devices >= 2 and "ddp" in space.params["parallel"].choices:
        for hook, reason in _runtime_checks(platform, hooks).items():
            drop("comm_hook", hook, f"failed a probe trial on {platform.backend}: {reason}")
    for value, why in _compile_exclusions(space, platform, run_checks):
        drop("compile", value, why)
    return space, dropped


@functools.cache
def meta_model(model_reference: str) -> tuple[Any, Any] | None:
    """(module, model) built once on the meta device (no memory, no initialisation) for the
    probe's questions about the model; None if it cannot be built there."""
    import torch

    try:
        with torch.device("meta"):
            module, model = load_model(model_reference)
        if names_an_instance(model_reference):  # built before: a copy of it on meta
            model = copy_with_tensors(model, lambda t: t.to("meta"), model_reference)
        return module, model
    except Exception:  # a model that cannot be built on meta: trials will report it
        return None


def forget() -> None:
    """Drop what the probe keeps of the workloads it was asked about (the model built on the
    meta device, the dataset and its first samples: a caller's objects, where given as such)."""
    for cached in (meta_model, _dataset, read_samples):
        cached.cache_clear()


def configures_optimizer(model_reference: str) -> bool:
    """Whether the model configures its own optimizer (a LightningModule, named as its class or
    built by a factory); False where it cannot be built on the meta device."""
    built = meta_model(model_reference)
    return built is not None and model_optimizer(built[1]) is not None


def own_checkpointing(model_reference: str) -> str | None:
    """The search's line where the model, as built, checkpoints itself (Hugging Face's
    ``gradient_checkpointing_enable()`` in its factory): trials turn that off
    (``checkpointing.apply_checkpointing``); None where it does not, or cannot be built."""
    from autotune.runner import checkpointing  # imports torch

    built = meta_model(model_reference)
    if built is None or not checkpointing.checkpoints_itself(built[1]):
        return None
    return (
        "the model turns on its own (gradient_checkpointing): every trial turns it off, so "
        "that checkpoint_segments decides (0: off); the recommended value is the one to keep"
    )


def refuses_own_checkpointing(model_reference: str) -> str | None:
    """``checkpointing.refuses_own_checkpointing`` of the model built on the meta device (the
    class whose Trainer flag would raise); None where it does not refuse, or cannot be built."""
    from autotune.runner import checkpointing  # imports torch

    built = meta_model(model_reference)
    return None if built is None else checkpointing.refuses_own_checkpointing(built[1])


def own_compile(model_reference: str) -> str | None:
    """The search's line where the model's factory returns it compiled (``torch.compile``):
    trials take the module it wraps (``workload.load_model``); None where it is not compiled,
    or cannot be built."""
    built = meta_model(model_reference)
    if built is None or not was_compiled(built[1]):
        return None
    return (
        "the model's factory compiles it (torch.compile): every trial takes the module it wraps, "
        "so that compile decides (off: eager); the recommended value is the one to keep"
    )


def idle_blocks(workload: WorkloadSpec) -> int:
    """How many of the model's repeated blocks keep nothing for backward: their output needs no
    gradient (frozen, below every parameter that trains: a linear probe's backbone, a fine-tune's
    frozen lower layers), so checkpointing them saves nothing. From a forward of the dataset's
    first two samples through the model built on the meta device; 0 where that cannot run."""
    import torch
    from torch.utils.data import default_collate

    from autotune.runner.training import map_tensors  # imports torch

    built = meta_model(workload.model)
    first = read_samples(workload, 2)
    if built is None or not first:
        return 0
    model = built[1]
    units = checkpoint_units(workload)
    if units is None or units.loops:  # a looped layer with a parameter that trains keeps
        return 0
    blocks = list(units.blocks)
    keeps: dict[int, bool] = {}

    def seen(block: Any, _inputs: Any, output: Any) -> None:
        kept: list[bool] = []
        map_tensors(output, lambda t: kept.append(t.requires_grad))
        keeps[id(block)] = keeps.get(id(block), False) or any(kept)

    handles = [block.register_forward_hook(seen) for block in blocks]
    try:
        collate = load_collate(workload, built[0])[0] or default_collate
        args, kwargs = meta_inputs(model, collate(list(first)))
        with torch.enable_grad():
            model(*args, **kwargs)
    except Exception:  # a model the meta device cannot run: nothing is left out
        return 0
    finally:
        for handle in handles:
            handle.remove()
    return sum(1 for block in blocks if id(block) in keeps and not keeps[id(block)])


def idle_reason(idle: int, blocks: str) -> str:
    """Why checkpointing that reaches the ``idle`` blocks (``idle_blocks``) of the model's
    ``blocks`` (``blocks_phrase``) is left out, by the probe and by ``plan``."""
    return (
        f"{idle} of the model's {blocks} keep nothing for backward (frozen, with no gradient "
        "flowing through them): checkpointing them saves nothing"
    )


def repeated_blocks(workload: WorkloadSpec) -> tuple[int, str] | None:
    """(number, class names) of the user's model's checkpointing units (``checkpoint_units``:
    the names comma-separated, an encoder's and a decoder's layers are two classes; a looped
    layer's calls are its class's after ``checkpointing.LOOPED``); None if the model cannot be
    built on the meta device."""
    units = checkpoint_units(workload)
    return None if units is None else (units.count, units.names)


def fsdp_block_classes(model_reference: str) -> str | None:
    """The class names of the blocks FSDP shards as units of their own (the model's repeated
    blocks, not a looped layer's calls: what Accelerate's ``fsdp_transformer_layer_cls_to_wrap``
    takes), comma-separated; None where there are none or the model cannot be built on the meta
    device."""
    from autotune.runner import blocks  # imports torch

    built = meta_model(model_reference)
    if built is None:
        return None
    return blocks.block_classes(blocks.find_repeated_blocks(built[1])) or None


def check_segments(workload: WorkloadSpec, segments: int) -> None:
    """``checkpointing.check_segments`` on the model built on the meta device, its units
    counted as a rank counts them (``checkpoint_units``): the one-line error a rank would raise,
    before any is launched; nothing where the model cannot be built there."""
    from autotune.runner import checkpointing  # imports torch

    built, units = meta_model(workload.model), checkpoint_units(workload)
    if built is not None and units is not None:
        checkpointing.check_segments(built[1], segments, units)


def checkpoint_units(workload: WorkloadSpec) -> Any:
    """The checkpointing units (``checkpointing.Units``) of the model built on the meta device,
    its calls counted by a forward of the dataset's first two samples there where the units
    depend on them (a model with no stack of layers: ``blocks.may_loop``), as a rank
    counts them; None if the model cannot be built on the meta device."""
    from torch.utils.data import default_collate

    from autotune.runner import blocks, checkpointing  # imports torch

    built = meta_model(workload.model)
    if built is None:
        return None
    model = built[1]
    first = read_samples(workload, 2) if blocks.may_loop(model) else None
    calls = None
    try:
        if first:
            collate = load_collate(workload, built[0])[0] or default_collate
            args, kwargs = meta_inputs(model, collate(list(first)))
            calls = checkpointing.count_calls(model, lambda: model(*args, **kwargs))
    except Exception:  # samples the meta device cannot take: the structure alone decides
        calls = None
    return checkpointing.checkpoint_units(model, calls)


def batch_norm(model_reference: str) -> BatchNorm | None:
    """How the model's batch norms compute their statistics in training: "synced" where every
    one is an ``nn.SyncBatchNorm``, else "local" (over each device's micro-batch); None for a
    model without them, or one that cannot be built on the meta device."""
    import torch.nn as nn

    from autotune.runner.training import BATCH_NORMS  # imports torch

    built = meta_model(model_reference)
    norms = [m for m in built[1].modules() if isinstance(m, BATCH_NORMS)] if built else []
    if not norms:
        return None
    return "synced" if all(isinstance(m, nn.SyncBatchNorm) for m in norms) else "local"


def meta_inputs(model: Any, batch: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """(positional, keyword) inputs of ``model``'s forward from ``batch``, its tensors on the
    meta device, split as a trial splits it."""
    from autotune.runner.training import forward_keywords, map_tensors, split_batch  # imports torch

    args, kwargs, _ = split_batch(
        map_tensors(batch, lambda t: t.to("meta")), forward_keywords(model)
    )
    return args, kwargs


def scalar_parameters(model_reference: str) -> list[str]:
    """The names of the model's 0-dim trainable parameters (CLIP's ``logit_scale``), from a
    build on the meta device; [] if it cannot be built there."""
    from autotune.runner import training  # imports torch

    built = meta_model(model_reference)
    return list(training.scalar_parameters(built[1])) if built is not None else []


BATCH_CHECKED = 4
"""How many of the dataset's first samples the probe reads (and batches, ``batch_error``)."""


@functools.cache
def _dataset(workload: WorkloadSpec) -> tuple[Any, str] | None:
    """(dataset, where it came from), built once beside the meta-device model; None when that
    cannot be done here (the trials will say)."""
    built = meta_model(workload.model)
    if built is None:
        return None
    try:
        return load_dataset(workload, *built)
    except Exception:  # the trials will say what is wrong with it
        return None


def data_source(workload: WorkloadSpec) -> str | None:
    """Where the trials' samples come from, in words (synthetic ones with their shape and
    range); None when that cannot be told here."""
    dataset = _dataset(workload)
    return dataset[1] if dataset else None


@functools.cache
def read_samples(workload: WorkloadSpec, count: int) -> tuple[Any, ...] | None:
    """The dataset's first ``count`` samples (fewer if it holds fewer); None when the dataset
    cannot be built or read here (the trials will say)."""
    dataset = _dataset(workload)
    if dataset is None:
        return None
    try:
        return tuple(first_samples(dataset[0], count))
    except Exception:  # the trials will say what is wrong with it
        return None


def parameters_dtype(model_reference: str) -> str | None:
    """The one floating dtype of the model's parameters (``workload.parameter_dtype``), from a
    build on the meta device; None where they differ, or it cannot be built there."""
    built = meta_model(model_reference)
    return parameter_dtype(built[1]) if built is not None else None


def feeds_images(workload: WorkloadSpec) -> bool | None:
    """Whether the model's samples hold an image (a 3-D floating tensor: a 4-D batch), from a
    build on the meta device and one sample; None when that cannot be told here."""
    import torch

    first = read_samples(workload, BATCH_CHECKED)
    if not first:
        return None
    sample = first[0]
    found = [sample] if isinstance(sample, torch.Tensor) else []
    if isinstance(sample, dict):
        found = [v for v in sample.values() if isinstance(v, torch.Tensor)]
    elif isinstance(sample, (list, tuple)):
        found = [v for v in sample if isinstance(v, torch.Tensor)]
    return any(t.dim() == 3 and t.is_floating_point() for t in found)


def batch_error(workload: WorkloadSpec) -> str | None:
    """Why the DataLoader cannot make a batch of the dataset's first ``BATCH_CHECKED`` samples
    with the workload's collate function (torch's ``default_collate`` stacks samples of one
    shape only), in one line; None when it can, or when that cannot be told here."""
    from torch.utils.data import default_collate

    first = read_samples(workload, BATCH_CHECKED)
    built = meta_model(workload.model)
    if not first or built is None:
        return None
    try:
        collate, _ = load_collate(workload, built[0])
        (collate or default_collate)(list(first))
    except Exception as error:
        return error_line(error)
    return None


def check_batches(workload: WorkloadSpec) -> None:
    """One line, before anything runs, when the DataLoader cannot batch the dataset's first
    samples (samples of different lengths without a collate function that pads them): every
    trial would fail in its first step, and a plan would predict batches that cannot be made."""
    unbatched = batch_error(workload)
    if unbatched is not None:
        hint = f"; {found}" if (found := collate_hint(unbatched)) else ""
        raise WorkloadError(
            f"the DataLoader cannot make a batch of the dataset's first samples: {unbatched}{hint}"
        )


def check_dataset_size(workload: WorkloadSpec, global_batch_size: int | None, source: str) -> None:
    """One line, before anything runs, where the dataset holds fewer samples than one global
    batch (``source``: where the batch came from): the loaders drop a last partial batch, so
    every trial without accumulation failed in its first step ("the DataLoader produced no
    batch"); a dataset without a length, or one that cannot be built here, is left to the
    trials."""
    dataset = _dataset(workload)
    try:
        size = len(dataset[0]) if dataset is not None else None
    except TypeError:  # an iterable dataset: no length to check
        return
    if size is None or global_batch_size is None or size >= global_batch_size:
        return
    given = batch_source_note(source)
    raise WorkloadError(
        f"the dataset holds {size} samples, fewer than one global batch of {global_batch_size}"
        f"{given}: no step could be made of an epoch; use --global-batch-size {size} or less, "
        "or a larger dataset"
    )


def batch_source_note(source: str) -> str:
    """Where a global batch not given by flag came from, for an error about it (" (default
    32)", " (mymodel autotune_global_batch_size)"); "" for one given."""
    return "" if source == "given" else f" ({source.split(':')[0]})"


def _meta_optimizer(workload: WorkloadSpec) -> Any:
    """The workload's optimizer built over the meta-device model; None when that cannot be
    done here (the trials will say). Raises the ``WorkloadError`` of one no trial can train
    with (a factory that returns no optimizer, or one whose step needs a closure)."""
    model = meta_model(workload.model)
    if model is None:
        return None
    try:
        factory = load_optimizer(workload, model[0])[0]
        return chosen_optimizer(factory, model[1])(model[1].parameters())
    except WorkloadError:
        raise
    except Exception:  # the trials will say what is wrong with it
        return None


def check_optimizer(workload: WorkloadSpec) -> None:
    """One line, before any trial, where the workload's optimizer is one no trial can train
    with: every trial would fail applying the configuration."""
    _meta_optimizer(workload)


def optimizer_flags(workload: WorkloadSpec) -> tuple[str, tuple[str, ...]] | None:
    """(class name, implementation flags it takes) of the workload's optimizer, built over a
    meta-device model; None when that cannot be told here."""
    built = _meta_optimizer(workload)
    if built is None:
        return None
    return type(built).__name__, accepted_implementations(type(built))
