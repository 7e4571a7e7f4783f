"""The pruning benchmark's pieces (scripts/bench_pruning.py): its hopeless model
(workloads.hopeless) and its table (autotune.bench.pruning)."""

from __future__ import annotations

import pytest
import torch

from autotune.bench import pruning as bench
from workloads import hopeless


def _body_calls(model: torch.nn.Module, x: torch.Tensor, amp: torch.dtype | None) -> int:
    calls = []
    handle = model.body.register_forward_hook(lambda *_: calls.append(1))
    try:
        if amp is None:
            model(x)
        else:
            with torch.autocast("cpu", dtype=amp):
                model(x)
    finally:
        handle.remove()
    return len(calls)


def test_the_hopeless_model_repeats_its_work_only_under_fp16() -> None:
    model = hopeless.Repeats(width=16, depth=2)
    x = torch.randn(4, 16)
    assert _body_calls(model, x, None) == 1
    assert _body_calls(model, x, torch.bfloat16) == 1
    assert _body_calls(model, x, torch.float16) == hopeless.REPEATS
    with torch.autocast("cpu", dtype=torch.float16):
        repeated = model(x)
    assert repeated.dtype == torch.float32  # the repeats run in fp32: only the work changes
    torch.testing.assert_close(repeated, model(x))
    repeated.sum().backward()  # the backward runs through every repeat
    assert model.head.weight.grad is not None


def _run(
    status: str, speed: float, wall: float, steps: int = 10, overhead: float = 0.5
) -> dict[str, object]:
    return {
        "status": status,
        "samples_per_s": speed,
        "measured_steps": steps,
        "measured_s": steps * 32 / speed,
        "wall_s": wall,
        "overhead_s": overhead,
    }


def test_a_row_measures_the_slowdown_and_the_cost_in_baseline_trials() -> None:
    runs = {
        "baseline": [_run("ok", 1000, 4.0), _run("ok", 1100, 5.0), _run("ok", 900, 6.0)],
        "pruned": [_run("pruned", 12, 7.5, steps=1)],
        "unpruned": [_run("ok", 10, 40.0)],
        "after": [_run("ok", 1000, 4.0, overhead=0.4)],  # the same gang: nothing to charge
    }
    row = bench.summarise("x", runs, judged=True)
    assert row["slowdown"] == pytest.approx(100.0)
    assert row["baseline_wall_s"] == 5.0 and row["baseline_step_s"] == pytest.approx(0.032)
    assert row["pruned_cost_in_baseline_trials"] == pytest.approx(1.5)
    assert row["met"] is True and row["target"] == "<= 2 baseline trials"
    over = {**runs, "pruned": [_run("pruned", 12, 10.5, steps=1)]}
    assert bench.summarise("x", over, judged=True)["met"] is False  # 2.1 baseline trials
    cut = {**runs, "after": [_run("ok", 1000, 7.0, overhead=3.5)]}  # fresh ranks: 3 s more
    row = bench.summarise("x", cut, judged=True)
    assert row["restart_charged_s"] == pytest.approx(3.0)
    assert row["pruned_cost_in_baseline_trials"] == pytest.approx((7.5 + 3.0) / 5.0)
    assert row["met"] is False
    not_stopped = {**runs, "pruned": [_run("ok", 10, 7.5)]}
    assert bench.summarise("x", not_stopped, judged=True)["met"] is False
    assert bench.summarise("x", runs, judged=False)["met"] is None
    milder = {**runs, "unpruned": [_run("ok", 20, 20.0)]}  # 50x: proves less than the target
    row = bench.summarise("x", milder, judged=True)
    assert row["met"] is None and "under 100x" in row["target"]
