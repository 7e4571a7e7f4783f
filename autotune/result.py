"""Immutable records of what a trial measured: one ``RankReport`` per rank, one ``TrialResult``.

Every number here was measured. A trial that did not finish carries its status and the reason
instead of numbers; nothing is filled in with zeros.
"""

from __future__ import annotations

import json
import statistics
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from autotune.config import TrainConfig
from autotune.stats import drift, step_time_interval

TrialStatus = Literal["ok", "pruned", "oom", "crashed", "timed_out", "error", "invalid"]
"""pruned: stopped early because it was clearly slower than the incumbent; its partial
measurement (samples/s, peak so far) is kept."""

_FROZEN = ConfigDict(frozen=True, extra="forbid", ser_json_inf_nan="strings")
"""Frozen; a loss that was not finite is written "NaN" or "Infinity", standard JSON read back as
the float (pydantic's default, null, failed to read back, and a NaN loss ended a search)."""


class Platform(BaseModel):
    """Where a trial ran: results are only comparable on the same fingerprint."""

    model_config = _FROZEN

    device_type: Literal["cpu", "cuda"]
    device_name: str = Field(description="GPU model, or the CPU model name.")
    device_count: int
    device_memory_bytes: int = Field(description="Memory of one device (host RAM on CPU).")
    driver_version: str | None = None
    cuda_version: str | None = None
    torch_version: str
    python_version: str
    backend: Literal["gloo", "nccl"]
    cpu_count: int
    hostname: str

    def fingerprint(self) -> str:
        """A short stable hash of everything that makes measurements comparable."""
        import hashlib

        data = self.model_dump(exclude={"hostname"})
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


class StepDiagnostics(BaseModel):
    """Observable effects of the knobs, counted on one rank over warm-up and measured steps."""

    model_config = _FROZEN

    optimizer_steps: int = Field(description="optimizer.step() calls that actually ran.")
    micro_steps: int = Field(description="Forward/backward passes.")
    comm_hook_calls_per_micro_step: list[int] = Field(
        description="DDP comm hook invocations during each micro-step's backward."
    )
    output_dtype: str = Field(description="dtype of the model's first output tensor.")
    checkpointed_blocks: int = Field(description="Blocks run under activation checkpointing.")
    repeated_blocks: int = Field(description="Repeated blocks found in the model.")
    dataloader_worker_pids: list[list[int]] = Field(
        description="DataLoader worker PIDs seen in each epoch (same PIDs: persistent workers)."
    )
    grad_scaler_scale: float | None = Field(description="Final GradScaler scale (fp16 only).")
    powersgd_lowrank_calls: int = Field(
        0, description="PowerSGD hook calls that sent low-rank factors (compression happened)."
    )
    compiled_graphs: int | None = Field(
        0,
        description="Graphs torch.compile compiled in this trial; None where torch's counter "
        "could not be read (autotune.runner.compile_state).",
    )
    matmul_precision: str = Field(
        "", description="torch.get_float32_matmul_precision() while the trial ran."
    )
    allocator_settings: str = Field(
        "", description="The CUDA caching allocator's settings as the rank read them back."
    )
    optimizer_impl: str = Field(
        "", description="The flag the optimizer ran with: fused, foreach, or default (neither)."
    )


