"""End-to-end searches: Ray with logical resources, 2 gloo ranks, real trials."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

import autotune
from autotune.recommendation import Recommendation
from autotune.report import format_recommendation

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("ray_cluster", "probe_cache")]

QUICK = {
    "warmup_steps": 1,
    "measured_steps": 3,
    "devices": 2,
    "target_interval": 0,
    "race_rounds": 2,
    "top_k": 2,
    "verify_factor": 2,
}


def _space(tmp_path: Path, text: str) -> str:
    path = tmp_path / "space.yaml"
    path.write_text(text)
    return str(path)


def _assert_never_measured_twice(recommendation: Recommendation) -> None:
    measured = [
        t.config.key()
        for t in recommendation.trials
        if t.config is not None
        and t.role in ("baseline", "search")
        and t.status not in ("duplicate", "skipped", "invalid")
    ]
    assert max(Counter(measured).values()) == 1


def test_search_returns_a_verified_feasible_recommendation(tmp_path: Path) -> None:
    recommendation = autotune.tune(
        "tests.fixtures.models:Small",
        global_batch_size=32,
        space="quick",
        trials=6,
        memory_budget="16GiB",
        storage=str(tmp_path / "s.db"),
        **QUICK,
    )
    assert recommendation.memory_used_bytes <= recommendation.memory_limit_bytes
    assert recommendation.memory_confirmed and recommendation.verification is not None
    error = recommendation.verification_error
    assert error is not None
    tolerance = recommendation.throughput_tolerance
    if recommendation.spread > tolerance:  # agreement on a noisy machine proves nothing
        assert recommendation.throughput_verdict == "too noisy"
    else:
        assert recommendation.throughput_verdict == (
            "confirmed" if abs(error) <= tolerance else "not confirmed"
        )
    assert recommendation.throughput_confirmed == (recommendation.throughput_verdict == "confirmed")
    assert recommendation.verified == recommendation.throughput_confirmed
    assert recommendation.verification.measured_steps == 6
    rule = recommendation.verification.loss_rule  # what the trials trained on, said
    assert rule.startswith("cross-entropy against the integer targets")
    assert f"\nloss {rule}\n" in format_recommendation(recommendation)
    assert recommendation.baseline is not None and recommendation.baseline.samples_per_s
    assert recommendation.baseline.config is not None
    assert recommendation.baseline.config.parallel == "ddp"
    assert recommendation.baseline_samples_per_s is not None
    assert recommendation.speedup is not None and recommendation.speedup > 0
    raced = [t for t in recommendation.trials if t.role == "race"]
    # the winner ran in both rounds of the race, and so did the baseline (it stays 3 rounds)
    assert len(recommendation.samples_per_s_runs) == 2
    baseline_rounds = {t.race_round for t in raced if t.config == recommendation.baseline.config}
    assert baseline_rounds == {1, 2}
    if recommendation.config != recommendation.baseline.config:  # a paired speed-up interval
        assert recommendation.speedup_low is not None and recommendation.speedup_high is not None
        assert recommendation.speedup_low <= recommendation.speedup <= recommendation.speedup_high
    roles = Counter(t.role for t in recommendation.trials)
    assert roles["baseline"] == 1 and roles["verify"] >= 1 and roles["race"] >= 2
    assert sum(t.status == "ok" for t in recommendation.trials if t.role == "search") >= 3
    _assert_never_measured_twice(recommendation)
    assert (
        any(e.knob == "comm_hook" or e.knob == "parallel" for e in recommendation.exclusions)
        or recommendation.exclusions == []
    )


def test_a_crash_and_a_hang_do_not_stop_the_search(tmp_path: Path) -> None:
    space = _space(tmp_path, "parallel: [ddp]\nworld_size: [2]\namp: ['off', fp16, bf16]\n")
    recommendation = autotune.tune(
        "tests.fixtures.search_models:AmpFaults",
        global_batch_size=16,
        space=space,
        trials=3,
        memory_budget="16GiB",
        storage=str(tmp_path / "s.db"),
        trial_timeout_s=20,
        **QUICK,
    )
    by_amp = {
        t.config.amp: t
        for t in recommendation.trials
        if t.role == "search" and t.config is not None and t.status != "duplicate"
    }
    assert by_amp["bf16"].status == "crashed"
    # The hang is a step that never ends: measured against the incumbent, it is cut as hopeless
    # once it has run past the pruning limit, without waiting for timeout_s.
    assert by_amp["fp16"].status == "pruned"
    assert "warm-up step 1 still running after" in by_amp["fp16"].message
    assert recommendation.config.amp == "off"
    assert recommendation.memory_confirmed


def test_oom_is_infeasible_and_the_recommendation_fits(tmp_path: Path) -> None:
    space = _space(
        tmp_path,
        "parallel: [ddp]\nworld_size: [2]\ngrad_accum_steps: [1, 2, 4]\n"
        "checkpoint_segments: [0, 1]\n",
    )
    recommendation = autotune.tune(
        "tests.fixtures.search_models:BatchHungry",
        global_batch_size=16,
        space=space,
        trials=4,
        # 6 GiB a rank: 8 samples (8 GiB reserved) run out, 4 fit under any process's own share
        memory_budget="12GiB",
        enforce_memory_budget=True,
        storage=str(tmp_path / "s.db"),
        **QUICK,
    )
    ooms = [t for t in recommendation.trials if t.status == "oom"]
    assert ooms and all(t.feasible is False for t in ooms)
    baseline = recommendation.baseline
    assert baseline is not None and baseline.config is not None
    assert baseline.config.grad_accum_steps == 2  # accumulation only as far as needed to fit
    assert recommendation.config.micro_batch_size <= 4
    assert recommendation.memory_used_bytes <= recommendation.memory_limit_bytes

    import optuna

    study = optuna.load_study(
        study_name=recommendation.study_name, storage=f"sqlite:///{tmp_path / 's.db'}"
    )
    told = [t for t in study.trials if t.user_attrs["autotune:record"]["status"] == "oom"]
    assert told and all(t.state == optuna.trial.TrialState.COMPLETE for t in told)
    assert all(t.system_attrs["constraints:memory"] > 0 for t in told)


def test_a_short_search_over_a_stream_without_a_given_global_batch(tmp_path: Path) -> None:
    space = _space(tmp_path, "parallel: [single, ddp]\nworld_size:\n  choices: [2]\n"
                   "  when: {parallel: [ddp]}\nnum_workers: [0, 1]\n")  # fmt: skip
    recommendation = autotune.tune(
        "tests.fixtures.streams:Model",
        space=space,
        trials=3,
        memory_budget="16GiB",
        storage=str(tmp_path / "s.db"),
        **QUICK,
    )
    assert recommendation.config.global_batch_size == 32
    assert recommendation.global_batch_source.startswith("default 32")
    ran = [t for t in recommendation.trials if t.status == "ok"]
    assert any(t.config and t.config.parallel == "ddp" for t in ran)


@pytest.mark.parametrize(
    ("predict_memory", "statuses"),
    # the memory trace sees the head left without a gradient before any trial; without it,
    # the first DDP trial fails and teaches the search
    [(True, ["ok"]), (False, ["error", "ok"])],
)
def test_a_search_over_a_model_with_an_unused_head_runs_its_ddp_trials(
    tmp_path: Path, predict_memory: bool, statuses: list[str]
) -> None:
    recommendation = autotune.tune(
        "tests.fixtures.streams:Unused",
        global_batch_size=16,
        space=_space(tmp_path, "parallel: [ddp]\nworld_size: [2]\nnum_workers: [0, 1]\n"),
        trials=2,
        memory_budget="16GiB",
        storage=str(tmp_path / "s.db"),
        predict_memory=predict_memory,
        **QUICK,
    )
    baselines = [t for t in recommendation.trials if t.role == "baseline"]
    assert [b.status for b in baselines] == statuses
    assert baselines[-1].config is not None and baselines[-1].config.find_unused_parameters
    assert recommendation.config.find_unused_parameters  # carried into what users run
