"""The memory-prediction benchmark's arithmetic: its CUDA grid and rows, without a GPU."""

from __future__ import annotations

from dataclasses import asdict, replace

import pytest

from autotune.bench.memory_prediction import (
    CUDA_GRIDS,
    GridPoint,
    errors,
    grid,
    grid_shape,
    measure_grid,
    rescored,
    unfinished,
)

MiB = 2**20


def test_one_gpu_s_grid_holds_single_ddp_and_fsdp_of_one_rank_and_no_workers() -> None:
    configs = grid(32, 2, devices=1, device="cuda")
    assert {(c.parallel, c.world_size) for c in configs} == {
        ("single", 1), ("ddp", 1), ("fsdp", 1)
    }  # fmt: skip
    assert all(c.device == "cuda" and c.num_workers == 0 for c in configs)
    assert len(configs) == 24  # 3 modes x 2 precisions x 2 checkpointings x 2 accumulations
    assert sum(c.num_workers == 2 for c in grid(32, 2)) == 1  # workers count on CPU only


def test_a_gpu_scale_model_s_cpu_grid_is_sized_for_a_cpu_box() -> None:
    # GPT-2 small at the H100's batch of 32 holds about 63 GiB: a CPU grid takes 4 sequences
    assert grid_shape("workloads.gpt:gpt2_124m", "cuda") == CUDA_GRIDS["workloads.gpt:gpt2_124m"]
    batch, segments = grid_shape("workloads.gpt:gpt2_124m", "cpu")
    assert batch <= 4 and segments == 12
    assert grid_shape("workloads.gpt:gpt_tiny", "cuda") == grid_shape(
        "workloads.gpt:gpt_tiny", "cpu"
    )


def _point(tensors: int, reserved: int, allocated: int) -> GridPoint:
    return GridPoint(
        config="c", status="ok", values={}, tensors_bytes=tensors * MiB,
        measured_bytes=reserved * MiB, workers=0, unsharded_bytes=0, trace_s=0.0, trial_s=0.0,
        device="cuda", allocated_bytes=allocated * MiB,
    )  # fmt: skip


def test_cuda_rows_are_judged_by_the_reserved_peak_and_say_how_far_tensors_are_from_allocated() -> (
    None
):
    # Reserved = 1.2 x the tensors + 100 MiB, learnt from the trials (tensors only before).
    points = [_point(t, int(1.2 * t) + 100, t + 5) for t in (500, 1000, 2000)]
    rows = errors(points)
    assert rows[0]["after_one"] == pytest.approx(0.0, abs=0.01)  # calibrated on itself
    assert all(abs(r["left_out"]) < 0.01 for r in rows)
    assert rows[0]["tensors_vs_allocated"] == pytest.approx(5 / 505)


def test_heap_pairs_fix_the_threshold_for_the_fixed_runs_alone_and_restore_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import os
    from types import SimpleNamespace

    from autotune.bench import memory_prediction
    from autotune.config import TrainConfig
    from autotune.runner.workload import WorkloadSpec

    seen: list[str | None] = []

    def trial(config: object, workload: object, options: object) -> SimpleNamespace:
        seen.append(os.environ.get(memory_prediction.MMAP_THRESHOLD_ENV))
        fixed = seen[-1] is not None
        return SimpleNamespace(status="ok", samples_per_s=5.0 if fixed else 10.0, fixed=fixed)

    monkeypatch.setattr(memory_prediction, "run_trial", trial)
    monkeypatch.setattr(  # the fixed heap's peak follows the tensors: lower
        memory_prediction, "memory_used", lambda r, device: (300 if r.fixed else 500) * MiB
    )
    monkeypatch.setenv(memory_prediction.MMAP_THRESHOLD_ENV, "123")  # the user's own, kept
    config = TrainConfig(global_batch_size=8, device="cpu")
    rows = memory_prediction.heap_pairs(
        WorkloadSpec(model="tests.fixtures.traced:Stack"), [config], 4 * MiB, repeats=2
    )
    assert seen == [None, str(4 * MiB)] * 2  # default first, then fixed, per repeat
    assert os.environ[memory_prediction.MMAP_THRESHOLD_ENV] == "123"
    (summary,) = memory_prediction.heap_summary(rows)
    assert summary["tensors_bytes"] > 0  # traced, as the prediction is
    assert summary["measured_bytes_default"] == 500 * MiB
    assert summary["measured_bytes_fixed"] == 300 * MiB
    assert (summary["samples_per_s_default"], summary["samples_per_s_fixed"]) == (10.0, 5.0)