class RankReport(BaseModel):
    """What one rank process measured, or why it stopped."""

    model_config = _FROZEN

    rank: int
    status: TrialStatus
    message: str = ""
    startup_s: float = Field(0.0, description="Process start to process group ready.")
    build_s: float = Field(0.0, description="Model, data, wrap, optimizer and DataLoader build.")
    warmup_s: float = 0.0
    measured_s: float = Field(0.0, description="Wall time of the measured optimizer steps.")
    step_times_s: list[float] = Field(default_factory=list)
    data_wait_s: float = Field(0.0, description="Time blocked waiting for the next batch.")
    peak_memory_bytes: int = Field(
        0, description="CUDA: allocator peak; CPU: resident high-water mark incl. workers."
    )
    peak_reserved_bytes: int | None = Field(None, description="CUDA allocator reserved peak.")
    peak_device_used_bytes: int | None = Field(
        None, description="CUDA: device-level memory in use (NVML), sampled peak."
    )
    losses: list[float] = Field(default_factory=list, description="Loss of each optimizer step.")
    pruned: str = Field("", description="Why the rank stopped early (empty: it did not).")
    epochs_crossed: int = Field(0, description="Epoch boundaries inside the measured steps.")
    epoch_boundary_s: float | None = Field(
        None, description="Extra time of a step that starts an epoch (measured once)."
    )
    batches_per_epoch: int | None = Field(None, description="This rank's batches per epoch.")
    compile_s: float | None = Field(
        None, description="torch.compile: the first step's time beyond a measured step's."
    )
    compiled_before: bool = Field(
        False,
        description="The process had compiled before this trial: a fresh run compiles longer.",
    )
    torch_threads: int = 0
    optimizer: str = Field("", description="Class of the optimizer the rank trained with.")
    collate: str = Field("", description="Where the rank's collate function came from.")
    data: str = Field("", description="Where the rank's samples came from.")
    loss_rule: str = Field(
        "", description="The rule the default loss took, in words (empty: the user's loss)."
    )
    loss_source: str = Field("", description="Where the rank's loss function came from.")
    node: str = Field("", description="The Ray node the rank ran on (empty: the local launcher).")
    diagnostics: StepDiagnostics | None = None


class TrialResult(BaseModel):
    """The outcome of one trial: its config, where it ran, and what was measured."""

    model_config = _FROZEN

    config: TrainConfig
    status: TrialStatus
    message: str = Field("", description="Why the trial did not finish ok.")
    platform: Platform | None = None
    workload: dict[str, str | None] = Field(default_factory=dict)
    optimizer: str = Field(
        "", description="Class of the optimizer the trial trained with (empty: not built)."
    )
    collate: str = Field(
        "", description="Where the trial's collate function came from (empty: not built)."
    )
    data: str = Field(
        "",
        description="Where the trial's samples came from, synthetic ones with their shape and "
        "range (empty: not built).",
    )
    loss_rule: str = Field(
        "",
        description="What the default loss computed, in words (empty: the user's loss, or no "
        "step ran).",
    )
    loss_source: str = Field(
        "",
        description="Where the user's loss came from ('--loss mod:attr', 'mymodel "
        "autotune_loss'; empty: the default loss, or not built).",
    )
    warmup_steps: int = 0
    measured_steps: int = 0
    samples_per_s: float | None = Field(
        None,
        description="Global samples per second over a long run: the measured steps, with one "
        "epoch boundary's cost spread over the steps of an epoch.",
    )
    samples_per_s_low: float | None = Field(
        None, description="95% interval of samples_per_s, from the measured step times."
    )
    samples_per_s_high: float | None = None
    steady_samples_per_s: float | None = Field(
        None, description="Samples per second of the measured steps alone, no epoch boundary."
    )
    epoch_boundary_s: float | None = Field(
        None, description="Extra time an epoch boundary costs (slowest rank), measured once."
    )
    steps_per_epoch: float | None = Field(None, description="Optimizer steps per epoch.")
    compile_s: float | None = Field(
        None,
        description="torch.compile's one-time cost (slowest rank): paid once per run, part of "
        "the warm-up, never in the measured steps.",
    )
    compiled_before: bool = Field(
        False,
        description="A rank's process had compiled before this trial (a reused rank): what "
        "compile_s measured is less than a fresh run pays.",
    )
    step_time_median_s: float | None = None
    step_time_p10_s: float | None = None
    step_time_p90_s: float | None = None
    step_time_spread: float | None = Field(
        None, description="(p90 - p10) / median of step time, over ranks' slowest steps."
    )
    step_time_drift: float | None = Field(
        None,
        description="Step time not level over the measured steps: the last third's median over "
        "the first third's, when they rise or fall steadily (None: level; ``stats.drift``).",
    )
    data_wait_share: float | None = Field(
        None, description="Share of measured time spent waiting for data (slowest rank)."
    )
    peak_memory_bytes: int | None = Field(None, description="Largest peak over ranks.")
    loss_finite: bool | None = None
    launch_s: float = Field(0.0, description="Launcher overhead before ranks started.")
    startup_s: float = 0.0
    build_s: float = 0.0
    warmup_s: float = 0.0
    measured_s: float = 0.0
    total_s: float = 0.0
    ranks: list[RankReport] = Field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def diverged(self) -> str | None:
        """The first loss that was not finite, where, in words; None where every loss was
        finite (or none was recorded): training under this configuration diverged."""
        for report in self.ranks:
            for step, loss in enumerate(report.losses, 1):
                if not _finite(loss):
                    return (
                        f"rank {report.rank}'s loss was {loss} at optimizer step {step} of "
                        f"{len(report.losses)} (warm-up included)"
                    )
        return None

    @property
    def overhead_s(self) -> float:
        """Wall time not spent in warm-up or measured steps."""
        return max(0.0, self.total_s - self.warmup_s - self.measured_s)

    def to_json(self) -> str:
        return self.model_dump_json(indent=2)


