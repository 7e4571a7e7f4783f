"""Predicted against measured peak memory over a grid of configurations of one model.

Each configuration of the grid runs as a real trial (local processes: gloo on CPU, NCCL on
CUDA) and is traced under fake tensors. Two errors are reported per configuration, each the
prediction's (measured - predicted) / measured:

- ``after_one``: calibrated on the grid's first configuration alone, as a search is after its
  baseline;
- ``left_out``: calibrated on every other configuration of the grid, as a search is late on.

Measured is the resident peak of a rank on CPU, the caching allocator's reserved peak on CUDA.
On CUDA each row also holds ``tensors_vs_allocated``: the traced tensors, uncalibrated (the
prediction ``autotune plan`` makes on a machine without a GPU, as the trace runs on CPU
kernels), against the allocator's peak of allocated memory.
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from autotune.config import TrainConfig
from autotune.runner.launch import run_trial
from autotune.runner.platform import detect_platform
from autotune.runner.request import TrialOptions
from autotune.runner.workload import WorkloadSpec
from autotune.search.calibration import Point, fit, prior_for
from autotune.search.log import memory_used
from autotune.search.memory_model import MemoryModel

GRIDS = {
    "workloads.gpt:gpt_tiny": (32, 4),
    "workloads.convnet:resnet_tiny": (32, 2),
    "workloads.mlp:mlp_small": (64, 2),
    "tests.fixtures.traced:Stack": (4096, 4),
    "examples/hf_models.py:gpt2_tiny": (8, 4),  # 256-token sequences: 8 keeps a CPU grid short
    "examples/hf_models.py:bert_tiny": (8, 4),
    "examples/hf_models.py:llama_tiny": (8, 4),
    "workloads.gpt:gpt_small": (32, 6),
    "workloads.gpt:gpt_long_context": (16, 6),
    "workloads.convnet:resnet_small": (32, 6),
    "workloads.mlp:mlp_tiny": (64, 4),
    "workloads.mlp:mlp_loading_bound": (64, 4),
    "workloads.gpt:gpt_medium": (8, 8),
    # The GPU-scale models at a batch a 2-core, 24 GiB box runs (1,024-token sequences: about
    # 12 s a step of one sequence; micro-batch 4 holds about 10 GiB)
    "workloads.gpt:gpt2_124m": (4, 12),
    "workloads.convnet:resnet18": (8, 8),  # 224-pixel images: about 15 s a step of 8
}
"""Model -> (global batch, checkpoint segments of its grid) on a CPU, for the grids of
``scripts/bench_memory_prediction.py`` and ``scripts/bench_cpu_heap.py``."""

CUDA_GRIDS = {
    "workloads.gpt:gpt2_124m": (32, 12),  # the batch of the H100 runs ("On a GPU")
    "workloads.convnet:resnet18": (256, 8),
}
"""The same on a GPU, where they differ (a CPU grid at these batches exhausts the box)."""


def grid_shape(model: str, device: str) -> tuple[int, int]:
    """The (global batch, checkpoint segments) of ``model``'s grid on ``device``."""
    if device == "cuda" and model in CUDA_GRIDS:
        return CUDA_GRIDS[model]
    return GRIDS.get(model, (32, 2))


@dataclass(frozen=True)
class GridPoint:
    config: str
    status: str
    values: dict[str, Any]  # the TrainConfig's fields, to trace it again
    tensors_bytes: int | None  # per device, as traced (a prediction's input)
    measured_bytes: int | None  # per device, measured by the trial
    workers: int
    unsharded_bytes: int  # FSDP: the whole model a rank builds before sharding (else 0)
    trace_s: float
    trial_s: float
    device: str = "cpu"
    allocated_bytes: int | None = None  # CUDA: the allocator's peak of allocated memory
    message: str = ""  # why a configuration that did not finish did not
    forked_bytes: int = 0  # what a rank forks its DataLoader workers from (MemoryModel.forked)


