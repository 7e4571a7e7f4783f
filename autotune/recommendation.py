"""What a search returns: the recommended configuration, its evidence, and every trial."""

from __future__ import annotations

import statistics
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from autotune.config import TrainConfig
from autotune.records import Exclusion, TrialRecord
from autotune.result import Platform, TrialResult

_FROZEN = ConfigDict(frozen=True, extra="forbid")

ThroughputVerdict = Literal["confirmed", "not confirmed", "too noisy", "not measured"]


ROUNDS_IN_REACH = 1000
"""A projected ``rounds_to_split`` stops counting here."""


class RunnerUp(BaseModel):
    """The race's next-fastest finalist, against the recommended configuration over the rounds
    both ran (the runs were interleaved, so drift hit both)."""

    model_config = _FROZEN

    config: TrainConfig
    ratio: float | None = Field(
        None,
        description="Its samples/s over the recommended's: the geometric mean of the paired "
        "rounds' ratios (None: fewer than two rounds beside it).",
    )
    ratio_low: float | None = Field(
        None,
        description="90% interval of the ratio: its high end below 1 is the race's one-sided "
        "95% test, the level at which a finalist leaves the race.",
    )
    ratio_high: float | None = None
    rounds: int = Field(0, description="Race rounds both ran and fitted in.")
    rounds_to_split: int | None = Field(
        None,
        description="A projection, not a measurement: the rounds after which the race would "
        "tell the two apart if their ratio and its round-to-round spread stayed as measured "
        f"({ROUNDS_IN_REACH} meaning that many or more; None when ruled out or not compared).",
    )
    ruled_out: bool = Field(
        False,
        description="The race showed it slower with that confidence; False: the run-to-run "
        "noise could not tell the two apart in these rounds.",
    )
    faster: bool = Field(
        False,
        description="The race showed it faster with that confidence: the recommended was "
        "chosen for changing less, its gain not shown by the 95% interval the output reports.",
    )


