"""What a search is asked to do: budgets, memory limit, where to store it. Validated at the edge."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from autotune.errors import validated
from autotune.units import parse_bytes


class SearchSettings(BaseModel):
    """Inputs of ``autotune search`` / ``autotune.tune``, apart from the workload."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    global_batch_size: int = Field(ge=1, description="Training semantics; never changed.")
    memory_budget: str | int | float = Field(
        0.9,
        description="Per-device memory budget: bytes or a size ('20GiB'), or a fraction of one "
        "device's memory (0.9). On CPU the budget covers all ranks of a trial together.",
    )
    safety_margin: float = Field(
        0.1, ge=0, lt=1, description="Share of the budget kept free: peak <= budget * (1 - m)."
    )
    trials: int | None = Field(20, ge=1, description="Measured trials (the baseline included).")
    time_budget_s: float | None = Field(None, gt=0, description="Stop proposing after this.")
    space: str = Field("default", description="A search-space file, or a name in search_spaces/.")
    devices: int | None = Field(None, ge=1, description="Devices to consider (default: all).")
    device: Literal["auto", "cpu", "cuda"] = "auto"
    storage: str = Field("autotune.db", description="A file path or an Optuna storage URL.")
    study_name: str | None = Field(None, description="Default: derived from model and batch.")
    new_study: bool = Field(False, description="Start over even if the fingerprint differs.")
    ray_address: str | None = Field(None, description="An existing Ray cluster; else local.")
    concurrency: int | None = Field(
        None, ge=1, description="Trials at once (default: 1 on CPU, as devices allow on GPU)."
    )
    warmup_steps: int = Field(2, ge=1)
    measured_steps: int = Field(8, ge=2)
    trial_timeout_s: float = Field(300.0, gt=0)
    top_k: int = Field(3, ge=1, description="Best configurations re-measured at the end.")
    remeasure: int = Field(2, ge=0, description="Extra measurements of each of the top k.")
    verify_factor: int = Field(4, ge=1, description="Verification run: this many times longer.")
    enforce_memory_budget: bool = Field(
        False, description="Also impose the budget as a hard per-rank limit (trials over it OOM)."
    )
    seed: int = 0

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

    @model_validator(mode="after")
    def _check_budgets(self) -> SearchSettings:
        if self.trials is None and self.time_budget_s is None:
            raise ValueError("give a trial budget (trials) or a time budget (time_budget_s)")
        return self

    def memory_budget_bytes(self, device_memory_bytes: int) -> int:
        """The budget in bytes, given one device's memory."""
        value = self.memory_budget
        if isinstance(value, float):
            return int(value * device_memory_bytes)
        return value if isinstance(value, int) else parse_bytes(value)


def make_settings(values: dict[str, object]) -> SearchSettings:
    return validated(SearchSettings, values, "search settings")
