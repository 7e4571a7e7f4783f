"""What a launcher hands to every rank: the config, the workload and how long to measure."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from autotune.config import TrainConfig
from autotune.runner.workload import WorkloadSpec
from autotune.units import parse_bytes


class TrialOptions(BaseModel):
    """How a trial is measured; not part of the configuration being measured."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    warmup_steps: int = Field(2, ge=1, description="Optimizer steps run before measuring.")
    measured_steps: int = Field(
        5,
        ge=2,
        description="Measured optimizer steps at least; more are measured until the interval "
        "target is met (or max_measure_s). With target_interval 0, exactly this many.",
    )
    min_measure_s: float = Field(1.0, ge=0, description="Measure for at least this long (s).")
    max_measure_s: float = Field(
        10.0, gt=0, description="Stop measuring after this long (s), tight or not."
    )
    target_interval: float = Field(
        0.03,
        ge=0,
        lt=1,
        description="Measure until the 95% interval of the mean step time is within this "
        "share of it (0.03: +-3%); 0 measures a fixed window of measured_steps.",
    )
    prune_below_samples_per_s: float | None = Field(
        None,
        gt=0,
        description="Stop early, as pruned, once the trial is clearly slower than this: the "
        "fast end of its interval is below it, or one step takes 10x a step at it.",
    )
    timeout_s: float = Field(
        300.0,
        gt=0,
        description="Wall-clock limit of one trial, in seconds.",
        json_schema_extra={"flag": "timeout"},
    )
    seed: int = Field(0, description="Seed for model initialisation and data order.")
    learning_rate: float = Field(
        1e-4,
        gt=0,
        description="Learning rate of the default AdamW (a workload's own optimizer sets its own).",
    )
    memory_limit_bytes: int | None = Field(
        None,
        gt=0,
        description="Impose a per-rank memory limit, e.g. 4GiB: RLIMIT_DATA on CPU, the CUDA "
        "allocator's per-process fraction on GPU. Exceeding it is classified as oom.",
        json_schema_extra={"flag": "memory-limit", "text": True},
    )
    failure_grace_s: float = Field(
        3.0, ge=0, description="After one rank fails, how long the others may take to report."
    )

    def longer(self, factor: int) -> TrialOptions:
        """These options for a run ``factor`` times longer (the verification run)."""
        return self.model_copy(
            update={
                "measured_steps": self.measured_steps * factor,
                "min_measure_s": self.min_measure_s * factor,
                "max_measure_s": self.max_measure_s * factor,
                "timeout_s": self.timeout_s * factor,
            }
        )

    def floor(self) -> TrialOptions:
        """These options measuring only the floor, ``measured_steps`` and ``min_measure_s``,
        with no interval target: for a run whose evidence is its place among many runs (a
        race round), since one run's interval cannot see the run-to-run noise."""
        if self.min_measure_s == 0:
            return self.model_copy(update={"target_interval": 0.0})
        return self.model_copy(update={"max_measure_s": self.min_measure_s})

    @field_validator("memory_limit_bytes", mode="before")
    @classmethod
    def _size(cls, value: object) -> object:
        return parse_bytes(value) if isinstance(value, str) else value

    def warmup_for(self, config: TrainConfig) -> int:
        """Warm-up optimizer steps for ``config``: the asked ones, plus enough to consume the
        batches DataLoader workers prefetch meanwhile. Measured steps then see the loader's
        steady state, not a full queue: a short trial of a loading-bound model otherwise
        overestimates its throughput by the queue's worth of free batches."""
        queued = config.num_workers * (config.prefetch_factor or 2)  # 2: torch's default
        compiling = 1 if config.compile != "off" else 0  # the step that compiles comes first
        return compiling + self.warmup_steps + -(-queued // config.grad_accum_steps)


class TrialRequest(BaseModel):
    """Everything a rank needs, serialised to JSON for the rank process."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    config: TrainConfig
    workload: WorkloadSpec
    options: TrialOptions