class Recommendation(BaseModel):
    """The fastest configuration found whose peak memory stays under the limit."""

    model_config = _FROZEN

    config: TrainConfig
    samples_per_s: float = Field(
        description="Mean over the winner's race runs (interleaved with the other finalists), "
        "times selection_factor."
    )
    samples_per_s_low: float | None = Field(
        None, description="95% interval of samples_per_s over those runs (None: one run)."
    )
    samples_per_s_high: float | None = None
    samples_per_s_runs: list[float] = Field(description="Each measurement of the winner.")
    selection_factor: float = Field(
        1.0,
        description="The share of the race runs' mean kept after taking out the luck of "
        "being chosen among finalists the noise could not split (the winner's curse; "
        "empirical-Bayes shrinkage towards the finalists' mean); 1.0: nothing taken out. "
        "samples_per_s, its interval and the speed-up carry it.",
    )
    spread: float = Field(description="(max - min) / median of those measurements.")
    memory_used_bytes: int
    memory_budget_bytes: int
    memory_limit_bytes: int = Field(description="Budget minus the safety margin.")
    verification: TrialResult | None = None
    verified: bool = Field(
        False, description="The longer run confirmed both the throughput and the memory."
    )
    memory_confirmed: bool = Field(False, description="Its peak stayed under the limit.")
    throughput_confirmed: bool = Field(
        False, description="Its samples/s was within throughput_tolerance of the estimate."
    )
    throughput_verdict: ThroughputVerdict = Field(
        "not measured",
        description="confirmed: the longer run agreed within throughput_tolerance; too noisy: "
        "the repeated measurements spread wider than that tolerance, so agreement would prove "
        "nothing; not confirmed: it disagreed; not measured: it did not finish.",
    )
    throughput_tolerance: float = Field(0.0, description="A fixed share, never the noise.")
    verification_error: float | None = Field(
        None, description="(verified - estimated) / estimated samples/s."
    )
    baseline: TrialRecord | None = Field(
        None, description="The baseline as measured last: ok, or failed with its reason."
    )
    baseline_samples_per_s: float | None = Field(
        None, description="Mean over the baseline's race runs."
    )
    baseline_memory_used_bytes: int | None = Field(
        None,
        description="The largest peak over the baseline's runs, as memory_used_bytes is the "
        "recommended's (None: a study stored before it; see baseline).",
    )
    speedup: float | None = Field(
        None,
        description="Over the baseline: the geometric mean of the paired ratios of the rounds "
        "both ran in the race (else samples_per_s / baseline_samples_per_s).",
    )
    speedup_low: float | None = Field(None, description="95% interval of the speed-up.")
    speedup_high: float | None = None
    recipe: TrainConfig | None = Field(
        None,
        description="The standard recipe, as the search measured it: what a skilled engineer "
        "writes by hand (None: it fitted at no micro-batch, or the study predates it).",
    )
    recipe_samples_per_s: float | None = Field(
        None, description="Mean over the recipe's race runs."
    )
    speedup_over_recipe: float | None = Field(
        None,
        description="Over the standard recipe: the geometric mean of the paired ratios of the "
        "rounds both ran in the race, with the same correction as speedup (1.0: the recipe is "
        "the recommendation).",
    )
    speedup_over_recipe_low: float | None = Field(
        None, description="95% interval of the speed-up over the recipe."
    )
    speedup_over_recipe_high: float | None = None
    numerics_changes: list[str] = Field(
        default_factory=list,
        description="What the recommendation changes about the training's arithmetic against "
        "fp32 (autocast, compressed gradients, TF32, FSDP's bf16 policy), as knob=value.",
    )
    simpler_choice: str = Field(
        "",
        description="Why a configuration that changes less was recommended over the fastest "
        "measured one the race could not tell from it (empty: the fastest was recommended).",
    )
    made_room: str = Field(
        "",
        description="Where every finalist went over the memory limit in the race: which one "
        "this is, and what it moved (more accumulation, more checkpointed blocks, or compiling "
        "off) to leave room (empty: a finalist as the search measured it).",
    )
    memory_caveats: list[str] = Field(
        default_factory=list,
        description="What the measured peak does not cover on this device (memory that keeps "
        "growing after a trial's steps), each a sentence.",
    )
    throughput_caveats: list[str] = Field(
        default_factory=list,
        description="What makes its samples/s depend on how it was measured (a step time that "
        "rose or fell steadily over a run's steps), each a sentence.",
    )
    runner_up: RunnerUp | None = Field(
        None, description="The race's next-fastest finalist (None: no other finished the race)."
    )
    exclusions: list[Exclusion] = Field(default_factory=list)
    trials: list[TrialRecord] = Field(default_factory=list)
    platform: Platform
    model: str = Field("", description="The model reference the search tuned.")
    block_class: str | None = Field(
        None, description="Class names of the model's repeated blocks, comma-separated."
    )
    looped_layer: bool = Field(
        False,
        description="checkpoint_segments counts the calls of a layer the model's forward loops "
        "over (it has no stack of layers): applying it in code needs those calls "
        "(autotune.runner.training.loop_calls).",
    )
    checkpointing_refused_by: str | None = Field(
        None,
        description="The model's class where it says it has no activation checkpointing of its "
        "own (Hugging Face's supports_gradient_checkpointing=False): the Trainer's "
        "gradient_checkpointing flag would raise, so the exports checkpoint in code "
        "(autotune.runner.checkpointing.apply_checkpointing), as the trials did.",
    )
    scalar_parameters: list[str] = Field(
        default_factory=list,
        description="The model's 0-dim trainable parameters, which FSDP2's fully_shard refuses "
        "(the trials and autotune.apply keep them whole on every rank; other trainers' FSDP "
        "meets the refusal).",
    )
    parameter_dtype: str | None = Field(
        None,
        description="The one floating dtype of the model's parameters (bfloat16 for a model "
        "built in bf16), which is the arithmetic a configuration without autocast keeps; None "
        "where they differ or it was not told.",
    )
    global_batch_source: str = Field(
        "given",
        description="Where the global batch came from: given, the model's module, or "
        "the default (then the output says how to give the real one).",
    )
    optimizer: str = Field(
        "", description="Class of the optimizer every trial trained with (empty: unknown)."
    )
    optimizer_source: str = Field(
        "", description="Where it came from: --optimizer, the model's module, or the default."
    )
    storage: str
    study_name: str

    @property
    def recipe_won(self) -> bool:
        """The standard recipe is the recommendation: tuning found nothing better."""
        return self.recipe is not None and self.recipe.key() == self.config.key()

    @property
    def baseline_failed(self) -> bool:
        return self.baseline is not None and self.baseline.status != "ok"

    @property
    def baseline_over_limit(self) -> bool:
        """The baseline ran, but over the memory limit at every accumulation tried: its speed-up
        is over a configuration that does not fit."""
        return self.baseline is not None and self.baseline.status == "ok" and not self.baseline.fits

    def _compiled(self) -> list[TrialRecord]:
        return [t for t in self.trials if t.config == self.config and t.compile_s is not None]

    @property
    def compile_s(self) -> float | None:
        """torch.compile's one-time cost of the recommended config: the median over its trials
        in fresh processes, else over all of them (``compiled_before``); None when it does not
        compile."""
        trials = self._compiled()
        fresh = [t for t in trials if not t.compiled_before]
        values = [t.compile_s for t in fresh or trials if t.compile_s is not None]
        return statistics.median(values) if values else None

    @property
    def compiled_before(self) -> bool:
        """Every trial of the recommended config ran in processes that had compiled before (a
        reused rank keeps Inductor's imports and loaded kernels): ``compile_s`` is less than a
        run of its own pays. Seen on 2 CPU cores: a Transformer encoder compiled in 26.5 s in a
        fresh rank, 0.4 s in one that had compiled it before, 2.2 s in a fresh process with
        Inductor's disk cache warm."""
        trials = self._compiled()
        return bool(trials) and all(t.compiled_before for t in trials)

    @property
    def fresh_compile(self) -> TrialRecord | None:
        """The search's first trial that compiled in fresh processes (None: none did)."""
        return next((t for t in self.trials if t.compile_s and not t.compiled_before), None)

    @property
    def run_compile_s(self) -> float | None:
        """What compiling costs one run of the recommended config: ``compile_s``, or the
        search's first fresh compile where that is more and the config's trials all ran in
        processes that had compiled before."""
        fresh = self.fresh_compile
        if not self.compiled_before or self.compile_s is None or fresh is None:
            return self.compile_s
        return max(self.compile_s, fresh.compile_s or 0.0)

    @property
    def headroom_bytes(self) -> int:
        return self.memory_budget_bytes - self.memory_used_bytes

    def to_json(self) -> str:
        return self.model_dump_json(indent=2)

    def training_cost(
        self, train_samples: int, price_per_device_hour: float | None = None
    ) -> dict[str, dict[str, float]]:
        """Hours (and cost) to train on ``train_samples`` samples, recommended vs baseline."""
        rows = {"recommended": (self.samples_per_s, self.config.world_size, self.run_compile_s)}
        if self.baseline_samples_per_s and self.baseline and self.baseline.config:
            base = (self.baseline_samples_per_s, self.baseline.config.world_size)
            rows["baseline"] = (*base, self.baseline.compile_s)
        out = {}
        for name, (speed, devices, compile_s) in rows.items():
            hours = (train_samples / speed + (compile_s or 0.0)) / 3600  # compiled once a run
            entry = {"hours": hours, "device_hours": hours * devices}
            if price_per_device_hour is not None:
                entry["cost"] = hours * devices * price_per_device_hour
            out[name] = entry
        return out
