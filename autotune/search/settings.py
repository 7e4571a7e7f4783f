"""What a search is asked to do, nested by concern: budget, memory, measurement, finishing,
study (its storage), cluster. Validated at the edge; every field's description is its CLI help.

``tune()`` and ``autotune search`` take the fields by their flat names (``trials=40``,
``--trials 40``); ``make_settings`` places each in its section. The measurement section reuses
``TrialOptions``' own fields, so a trial's defaults are written once.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from autotune.errors import ConfigError, validated
from autotune.runner.request import TrialOptions
from autotune.units import parse_bytes, parse_duration

_FROZEN = ConfigDict(frozen=True, extra="forbid")
_TRIAL = TrialOptions.model_fields


class BudgetSettings(BaseModel):
    """When the search stops proposing, and how it spends what it has."""

    model_config = _FROZEN

    trials: int | None = Field(20, ge=1, description="Measured trials, the baseline included.")
    time_budget_s: float | None = Field(
        None,
        gt=0,
        description="Stop proposing after this long: seconds, or a duration such as 15m (a "
        "resumed study counts the time its stored trials took).",
        json_schema_extra={"flag": "time-budget", "text": True},
    )

    climb: bool = Field(
        True,
        description="Propose one-knob moves from the fastest configurations first, most "
        "promising first, before the sampler explores (--no-climb: the sampler from the start).",
    )

    @field_validator("time_budget_s", mode="before")
    @classmethod
    def _duration(cls, value: object) -> object:
        return parse_duration(value) if isinstance(value, str) else value


class MemorySettings(BaseModel):
    """The memory a configuration may use."""

    model_config = _FROZEN

    memory_budget: str | int | float = Field(
        0.9,
        description="Per-device budget: a size (20GiB), bytes, or a fraction of one device's "
        "memory (0.9). On CPU it covers all ranks of a trial together.",
    )
    safety_margin: float = Field(
        0.1, ge=0, lt=1, description="Share of the budget kept free: peak <= budget * (1 - m)."
    )
    enforce_memory_budget: bool = Field(
        False, description="Also impose the budget as a hard per-rank limit (trials over it OOM)."
    )
    predict_memory: bool = Field(
        True,
        description="Predict each configuration's peak from the model under fake tensors and "
        "skip what is predicted over the limit beyond the prediction's measured error "
        "(--no-predict-memory: learn memory only from trials that ran).",
    )

    @field_validator("memory_budget", mode="before")
    @classmethod
    def _check_budget(cls, value: object) -> str | int | float:
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise ValueError("expected a size such as 20GiB or a fraction such as 0.9")
        if isinstance(value, str):
            try:
                number = float(value)
            except ValueError:
                parse_bytes(value)
                return value
            value = number
        if 0 < value <= 1:
            return float(value)
        if value > 1 and float(value).is_integer():
            return int(value)
        raise ValueError(
            f"{value!r} is neither a fraction in (0, 1] nor a number of bytes; "
            "use e.g. 0.9 or 20GiB"
        )

    def memory_budget_bytes(self, device_memory_bytes: int) -> int:
        """The budget in bytes, given one device's memory."""
        value = self.memory_budget
        if isinstance(value, float):
            return int(value * device_memory_bytes)
        return value if isinstance(value, int) else parse_bytes(value)


class MeasurementSettings(BaseModel):
    """How each trial measures: ``TrialOptions``' fields, with their defaults."""

    model_config = _FROZEN

    warmup_steps: int = _TRIAL["warmup_steps"]  # type: ignore[assignment]
    measured_steps: int = _TRIAL["measured_steps"]  # type: ignore[assignment]
    min_measure_s: float = _TRIAL["min_measure_s"]  # type: ignore[assignment]
    max_measure_s: float = _TRIAL["max_measure_s"]  # type: ignore[assignment]
    target_interval: float = _TRIAL["target_interval"]  # type: ignore[assignment]
    prune_ratio: float = Field(
        0.5,
        ge=0,
        lt=1,
        description="Stop a search trial early once it is clearly slower than this share of "
        "the incumbent's samples/s (0: never prune).",
    )
    trial_timeout_s: float = Field(
        _TRIAL["timeout_s"].default,
        gt=0,
        description=_TRIAL["timeout_s"].description,
        json_schema_extra={"flag": "trial-timeout"},
    )
    seed: int = _TRIAL["seed"]  # type: ignore[assignment]

    def options(
        self, memory_limit_bytes: int | None = None, prune_below: float | None = None
    ) -> TrialOptions:
        """A trial's options from these settings; ``prune_below``: the samples/s under which
        it stops early (the search gives ``prune_ratio`` of the incumbent's)."""
        return TrialOptions(
            warmup_steps=self.warmup_steps,
            measured_steps=self.measured_steps,
            min_measure_s=self.min_measure_s,
            max_measure_s=self.max_measure_s,
            target_interval=self.target_interval,
            timeout_s=self.trial_timeout_s,
            seed=self.seed,
            memory_limit_bytes=memory_limit_bytes,
            prune_below_samples_per_s=prune_below,
        )


class FinishingSettings(BaseModel):
    """How the winner is chosen and confirmed once the budget is spent."""

    model_config = _FROZEN

    top_k: int = Field(3, ge=1, description="Finalists raced at the end: the best k of the search.")
    race_rounds: int = Field(
        4,
        ge=2,
        description="Most interleaved pairs of runs per challenger in the race; fewer when "
        "the paired comparison is already decided.",
    )
    verify_factor: int = Field(
        4, ge=1, description="Verification run: this many times as long as a race run."
    )