def grid(
    global_batch_size: int,
    segments: int,
    devices: int = 2,
    device: str = "cpu",
    amps: tuple[str, ...] = ("off", "bf16"),
) -> list[TrainConfig]:
    """Parallel mode x precision x checkpointing x accumulation, plus workers once (on CPU,
    where they count) on ``devices`` ranks of ``device`` (one GPU: DDP and FSDP of one rank)."""
    configs = []
    for parallel, world in (("single", 1), ("ddp", devices), ("fsdp", devices)):
        for amp in amps:
            for checkpointed in sorted({0, segments}):
                for accum in (1, 4):
                    values = {
                        "global_batch_size": global_batch_size,
                        "parallel": parallel,
                        "world_size": world,
                        "amp": amp,
                        "checkpoint_segments": checkpointed,
                        "grad_accum_steps": accum,
                        "device": device,
                    }
                    try:
                        configs.append(TrainConfig(**values))
                    except ValueError:
                        continue
    if device == "cpu":
        configs.insert(1, configs[0].model_copy(update={"num_workers": 2}))
    return configs


def worker_grid(global_batch_size: int) -> list[TrainConfig]:
    """One CPU rank in fp32 without DataLoader workers, with one and two, each also persistent
    (``--grid workers``): a rank forks non-persistent workers again at every epoch, holding its
    whole step, persistent ones once before its first step (``MemoryModel.forked``)."""
    base = TrainConfig(global_batch_size=global_batch_size, device="cpu")
    return [base] + [
        base.model_copy(update={"num_workers": workers, "persistent_workers": persistent})
        for workers in (1, 2)
        for persistent in (False, True)
    ]


GRID_OPTIONS = {"warmup_steps": 1, "measured_steps": 2, "target_interval": 0, "min_measure_s": 0}
"""A grid trial's window: memory peaks by the second step (the optimizer's state exists from the
first), and a short window keeps a grid of slow configurations (bf16 on a CPU) within reach."""


def measure_grid(
    workload: WorkloadSpec,
    configs: list[TrainConfig],
    timeout_s: float = 1800.0,
    trace: bool = True,
    measured: Callable[[GridPoint], None] | None = None,
) -> list[GridPoint]:
    """Trace and run every configuration (a short real trial each), on the configurations'
    device. ``timeout_s`` per trial: a search's 300 s ends GPT-2 small's CPU trials (a step of
    four 1,024-token sequences takes about a minute on 2 cores). Without ``trace`` the points
    carry measurements alone, for ``rescored`` to trace on another machine (a lent GPU's
    minutes then go to the trials: the trace took a third of each configuration's there).
    ``measured`` hears each point as it is measured (to keep it, should the run be cut)."""
    device = configs[0].device if configs else "cpu"
    model = MemoryModel(workload, device)
    options = TrialOptions(**GRID_OPTIONS, timeout_s=timeout_s)
    points = []
    for config in configs:
        started = time.perf_counter()
        found = model.traced(config) if trace else None
        traced = time.perf_counter()
        result = run_trial(config, workload, options)
        used = memory_used(result, device)
        ok = [r for r in result.ranks if r.status == "ok"]
        point = GridPoint(
            config=config.summary(),
            status=result.status,
            values=config.model_dump(mode="json"),
            tensors_bytes=found.tensors_bytes if found else None,
            measured_bytes=used // model.devices_counted(config) if used else None,
            workers=model.workers(config),
            unsharded_bytes=found.unsharded_bytes if found else 0,
            forked_bytes=found.forked_bytes if found else 0,
            trace_s=traced - started,
            trial_s=time.perf_counter() - traced,
            device=device,
            allocated_bytes=max(r.peak_memory_bytes for r in ok)
            if device == "cuda" and ok and used
            else None,
            message=result.message if result.status != "ok" else "",
        )
        points.append(point)
        if measured is not None:
            measured(point)
    return points


