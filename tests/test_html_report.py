from __future__ import annotations

from autotune.config import make_config
from autotune.html_report import render_html
from autotune.recommendation import Recommendation
from autotune.records import TrialRecord
from autotune.report import format_costs
from autotune.runner.platform import detect_platform


def _recommendation() -> Recommendation:
    base = make_config(
        {"global_batch_size": 32, "parallel": "ddp", "world_size": 2, "device": "cpu"}
    )
    best = make_config(
        {
            "global_batch_size": 32,
            "parallel": "ddp",
            "world_size": 2,
            "device": "cpu",
            "comm_hook": "fp16",
        }
    )
    big = make_config({"global_batch_size": 32, "device": "cpu"})
    trials = [
        TrialRecord(
            number=0,
            role="baseline",
            status="ok",
            config=base,
            samples_per_s=100.0,
            memory_used_bytes=1 << 30,
            feasible=True,
            measured_s=1.0,
        ),
        TrialRecord(
            number=1,
            role="search",
            status="ok",
            config=best,
            samples_per_s=150.0,
            memory_used_bytes=1 << 30,
            feasible=True,
            measured_s=1.0,
        ),
        TrialRecord(
            number=2,
            role="search",
            status="ok",
            config=big,
            samples_per_s=180.0,
            memory_used_bytes=5 << 30,
            feasible=False,
            measured_s=1.0,
        ),
        TrialRecord(
            number=3,
            role="search",
            status="crashed",
            config=big,
            message="rank 1: killed by SIGABRT <in forward>",
        ),
    ]
    return Recommendation(
        config=best,
        samples_per_s=150.0,
        samples_per_s_runs=[150.0, 148.0],
        spread=0.01,
        memory_used_bytes=1 << 30,
        memory_budget_bytes=4 << 30,
        memory_limit_bytes=3 << 30,
        baseline=trials[0],
        baseline_samples_per_s=100.0,
        speedup=1.5,
        trials=trials,
        platform=detect_platform("cpu"),
        storage="autotune.db",
        study_name="s",
        model="pkg:Net",
    )


def test_report_holds_the_winner_the_plots_and_every_trial() -> None:
    page = render_html(_recommendation(), {"comm_hook": 0.8, "amp": 0.2})
    assert page.startswith("<!DOCTYPE html>") and "http" not in page.replace(
        'xmlns="http://www.w3.org/2000/svg"', ""
    )  # nothing to fetch: readable offline
    assert page.count("<svg") == 2
    assert "memory limit" in page  # the budget line on the scatter plot
    assert '<tr class="winner">' in page and "hook=fp16" in page
    assert "1.50x" in page
    assert "&lt;in forward&gt;" in page  # reasons are escaped
    assert "comm_hook" in page and "importance" in page
    # the evaluator named is the one that ran (Optuna 5's default is PED-ANOVA, not fANOVA)
    from autotune.html_report import IMPORTANCE_METHOD

    assert f"importance ({IMPORTANCE_METHOD})" in page and "fANOVA" not in page
    assert "PedAnovaImportanceEvaluator" in IMPORTANCE_METHOD
    assert page.count("<tr") >= 4 + 6


def test_time_and_cost_to_train() -> None:
    text = format_costs(_recommendation(), 5_400_000, 2.0)
    # 5.4M samples at 150/s = 10 h on 2 devices = 20 device-hours = 40.00
    assert "recommended  10.00 h on the devices (20.00 device-hours, cost 40.00)" in text
    assert "baseline     15.00 h" in text
