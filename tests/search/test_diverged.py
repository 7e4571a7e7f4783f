"""A trial whose loss was not finite: carried through JSON as the number it was, recorded as
training that diverges, never recommended; a diverging baseline stops the search."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from autotune.api import run_trial
from autotune.config import TrainConfig
from autotune.errors import SearchError
from autotune.report import format_study, format_trial
from autotune.result import RankReport, TrialResult
from autotune.search.log import DIVERGES, to_record
from tests.search.fakes import FakeExecutor, make_tuner, ok

CONFIG = TrainConfig(global_batch_size=16, device="cpu")


def _diverged(config: TrainConfig) -> TrialResult:
    losses = [2.0, float("nan"), float("inf")]
    report = RankReport(rank=0, status="ok", losses=losses, peak_memory_bytes=100 * 2**20)
    return TrialResult(
        config=config, status="ok", samples_per_s=300.0, loss_finite=False, ranks=[report]
    )


def test_a_loss_that_is_not_finite_survives_json_and_is_said_where() -> None:
    # A rank's report of NaN losses was written null and failed to read back: a pydantic
    # ValidationError ended a search (PowerSGD had turned a diffusion model's loss to NaN).
    result = _diverged(CONFIG)
    text = result.model_dump_json()
    assert '"NaN"' in text and '"Infinity"' in text  # standard JSON: other tools read it
    back = TrialResult.model_validate_json(text)
    assert math.isnan(back.ranks[0].losses[1]) and back.ranks[0].losses[2] == math.inf
    assert back.diverged == ("rank 0's loss was nan at optimizer step 2 of 3 (warm-up included)")
    assert ok(CONFIG, 1.0, 1.0).diverged is None
    record = to_record(3, "search", result, "cpu", 2**30)
    assert record.status == "error" and not record.fits
    assert record.message == f"{back.diverged}: {DIVERGES}"


def test_a_configuration_that_diverges_is_never_recommended(tmp_path: Path) -> None:
    def outcome(config: TrainConfig, before: int) -> TrialResult:
        if config.amp == "bf16":
            return _diverged(config)  # the fastest, were its training real
        return ok(config, 100.0 if config.num_workers == 0 else 110.0, 100)

    executor = FakeExecutor(outcome)
    space = {"parallel": ["single"], "amp": ["off", "bf16"], "num_workers": [0, 1]}
    storage = f"sqlite:///{tmp_path / 's.db'}"
    tuner = make_tuner(executor, space, trials=4, climb=True, storage=storage)
    recommendation = tuner.run([], storage, "test")
    assert executor.ran(amp="bf16") >= 1
    assert recommendation.config.amp == "off"
    first, *later = [r for r in tuner.log.records if r.config and r.config.amp == "bf16"]
    shown = format_study(storage, None).splitlines()
    row = next(i for i, line in enumerate(shown) if line.startswith(f"{first.number:>4}  "))
    assert " error " in shown[row] and shown[row + 1] == f"      why: {first.message}"
    assert first.status == "error" and first.message.endswith(DIVERGES)
    # and the lesson of a value that failed where the same configuration without it ran
    assert all(r.status == "skipped" and "amp=bf16" in r.message for r in later)


def test_a_baseline_that_diverges_stops_the_search_saying_so() -> None:
    tuner = make_tuner(FakeExecutor(lambda config, before: _diverged(config)), {"amp": ["off"]})
    with pytest.raises(SearchError, match=r"^the model does not train as given: the baseline "):
        tuner.baseline()


def test_a_trial_whose_loss_is_not_a_number_reports_it() -> None:
    result = run_trial(
        "tests.fixtures.diverging:Always",
        {"global_batch_size": 8, "device": "cpu"},
        input_shape=(8,),
        warmup_steps=1,
        measured_steps=2,
        target_interval=0,
    )
    assert result.status == "ok" and result.loss_finite is False
    assert result.diverged is not None and "loss was nan at optimizer step 1" in result.diverged
    assert f"  diverged      {result.diverged}: a search never" in format_trial(result)
