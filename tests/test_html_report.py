from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.bench.browser import find_chromium
from autotune.config import make_config
from autotune.html_report import render_html
from autotune.recommendation import Recommendation
from autotune.records import TrialRecord
from autotune.report import format_costs
from autotune.runner.platform import detect_platform

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "screenshot_report.py"


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


def test_report_interval_and_axis_values_are_shown() -> None:
    recommendation = _recommendation().model_copy(
        update={"samples_per_s_low": 140.0, "samples_per_s_high": 160.0}
    )
    page = render_html(recommendation)
    assert "150.0 [95%: 140.0-160.0] (2 race runs" in page  # as on the terminal
    assert ">0</text>" in page and ">150</text>" in page  # the y axis is labelled with values


@pytest.mark.skipif(find_chromium() is None, reason="no Chromium: apt install chromium")
def test_a_real_browser_renders_the_report_offline(tmp_path: Path) -> None:
    page = tmp_path / "report.html"
    page.write_text(render_html(_recommendation(), {"comm_hook": 0.8, "amp": 0.2}))
    assert _render(page, tmp_path) == 0
    seen = json.loads((tmp_path / "render.json").read_text())
    assert seen["plots"] == ["throughput against peak memory", "best so far over time"]
    assert seen["points"] == 3 and seen["fetched"] == []
    assert seen["screenshot_bytes"] > 10_000
    # the check can fail: a page that loads an image from the network is caught
    fetching = tmp_path / "fetching.html"
    fetching.write_text(
        page.read_text().replace("<h1>", '<img src="https://example.com/x.png"><h1>')
    )
    assert _render(fetching, tmp_path) == 1
    assert json.loads((tmp_path / "render.json").read_text())["fetched"] == [
        "https://example.com/x.png"
    ]


def _render(page: Path, out: Path) -> int:
    command = [sys.executable, str(SCRIPT), "--html", str(page), "--png", str(out / "r.png")]
    return subprocess.run(
        [*command, "--out", str(out / "render.json")], capture_output=True, timeout=300, check=False
    ).returncode


def test_the_recommendation_states_compile_time_apart_from_throughput() -> None:
    from autotune.report import format_recommendation

    base = _recommendation()
    config = base.config.model_copy(update={"compile": "default"})
    trials = [
        t.model_copy(update={"config": config, "compile_s": s})
        for t, s in zip(base.trials[1:3], (12.0, 14.0), strict=True)
    ]
    compiled = base.model_copy(update={"config": config, "trials": [base.trials[0], *trials]})
    assert compiled.compile_s == 13.0  # the median over the winner's trials
    text = format_recommendation(compiled)
    assert "torch.compile mode=default: compiling takes 13.0 s once per run" in text
    assert "13.0 s once per run" in render_html(compiled)
    hours = compiled.training_cost(5_400_000)["recommended"]["hours"]
    assert hours == pytest.approx((5_400_000 / 150.0 + 13.0) / 3600)
    assert "torch.compile" not in format_recommendation(base)


def test_a_compile_measured_in_processes_that_compiled_before_is_not_passed_off_as_a_runs() -> None:
    # Reused ranks keep Inductor's imports and kernels: a Transformer encoder's recommended
    # config measured 0.4 s where its search's first compile, in a fresh rank, took 26.5 s.
    from autotune.report import format_recommendation

    base = _recommendation()
    config = base.config.model_copy(update={"compile": "default"})
    other = base.trials[1].config.model_copy(update={"compile": "default", "amp": "bf16"})
    first = base.trials[1].model_copy(update={"config": other, "compile_s": 26.5})
    warm = base.trials[2].model_copy(
        update={"config": config, "compile_s": 0.4, "compiled_before": True}
    )
    compiled = base.model_copy(update={"config": config, "trials": [base.trials[0], first, warm]})
    assert compiled.compiled_before and compiled.compile_s == 0.4
    assert compiled.fresh_compile == first and compiled.run_compile_s == 26.5
    text = format_recommendation(compiled)
    assert "compiling took 0.4 s in its trials, whose processes had compiled before" in text
    assert f"first compile in fresh processes took 26.5 s (#{first.number}, " in text
    assert "once per run" not in text.split("torch.compile", 1)[1].split("\n")[0]
    hours = compiled.training_cost(5_400_000)["recommended"]["hours"]
    assert hours == pytest.approx((5_400_000 / 150.0 + 26.5) / 3600)
    fresh_too = warm.model_copy(update={"compiled_before": False, "compile_s": 9.0})
    own = compiled.model_copy(update={"trials": [base.trials[0], first, warm, fresh_too]})
    assert not own.compiled_before and own.compile_s == 9.0  # its fresh trials only