def rescored(model: str, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Saved rows traced and scored again with the memory model as it now stands (no trial
    runs again)."""
    workload = WorkloadSpec(model=model, search_path=(os.getcwd(),))
    memory = MemoryModel(workload, rows[0].get("device", "cpu") if rows else "cpu")
    points = []
    for row in rows:
        config = TrainConfig(**row["values"])
        found = memory.traced(config)
        kept = {k: row[k] for k in GridPoint.__dataclass_fields__ if k in row}
        kept["tensors_bytes"] = found.tensors_bytes if found else None
        kept["unsharded_bytes"] = found.unsharded_bytes if found else 0
        kept["forked_bytes"] = found.forked_bytes if found else 0
        points.append(GridPoint(**kept))
    return errors(points, workload)


def unfinished(points: list[GridPoint]) -> list[dict[str, str]]:
    """The configurations of a grid that measured nothing, with why (``errors`` scores the
    rest)."""
    return [
        {"config": p.config, "status": p.status, "message": p.message}
        for p in points
        if p.tensors_bytes is None or not p.measured_bytes
    ]


def errors(points: list[GridPoint], workload: WorkloadSpec | None = None) -> list[dict[str, Any]]:
    """Each point with its prediction before any trial (the first guess, with ``workload``'s
    share of a rank measured as a search measures it: a local rank's), after one calibration
    trial and with all others."""
    usable = [p for p in points if p.tensors_bytes is not None and p.measured_bytes]
    calibration_points = [
        Point(
            p.tensors_bytes or 0,
            p.workers,
            p.measured_bytes or 0,
            p.unsharded_bytes,
            p.values.get("compile", "off") != "off",
            p.forked_bytes,
        )
        for p in usable
    ]
    prior = prior_for(usable[0].device if usable else "cpu", workload)
    first = fit(calibration_points[:1], prior)
    rows = []
    for i, (point, cal) in enumerate(zip(usable, calibration_points, strict=True)):
        others = fit(calibration_points[:i] + calibration_points[i + 1 :], prior)
        measured = cal.measured_bytes
        row = asdict(point)
        row["predicted_before_bytes"] = prior.apply(
            cal.tensors_bytes, cal.workers, cal.unsharded_bytes, cal.compiled, cal.forked_bytes
        )
        row["before_any"] = (measured - row["predicted_before_bytes"]) / measured
        row["predicted_after_one_bytes"] = first.apply(
            cal.tensors_bytes, cal.workers, cal.unsharded_bytes, cal.compiled, cal.forked_bytes
        )
        row["predicted_left_out_bytes"] = others.apply(
            cal.tensors_bytes, cal.workers, cal.unsharded_bytes, cal.compiled, cal.forked_bytes
        )
        row["after_one"] = (measured - row["predicted_after_one_bytes"]) / measured
        row["left_out"] = (measured - row["predicted_left_out_bytes"]) / measured
        row["tensor_share"] = cal.tensors_bytes / measured
        if point.allocated_bytes:
            row["tensors_vs_allocated"] = (
                point.allocated_bytes - cal.tensors_bytes
            ) / point.allocated_bytes
        rows.append(row)
    return rows


def within_targets(rows: list[dict[str, Any]]) -> dict[str, int]:
    """How many of a grid's scored rows (``errors``) meet the targets: within +-10% calibrated
    on the others, on the first alone, before any trial; on CUDA, traced tensors within +-5% of
    the allocator's peak."""
    counts = {
        "configurations": len(rows),
        "left_out": sum(abs(r["left_out"]) <= 0.10 for r in rows),
        "after_one": sum(abs(r["after_one"]) <= 0.10 for r in rows),
        "before_any": sum(abs(r["before_any"]) <= 0.10 for r in rows),
    }
    allocated = [r["tensors_vs_allocated"] for r in rows if "tensors_vs_allocated" in r]
    if allocated:  # of the rows that measured the allocator's peak
        counts["with_allocated"] = len(allocated)
        counts["tensors_vs_allocated"] = sum(abs(e) <= 0.05 for e in allocated)
    return counts


def plan_seconds(model: str, devices: int = 64) -> float:
    """Wall seconds of ``autotune plan`` of ``model`` over the default space at ``devices``
    devices of 80 GiB, as a user runs it (its own process: imports and trace included)."""
    import subprocess
    import sys

    started = time.perf_counter()
    command = [sys.executable, "-m", "autotune.cli", "plan", "--model", model]
    command += ["--devices", str(devices), "--device-memory", "80GiB", "--json"]
    subprocess.run(command, check=True, capture_output=True)
    return time.perf_counter() - started


def machine() -> dict[str, Any]:
    import torch

    return {
        "cpu": detect_platform("cpu").device_name,
        "cores": os.cpu_count(),
        "torch": torch.__version__,
        "python": platform.python_version(),
    }


MMAP_THRESHOLD_ENV = "MALLOC_MMAP_THRESHOLD_"
"""glibc's tunable: a fixed mmap threshold, which also stops glibc from raising it on its own."""


def heap_pairs(
    workload: WorkloadSpec,
    configs: list[TrainConfig],
    threshold_bytes: int,
    repeats: int = 2,
) -> list[dict[str, Any]]:
    """Each configuration run with glibc's default heap and with its mmap threshold fixed at
    ``threshold_bytes``, alternately, ``repeats`` times: the resident peak per rank, the
    throughput, and the traced tensors the prediction starts from.

    By default glibc serves an allocation below its mmap threshold from the heap, and raises
    that threshold (up to 32 MiB) each time a larger mmapped block is freed; freed heap pages
    stay resident for reuse. A fixed threshold sends every larger tensor to mmap, returned to
    the system when freed, so the resident peak follows the live tensors. The rank processes
    read the variable when they start (local executor), so the setting is theirs alone."""
    model = MemoryModel(workload, "cpu")
    options = TrialOptions()
    rows = []
    for repeat in range(repeats):
        for config in configs:
            parts = model.device_tensors(config)
            for heap in ("default", "fixed"):
                saved = os.environ.pop(MMAP_THRESHOLD_ENV, None)
                if heap == "fixed":
                    os.environ[MMAP_THRESHOLD_ENV] = str(threshold_bytes)
                try:
                    result = run_trial(config, workload, options)
                finally:
                    os.environ.pop(MMAP_THRESHOLD_ENV, None)
                    if saved is not None:
                        os.environ[MMAP_THRESHOLD_ENV] = saved
                used = memory_used(result, "cpu")
                rows.append(
                    {
                        "config": config.summary(),
                        "repeat": repeat,
                        "heap": heap,
                        "status": result.status,
                        "tensors_bytes": sum(parts.values()) if parts else None,
                        "measured_bytes": used // config.processes if used else None,
                        "samples_per_s": result.samples_per_s,
                    }
                )
    return rows


def heap_summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per configuration of ``heap_pairs``' rows: the traced tensors, and the median resident
    peak and samples/s under each heap."""
    import statistics

    summaries = []
    for config in dict.fromkeys(r["config"] for r in rows):
        mine = [r for r in rows if r["config"] == config]
        summary: dict[str, Any] = {"config": config, "tensors_bytes": mine[0]["tensors_bytes"]}
        for heap in ("default", "fixed"):
            for key in ("measured_bytes", "samples_per_s"):
                values = [r[key] for r in mine if r["heap"] == heap and r[key] is not None]
                summary[f"{key}_{heap}"] = statistics.median(values) if values else None
        summaries.append(summary)
    return summaries


def print_scores(model: str, rows: list[dict[str, Any]]) -> None:
    """``errors``' rows of ``model``, a line each, and how many meet the targets."""
    for row in rows:
        allocated = row.get("tensors_vs_allocated")
        print(
            f"{model:32} {row['config']:58} {row['tensors_bytes'] / 2**20:7.0f}M "
            f"{row['measured_bytes'] / 2**20:8.0f}M {row['before_any']:+8.1%} "
            f"{row['after_one']:+8.1%} "
            f"{row['left_out']:+7.1%}" + (f" {allocated:+10.1%}" if allocated is not None else "")
        )
    counts = within_targets(rows)
    n = counts["configurations"]
    if "tensors_vs_allocated" in counts:
        print(
            f"{model}: traced tensors within +-5% of the allocator's peak in "
            f"{counts['tensors_vs_allocated']} of {counts['with_allocated']}"
        )
    print(
        f"{model}: within +-10% in {counts['left_out']} of {n} calibrated on the others, "
        f"{counts['after_one']} of {n} calibrated on the first alone, {counts['before_any']} of "
        f"{n} before any trial (the first guess)"
    )
