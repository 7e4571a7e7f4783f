"""The search with the memory model on: what is predicted not to fit is never run, the baseline
takes its accumulation from the prediction, and every trial that ran carries its prediction."""

from __future__ import annotations

import re
from typing import Any

import pytest

from autotune.config import TrainConfig
from autotune.errors import SearchError
from autotune.result import TrialResult
from autotune.runner import memory
from autotune.runner.workload import WorkloadSpec
from autotune.search import memory_gate, step_traces
from autotune.search.calibration import CPU_HEAP_SHARE
from autotune.search.memory_model import MemoryModel, device_parts
from autotune.search.progress import Reporter
from autotune.search.tuner import Tuner
from tests.search.fakes import FakeExecutor, MiB, Outcome, make_tuner, ok

STACK = WorkloadSpec(model="tests.fixtures.traced:Stack")
SPACE = {
    "parallel": ["ddp"],
    "world_size": [2],
    "grad_accum_steps": [1, 2, 4, 8],
    "checkpoint_segments": [0, 4],
    "amp": ["off", "bf16"],
}
PROCESS_MIB = 300.0
TRACES = MemoryModel(STACK, "cpu")


@pytest.fixture(autouse=True)
def _bare_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    """The model's first guess at a rank's process, a measured bare rank, as these scripted
    trials' process: the measurement is the machine's (322 MiB with torch 2.13's CPU build, 687
    with 2.14's CUDA build on one 2-core box), and these tests are about the search."""
    monkeypatch.setattr(memory, "start_bare_rank", lambda *args: None)
    monkeypatch.setattr(memory, "bare_rank_bytes", lambda *args: int(PROCESS_MIB * MiB))
    monkeypatch.setattr(memory, "compile_share_bytes", lambda *args: 0)
    monkeypatch.setattr(memory, "worker_share_bytes", lambda *args: 0)
    monkeypatch.setattr(memory, "epoch_copy", lambda *args: (0, True))


def truth_mib(config: TrainConfig) -> float:
    """What the scripted trial 'measures': both ranks' tensors as traced, with the heap's share
    the CPU prior takes, and their process (one trial then fixes the one unknown, the offset)."""
    peak = TRACES.tensor_peak(config)
    assert peak is not None
    tensors = sum(device_parts(peak, config).values()) * (1 + CPU_HEAP_SHARE)
    return 2 * (tensors / MiB + PROCESS_MIB)


def measured(config: TrainConfig, before: int) -> TrialResult:
    return ok(config, 1000.0 / config.grad_accum_steps, truth_mib(config))


def test_configurations_predicted_not_to_fit_are_never_run() -> None:
    mid = TrainConfig(
        global_batch_size=16384, parallel="ddp", world_size=2, grad_accum_steps=4, device="cpu"
    )
    limit = truth_mib(mid) * 1.02  # micro-batch 2048 in fp32 fits; 4096 and 8192 do not
    executor = FakeExecutor(measured)
    tuner = make_tuner(
        executor,
        SPACE,
        limit_mib=limit,
        workload=STACK,
        predict_memory=True,
        global_batch_size=16384,
        trials=8,
    )
    baseline = tuner.baseline()
    assert baseline.config is not None and baseline.fits
    assert len(executor.runs) == 1  # its accumulation came from the prediction: no OOM first
    tuner.search()
    ran = [truth_mib(r.config) for r in executor.runs]
    margin = 0.5  # the widest a prediction's error is ever taken to be
    assert all(m <= limit / (1 - margin) for m in ran)
    skipped = [r for r in tuner.log.records if r.status == "skipped"]
    assert any(r.message.startswith("predicted not to fit") for r in skipped)
    for record in skipped:
        assert record.memory_used_bytes is None and record.predicted_memory_bytes
        assert truth_mib(record.config) > limit  # nothing that fits was skipped
    for record in tuner.log.records:
        if record.status == "ok":  # predicted before it ran, measured after, both kept
            assert record.predicted_memory_source.startswith("fake-tensor trace")
            assert record.prediction_error is not None
    calibrated = [r for r in tuner.log.records if r.status == "ok"][-1]
    assert abs(calibrated.prediction_error) < 0.05  # once calibrated, the model is exact here