def test_a_baseline_that_wins_is_said_to_win() -> None:
    from autotune.report import format_recommendation

    base = _recommendation()
    assert base.baseline is not None and base.baseline.config is not None
    kept = base.model_copy(update={"config": base.baseline.config})
    assert "the baseline itself is the fastest" in format_recommendation(kept)
    assert "the baseline itself" not in format_recommendation(base)


def test_the_report_names_the_runner_up_and_whether_the_race_told_them_apart() -> None:
    from autotune.recommendation import RunnerUp

    r = _recommendation()
    assert "runner-up" not in render_html(r)  # none finished the race: nothing claimed
    assert r.baseline is not None and r.baseline.config is not None
    other = r.baseline.config.model_copy(update={"comm_hook": "none", "num_workers": 1})
    close = RunnerUp(config=other, ratio=0.97, ratio_low=0.9, ratio_high=1.04, rounds=4)
    page = render_html(r.model_copy(update={"runner_up": close}))
    assert "<td>runner-up</td>" in page and "workers=1" in page
    assert "0.97x" in page and "[90%: 0.90-1.04]" in page and "too close to call" in page


def test_a_baseline_over_the_limit_is_said_not_to_fit_where_its_speed_up_is_shown() -> None:
    # Seen on a user's T5 under a tight budget: the baseline measured over the limit at every
    # accumulation tried, and the table showed its 1.4 GiB and the 1.33x over it unmarked.
    from autotune.report import format_recommendation

    r = _recommendation()
    assert r.baseline is not None
    assert "does not fit" not in format_recommendation(r) + render_html(r)
    over = r.baseline.model_copy(update={"memory_used_bytes": 4 << 30, "feasible": False})
    r = r.model_copy(update={"baseline": over, "baseline_memory_used_bytes": 4 << 30})
    text = format_recommendation(r)
    assert "4.0 GiB (over the limit)" in text
    assert (
        "the baseline does not fit: over the memory limit 3.0 GiB at accumulation 1, the last "
        "the search tried; its speed-up is over a configuration that does not fit"
    ) in text
    assert "over the limit" in render_html(r) and "does not fit" in render_html(r)


def test_a_recipe_that_went_over_the_limit_in_a_race_run_is_said_to_have() -> None:
    # A user's T5: the recipe fitted in its search trial (1,375 of 1,382 MiB) and measured
    # 1,505 MiB in the race, which left it; the output gave "1.01x" the recipe and no why.
    from autotune.report import format_recommendation

    r = _recommendation()
    recipe = r.config.model_copy(update={"num_workers": 1})
    runs = [
        TrialRecord(number=10, role="search", status="ok", config=recipe, samples_per_s=140.0,
                    memory_used_bytes=2 << 30, feasible=True),
        TrialRecord(number=11, role="race", status="ok", config=recipe, samples_per_s=139.0,
                    memory_used_bytes=7 << 29, feasible=False, race_round=1),
    ]  # fmt: skip
    fitting = r.model_copy(update={"recipe": recipe, "recipe_samples_per_s": 140.0,
                                   "speedup_over_recipe": 1.07})  # fmt: skip
    assert "went over" not in format_recommendation(fitting)
    r = fitting.model_copy(update={"trials": [*r.trials, *runs]})
    assert (
        "1.07x; the recipe went over the memory limit 3.0 GiB in 1 of its 2 runs (up to 3.5 GiB), "
        "so the race left it"
    ) in format_recommendation(r)


def test_the_loss_the_recommendation_was_verified_on_is_said_the_users_by_its_source() -> None:
    from autotune.report import format_recommendation
    from autotune.result import TrialResult

    base = _recommendation()
    rule = "cross-entropy against the integer targets; the output's scalar item 1 is left out"
    told = base.model_copy(
        update={"verification": TrialResult(config=base.config, status="ok", loss_rule=rule)}
    )
    assert f"\nloss {rule}\n" in format_recommendation(told)
    assert f"<td>loss</td><td>{rule.replace(chr(39), '&#x27;')}</td>" in render_html(told)
    unknown = TrialResult(config=base.config, status="ok")  # no run said where it came from
    users = told.model_copy(update={"verification": unknown})
    assert "\nloss " not in format_recommendation(users) and "<td>loss</td>" not in render_html(
        users
    )
    given = unknown.model_copy(update={"loss_source": "mymodel.py:autotune_loss"})
    named = told.model_copy(update={"verification": given})
    assert "\nloss yours, mymodel.py:autotune_loss\n" in format_recommendation(named)
    assert "<td>loss</td><td>yours, mymodel.py:autotune_loss</td>" in render_html(named)