class StorageSettings(BaseModel):
    """Where the study lives."""

    model_config = _FROZEN

    storage: str = Field("autotune.db", description="A file path or an Optuna storage URL.")
    study_name: str | None = Field(None, description="Default: from the model and global batch.")
    new_study: bool = Field(
        False,
        description="Start a new study instead of resuming the stored one of the same name "
        "(the new one's name gets a -2, -3... suffix).",
    )
    storage_wait_s: float = Field(
        300.0,
        ge=0,
        description="How long to wait for a study database that stopped answering before the "
        "search stops (nothing stored is lost): seconds, or a duration such as 5m.",
        json_schema_extra={"flag": "storage-wait", "text": True},
    )

    @field_validator("storage_wait_s", mode="before")
    @classmethod
    def _duration(cls, value: object) -> object:
        return parse_duration(value) if isinstance(value, str) else value


class ClusterSettings(BaseModel):
    """Which devices the trials run on."""

    model_config = _FROZEN

    devices: int | None = Field(
        None,
        ge=1,
        description="Devices to consider: GPUs, or ranks on CPU (default: all, 2 on CPU).",
    )
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto: cuda if available.")
    executor: Literal["ray", "local"] = Field(
        "ray",
        description="What runs the trials: ray (gangs of rank actors on a Ray cluster, kept warm "
        "between trials) or local (rank processes of this machine started per trial, one trial "
        "at a time; no Ray needed).",
    )
    ray_address: str | None = Field(None, description="An existing Ray cluster; else a local one.")
    ship_code: bool = Field(
        True,
        description="With --ray-address: upload the working directory to every node (Ray's "
        "runtime_env working_dir; .gitignore honoured, 512 MiB at most).",
    )
    concurrency: int | None = Field(
        None, ge=1, description="Trials at once (default: 1 on CPU, as devices allow on GPU)."
    )

    @model_validator(mode="after")
    def _local_is_this_machine(self) -> ClusterSettings:
        if self.executor == "local" and self.ray_address:
            raise ValueError(
                f"executor='local' runs on this machine: it cannot take "
                f"ray_address={self.ray_address!r}; use executor='ray'"
            )
        return self


SECTIONS: dict[str, type[BaseModel]] = {
    "budget": BudgetSettings,
    "memory": MemorySettings,
    "measurement": MeasurementSettings,
    "finishing": FinishingSettings,
    "study": StorageSettings,
    "cluster": ClusterSettings,
}


class SearchSettings(BaseModel):
    """Inputs of ``autotune search`` / ``autotune.tune``, apart from the workload."""

    model_config = _FROZEN

    global_batch_size: int | None = Field(
        None,
        ge=1,
        description="Samples per optimizer step over all ranks; never changed. Default: the "
        "model module's autotune_global_batch_size, else 32 (the output says which was used).",
    )
    max_grad_norm: float | None = Field(
        None,
        gt=0,
        description="Clip the gradients' total norm to this before every optimizer step of "
        "every trial, as your training does: training semantics, never changed (default: no "
        "clipping).",
    )
    space: str = Field("default", description="A search-space file, or a name in search_spaces/.")
    budget: BudgetSettings = Field(default_factory=BudgetSettings)
    memory: MemorySettings = Field(default_factory=MemorySettings)
    measurement: MeasurementSettings = Field(default_factory=MeasurementSettings)
    finishing: FinishingSettings = Field(default_factory=FinishingSettings)
    study: StorageSettings = Field(default_factory=StorageSettings)
    cluster: ClusterSettings = Field(default_factory=ClusterSettings)

    @model_validator(mode="after")
    def _check_budgets(self) -> SearchSettings:
        if self.budget.trials is None and self.budget.time_budget_s is None:
            raise ValueError("give a trial budget (trials) or a time budget (time_budget_s)")
        return self

    def flat(self) -> dict[str, Any]:
        """Every field by its flat name, as ``make_settings`` and ``tune()`` take them."""
        values = {name: getattr(self, name) for name in TOP_SETTINGS}
        for section in SECTIONS:
            values.update(getattr(self, section).model_dump())
        return values

    def replace(self, **flat: Any) -> SearchSettings:
        """These settings with some fields, by flat name, changed."""
        return make_settings({**self.flat(), **flat})


TOP_SETTINGS = tuple(name for name in SearchSettings.model_fields if name not in SECTIONS)
"""Settings of no section (the global batch, the clipping, the space)."""

FLAT_NAMES = {name: section for section, model in SECTIONS.items() for name in model.model_fields}
"""Flat field name -> its section."""


def make_settings(values: dict[str, Any]) -> SearchSettings:
    """Settings from flat names (``trials=40``) and/or sections; one-line errors."""
    nested: dict[str, Any] = {}
    top = set(TOP_SETTINGS)
    for name, value in values.items():
        if name in top or name in SECTIONS:
            nested[name] = value if name in top else {**nested.get(name, {}), **value}
        elif name in FLAT_NAMES:
            nested.setdefault(FLAT_NAMES[name], {})[name] = value
        else:
            known = ", ".join([*sorted(top), *FLAT_NAMES])
            raise ConfigError(
                f"invalid search settings: unknown setting {name!r}; known settings: {known}"
            )
    return validated(SearchSettings, nested, "search settings", flat=True)
