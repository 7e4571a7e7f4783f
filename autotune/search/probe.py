"""What works on this machine: remove the choices that cannot, and say why.

Static facts (device count, CUDA-only features, a C++ compiler for Inductor on CPU) are read
directly. Features that may break at run time on this backend (comm hooks, PowerSGD on gloo,
``torch.compile``) are tried once in a tiny real trial; those outcomes are cached per platform
fingerprint under ``$XDG_CACHE_HOME/autotune``.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.config import TrainConfig, make_config
from autotune.records import Exclusion, Value
from autotune.result import Platform
from autotune.runner.launch import run_trial
from autotune.runner.request import TrialOptions
from autotune.runner.workload import WorkloadSpec
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


def idle_reason(idle: int, blocks: str) -> str:
    """Why checkpointing that reaches the ``idle`` blocks (``idle_blocks``) of the model's
    ``blocks`` (``blocks_phrase``) is left out, by the probe and by ``plan``."""
    return (
        f"{idle} of the model's {blocks} keep nothing for backward (frozen, with no gradient "
        "flowing through them): checkpointing them saves nothing"
    )