def test_after_a_baseline_over_the_limit_its_accumulation_comes_from_the_calibrated_model() -> None:
    # The process is far larger than the bare-rank first guess, so the first baseline runs and
    # does not fit. That trial calibrates the model: the next accumulation is the least predicted
    # to fit (8, not 2 and 4 first), and where none is, the one trial over the limit is all.
    process_mib = 1000.0

    def heavy_mib(config: TrainConfig) -> float:
        return truth_mib(config) + 2 * (process_mib - PROCESS_MIB)

    def heavy(config: TrainConfig, before: int) -> TrialResult:
        return ok(config, 1000.0, heavy_mib(config))

    configs = {
        a: TrainConfig(global_batch_size=16384, parallel="ddp", world_size=2,
                       grad_accum_steps=a, device="cpu")
        for a in (4, 8)
    }  # fmt: skip
    # Accumulation 8 is the least that fits; below the process alone, nothing fits.
    limit = (heavy_mib(configs[4]) + heavy_mib(configs[8])) / 2
    for limit_mib, expected in ((limit, [1, 8]), (2 * process_mib * 0.99, [1])):
        executor = FakeExecutor(heavy)
        tuner = make_tuner(
            executor,
            {**SPACE, "checkpoint_segments": [0], "amp": ["off"]},
            limit_mib=limit_mib,
            workload=STACK,
            predict_memory=True,
            global_batch_size=16384,
        )
        baseline = tuner.baseline()
        assert [r.config.grad_accum_steps for r in executor.runs] == expected
        assert baseline.fits == (expected[-1] == 8)


@pytest.mark.parametrize(
    ("space", "ranks"),
    [({}, 2), ({"parallel": ["single", "ddp"], "world_size": [1, 2]}, 1)],
)
def test_a_limit_below_what_the_fewest_ranks_hold_without_tensors_runs_nothing(
    space: dict[str, Any], ranks: int
) -> None:
    # A 1 KiB budget ran its baseline, then turned 200 proposals down one by one (a minute),
    # before it said that nothing fits.
    below = ranks * PROCESS_MIB * 0.9
    executor = FakeExecutor(measured)
    tuner = make_tuner(
        executor,
        {**SPACE, **space},
        limit_mib=below,
        workload=STACK,
        predict_memory=True,
        global_batch_size=16384,
    )
    with pytest.raises(SearchError) as raised:
        tuner.run([], "s.db", "s")
    assert executor.runs == [] and tuner.log.records == []
    text = str(raised.value)
    assert f"the fewest ranks the space runs ({ranks}) hold {ranks * PROCESS_MIB:,.0f} MiB" in text
    assert "no trial was run" in text
    # at the floor, trials tell: the process may measure a little lower than its first run
    at = make_tuner(
        FakeExecutor(measured), {**SPACE, **space}, limit_mib=ranks * PROCESS_MIB * 0.96,
        workload=STACK, predict_memory=True, global_batch_size=16384,
    )  # fmt: skip
    at._stop_if_nothing_can_fit()


class _Phases(Reporter):
    def __init__(self) -> None:
        self.lines: list[str] = []

    def phase(self, text: str) -> None:
        self.lines.append(text)


def _said_while_predicting(model: str, traces: bool = False) -> tuple[list[str], bool]:
    """What a search says while predicting two configurations of ``model`` (with ``traces``,
    the steps it traces too), and whether a prediction came from the trace."""
    tuner = make_tuner(
        FakeExecutor(measured),
        SPACE,
        workload=WorkloadSpec(model=model),
        predict_memory=True,
        global_batch_size=64,
    )
    tuner.reporter = phases = _Phases()
    configs = [TrainConfig(global_batch_size=64, grad_accum_steps=k, device="cpu") for k in (1, 2)]
    predictions = [tuner.gate.predict(c) for c in configs]
    said = [line for line in phases.lines if traces or "tracing a step" not in line]
    return said, all(p is not None for p in predictions)


@pytest.mark.parametrize(("said_from_s", "said"), [(1e9, 1), (0.0, 2)])
def test_a_search_says_the_steps_it_traces_where_the_wait_shows(
    monkeypatch: pytest.MonkeyPatch, said_from_s: float, said: int
) -> None:
    # A GRU over 120 frames unrolls into ~22,000 ops a step under fake tensors: each trace took
    # 6-12 s in a search of it, said nowhere while no trial ran. The first trace is said; the
    # next only after one that took TRACE_SAID_S or more.
    monkeypatch.setattr(step_traces, "_TRACED", {})  # traced here, not by an earlier test
    monkeypatch.setattr(memory_gate, "TRACE_SAID_S", said_from_s)
    lines, predicted = _said_while_predicting("tests.fixtures.traced:Stack", traces=True)
    assert predicted
    assert len(lines) == said
    assert "memory: tracing a step under fake tensors: micro-batch 64, fp32" in lines[0]
    if said == 2:
        assert "micro-batch 32" in lines[1] and re.search(r"\(the last took \d+ s\)$", lines[1])