def drift_words(ratio: float) -> str:
    """``step_time_drift`` in words: which way, how far, and what moves a step that way."""
    if ratio > 1:
        return (
            f"step time rose {ratio:.1f}x over the measured steps (their last third against "
            "their first): not steady yet (state carried from step to step, a cache filling, or "
            "a machine that got busier)"
        )
    return (
        f"step time fell to {ratio:.2f}x over the measured steps (their last third against "
        "their first): still warming up (kernels chosen, caches filled, or a machine that got "
        "quieter)"
    )


def _quantile(values: list[float], q: float) -> float:
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1]


def rank_times(reports: list[RankReport]) -> dict[str, float]:
    """The trial's start-up, build and warm-up times: the slowest rank's, as far as the ranks
    got (a failed trial's too)."""
    return {
        "startup_s": max((r.startup_s for r in reports), default=0.0),
        "build_s": max((r.build_s for r in reports), default=0.0),
        "warmup_s": max((r.warmup_s for r in reports), default=0.0),
    }


def summarise_steps(config: TrainConfig, reports: list[RankReport]) -> dict[str, object]:
    """Aggregate per-rank measurements into the trial-level numbers of ``TrialResult``.

    A short trial rarely crosses an epoch, so the cost of one boundary, measured once, is
    spread over an epoch's steps: ``samples_per_s`` is what a long run sees, boundaries
    included (boundaries the measured steps already crossed are not counted twice)."""
    # A step is as slow as its slowest rank; ranks are in lock-step through the collectives.
    steps = [max(times) for times in zip(*(r.step_times_s for r in reports), strict=True)]
    measured_s = max(r.measured_s for r in reports)
    median = statistics.median(steps)
    p10, p90 = _quantile(steps, 0.10), _quantile(steps, 0.90)
    losses = [loss for r in reports for loss in r.losses]
    n = len(steps)
    steady = config.global_batch_size * n / measured_s
    extra_s, boundary_s, per_epoch = 0.0, None, None
    boundaries = [r.epoch_boundary_s for r in reports if r.epoch_boundary_s is not None]
    batches = [r.batches_per_epoch for r in reports if r.batches_per_epoch]
    if boundaries and batches:
        boundary_s = max(boundaries)
        per_epoch = min(batches) / config.grad_accum_steps
        crossed = max(r.epochs_crossed for r in reports)
        extra_s = max(0.0, n / per_epoch - crossed) * boundary_s
    speed = config.global_batch_size * n / (measured_s + extra_s)
    relative = step_time_interval(steps).relative  # the one the window stopped on
    return {
        "samples_per_s": speed,
        "samples_per_s_low": speed / (1 + relative) if relative < 1 else 0.0,
        "samples_per_s_high": speed / (1 - relative) if relative < 1 else None,
        "steady_samples_per_s": steady,
        "epoch_boundary_s": boundary_s,
        "steps_per_epoch": per_epoch,
        "compile_s": max((r.compile_s for r in reports if r.compile_s is not None), default=None),
        "compiled_before": any(r.compiled_before for r in reports if r.compile_s is not None),
        "measured_steps": n,
        "step_time_median_s": median,
        "step_time_p10_s": p10,
        "step_time_p90_s": p90,
        "step_time_spread": (p90 - p10) / median if median > 0 else 0.0,
        "step_time_drift": drift(steps),
        "data_wait_share": max(r.data_wait_s / r.measured_s for r in reports if r.measured_s),
        "peak_memory_bytes": max(r.peak_memory_bytes for r in reports),
        "loss_finite": all(_finite(x) for x in losses) and bool(losses),
        **rank_times(reports),
        "measured_s": measured_s,
    }


def _finite(value: float) -> bool:
    return value == value and value not in (float("inf"), float("-inf"))