def test_a_configuration_that_measured_nothing_is_reported_with_why_not_dropped() -> None:
    done = _point(100, 400, 120)
    timed_out = replace(
        done, config="slow", status="timed_out", measured_bytes=None, message="300 s"
    )
    assert unfinished([done, timed_out]) == [
        {"config": "slow", "status": "timed_out", "message": "300 s"}
    ]
    assert [r["config"] for r in errors([done, timed_out])] == ["c"]  # scored: what measured


def test_fresh_peaks_runs_each_one_device_configuration_in_turn_with_the_grid_window(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from autotune.bench import memory_runs
    from autotune.result import RankReport, TrialResult

    ran = []

    def trial(config, workload, options):  # type: ignore[no-untyped-def]
        ran.append((config.summary(), options.measured_steps, options.warmup_steps))
        peak = (500 + 10 * len(ran)) * MiB
        report = RankReport(rank=0, status="ok", peak_memory_bytes=peak)
        return TrialResult(config=config, status="ok", ranks=[report])

    monkeypatch.setattr(memory_runs, "run_trial", trial)
    rows = memory_runs.fresh_peaks("workloads.gpt:gpt_tiny", rounds=3)
    assert [r["config"] for r in rows] == [
        "singlex1 amp=off accum=1 mbs=32 workers=0",
        "singlex1 amp=off ckpt=4 accum=1 mbs=32 workers=0",
    ]
    assert [c for c, _, _ in ran] == [rows[0]["config"], rows[1]["config"]] * 3  # in turn
    assert {(m, w) for _, m, w in ran} == {(2, 1)}  # the grid's own window
    assert rows[0]["peaks_bytes"] == [510 * MiB, 530 * MiB, 550 * MiB]
    assert rows[0]["spread"] == pytest.approx(40 / 510)


def test_every_repeat_set_is_configurations_a_trial_accepts() -> None:
    from autotune.bench.memory_runs import REPEAT_SETS
    from autotune.config import TrainConfig

    for name, values in REPEAT_SETS.items():
        configs = [TrainConfig(global_batch_size=32, device="cpu", **v) for v in values]
        assert len({c.summary() for c in configs}) == len(configs), name


@pytest.mark.slow  # about 14 s: three real trials; the GPU session's path, run with -m slow
def test_a_grid_measured_without_tracing_is_traced_and_scored_afterwards() -> None:
    # A lent GPU's minutes go to the trials (--measure-only); any machine traces and scores the
    # saved rows later (--rescore), with the same numbers as a grid traced as it ran.
    from autotune.runner.workload import WorkloadSpec
    from autotune.search.memory_model import MemoryModel

    model = "workloads.mlp:mlp_tiny"
    configs = grid(32, 2, devices=2, amps=("off",))[:3]
    points = measure_grid(WorkloadSpec(model=model), configs, trace=False)
    assert all(p.tensors_bytes is None and p.measured_bytes for p in points)
    rows = rescored(model, [asdict(p) for p in points])
    assert len(rows) == 3 and all(r["tensors_bytes"] > 0 for r in rows)
    assert [r["measured_bytes"] for r in rows] == [p.measured_bytes for p in points]
    traced = MemoryModel(WorkloadSpec(model=model), "cpu")
    for row, config in zip(rows, configs, strict=True):  # each row traced as its configuration
        assert row["tensors_bytes"] == sum(traced.device_tensors(config).values())
        assert "left_out" in row and "before_any" in row