def test_a_search_says_once_that_it_took_a_mixtures_routing_as_uniform() -> None:
    lines, predicted = _said_while_predicting("tests.fixtures.traced:Routed")
    assert predicted
    assert [line for line in lines if "routing traced as uniform" in line] == lines
    assert len(lines) == 1


def test_a_search_says_once_that_a_fit_over_trials_predicts_a_model_it_cannot_trace() -> None:
    lines, predicted = _said_while_predicting("tests.fixtures.traced:Thresholded")
    assert not predicted
    assert len(lines) == 1
    assert "could not be traced" in lines[0] and "predicting by a fit" in lines[0]


def test_a_kind_of_step_the_model_fails_is_fit_over_trials_and_the_rest_still_traced() -> None:
    # One kind's failure (16-bit steps of a float32-only kernel) took the whole model off the
    # trace before: every configuration was predicted by the fit over measured trials.
    tuner = make_tuner(
        FakeExecutor(measured),
        SPACE,
        workload=WorkloadSpec(model="tests.fixtures.traced:Float32Only"),
        predict_memory=True,
        global_batch_size=64,
    )
    tuner.reporter = phases = _Phases()
    bf16, fp32 = (TrainConfig(global_batch_size=64, amp=a, device="cpu") for a in ("bf16", "off"))
    assert tuner.gate.predict(bf16) is None
    assert tuner.gate.predict(fp32) is not None and tuner.gate.trace_error is None
    assert tuner.gate.predict(bf16) is None  # not traced again
    [line] = [line for line in phases.lines if "could not be traced" in line]
    assert line.startswith("memory: 16-bit steps could not be traced under fake tensors: ")
    assert "float32 only" in line and line.endswith(
        "by a fit over measured trials, the rest traced"
    )


def test_a_step_failing_in_every_kind_is_still_the_models_failure() -> None:
    lines, predicted = _said_while_predicting("tests.fixtures.traced:Mismatched")
    assert not predicted
    assert len(lines) == 1 and lines[0].startswith("memory: the model could not be traced")


def _one_device(outcome: Outcome, model: str, space: dict[str, Any], trials: int) -> Tuner:
    """A search of ``tests.fixtures.traced``'s ``model`` on one device, memory predicted, a
    global batch of 64 and a 4,000 MiB limit, over ``space`` with ``trials`` trials."""
    return make_tuner(
        FakeExecutor(outcome),
        {"parallel": ["single"], "world_size": [1], **space},
        limit_mib=4000,
        workload=WorkloadSpec(model=f"tests.fixtures.traced:{model}"),
        predict_memory=True,
        global_batch_size=64,
        trials=trials,
    )


def test_a_cpu_bf16_pick_of_a_routed_model_carries_the_memory_caveat() -> None:
    def small(config: TrainConfig, before: int) -> TrialResult:  # bf16 twice as fast
        return ok(config, 2000.0 if config.amp == "bf16" else 1000.0, 400.0)

    tuner = _one_device(small, "Routed", {"amp": ["bf16"], "grad_accum_steps": [1, 2]}, 3)
    recommendation = tuner.run([], "s.db", "s")
    assert recommendation.config.amp == "bf16"
    assert "lower bound for a long run" in recommendation.memory_caveats[0]


def test_a_model_the_trace_cannot_follow_shows_its_trials_estimated_from_measured_ones() -> None:
    # A model the trace cannot follow (here torch.where(x > 0); once an LSTM over packed
    # sequences): its trials showed no prediction at all.
    # Each is now recorded with what the measured trials estimate, said to come from them.
    def peaks(config: TrainConfig, before: int) -> TrialResult:  # 2 MiB a sample, + 300
        return ok(config, 1000.0, 300.0 + 2.0 * config.micro_batch_size)

    tuner = _one_device(peaks, "Thresholded", {"grad_accum_steps": [1, 2, 4, 8]}, 4)
    tuner.references()
    tuner.search()
    tuner.race()
    ran = [r for r in tuner.log.records if r.status == "ok"]
    assert tuner.memory is not None and tuner.memory.trace_error
    assert ran[0].predicted_memory_bytes is None  # nothing measured before the first
    estimated = [r for r in ran if r.predicted_memory_bytes is not None]
    sources = {r.predicted_memory_source for r in estimated}
    assert "measured trials: a line over 2 of its family by micro-batch" in sources
    assert any(s.endswith("earlier run(s) of its memory") for s in sources)  # race runs
    assert all(r.prediction_error == 0 for r in estimated)  # the line holds exactly here
