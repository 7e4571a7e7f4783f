from __future__ import annotations

import io

import pytest

from autotune.config import make_config
from autotune.records import TrialRecord
from autotune.search.progress import (
    SAID_IN_A_ROW,
    SUMMED_EVERY,
    LineReporter,
    Reporter,
    RichReporter,
    SkipLines,
    make_reporter,
)

CONFIG = make_config({"global_batch_size": 8, "device": "cpu"})


def _record(
    number: int, speed: float | None, status: str = "ok", role: str = "search"
) -> TrialRecord:
    return TrialRecord(
        number=number,
        role=role,  # type: ignore[arg-type]
        status=status,
        config=CONFIG,  # type: ignore[arg-type]
        samples_per_s=speed,
        memory_used_bytes=300 << 20,
        feasible=True,
        message="" if status == "ok" else "rank 1: killed by SIGABRT",
    )


def test_plain_lines_say_done_budget_best_and_outcome() -> None:
    stream = io.StringIO()
    reporter = LineReporter(stream, trials=10)
    reporter.trial_started("search", CONFIG)
    reporter.trial_finished(_record(3, 120.0), _record(3, 120.0))
    reporter.trial_finished(_record(4, None, "crashed"), _record(3, 120.0))
    lines = stream.getvalue().splitlines()
    assert "search trial: singlex1" in lines[0]
    assert "#3 120.0 samples/s, 300 MiB (fits)  [trials 1/10, best 120.0 samples/s]" in lines[1]
    assert "#4 crashed: rank 1: killed by SIGABRT  [trials 2/10" in lines[2]
    long = _record(5, None, "skipped").model_copy(update={"message": "amp=bf16 failed " * 20})
    reporter.trial_finished(long, _record(3, 120.0))
    said = stream.getvalue().splitlines()[3]  # cut where marked, not mid-word unmarked
    assert "skipped: amp=bf16 failed amp=bf16" in said and "failed...  [trials 2/10" in said
    rising = _record(6, 90.0).model_copy(update={"step_time_drift": 2.75})
    reporter.trial_finished(rising, _record(3, 120.0))
    assert (
        "#6 90.0 samples/s, 300 MiB (fits), step time rising 2.8x over its steps"
        in (stream.getvalue().splitlines()[-1])
    )


@pytest.mark.parametrize(
    ("trials", "stored", "said", "counted"),
    [
        (10, 4, "resuming: 4 trial(s) of the budget already stored", "[trials 5/10, best"),
        # a study of 8 resumed with --trials 2 once printed "[trials 8/2, ...]"
        (2, 8, "8 trial(s) already stored, the budget of 2 spent: no new search trials",
         "[trials 9 (budget 2), best"),
    ],
)  # fmt: skip
def test_a_resumed_study_counts_on_from_its_stored_trials(
    trials: int, stored: int, said: str, counted: str
) -> None:
    stream = io.StringIO()
    reporter = LineReporter(stream, trials=trials)
    reporter.resumed(stored)
    reporter.trial_finished(_record(stored + 1, 120.0), _record(stored + 1, 120.0))
    lines = stream.getvalue().splitlines()
    assert said in lines[0] and counted in lines[1]


def test_quiet_is_silent_and_pipes_get_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    assert type(make_reporter(quiet=True, trials=5)) is Reporter
    monkeypatch.setattr("sys.stderr", io.StringIO())
    assert type(make_reporter(quiet=False, trials=5)) is LineReporter


def test_the_live_display_shows_progress_best_and_current_trial() -> None:
    reporter = RichReporter(trials=5)
    reporter.trial_finished(_record(1, 99.5), _record(1, 99.5))
    reporter.trial_started("search", CONFIG)
    status = str(
        reporter.status.renderable.text
        if hasattr(reporter.status.renderable, "text")
        else reporter.status.status
    )
    reporter.close()
    assert "trials 1/5" in status and "best 99.5 samples/s" in status
    assert "running search: singlex1" in status


def test_the_counter_counts_what_the_trial_budget_counts() -> None:
    # The budget counts measured trials, the baseline included; skipped, duplicate and invalid
    # trials never ran, and re-measurements come after the budget.
    stream = io.StringIO()
    reporter = LineReporter(stream, trials=10)
    best = _record(1, 120.0)
    for record in (
        _record(0, 100.0, role="baseline"),
        _record(1, 120.0),
        _record(2, None, "skipped"),
        _record(3, 120.0, "duplicate"),
        _record(4, None, "invalid"),
        _record(5, 118.0, role="remeasure"),
        _record(6, None, "oom"),
    ):
        reporter.trial_finished(record, best)
    assert "[trials 3/10" in stream.getvalue().splitlines()[-1]
    assert reporter.done == 3


def test_a_compiled_trial_says_what_compiling_took() -> None:
    stream = io.StringIO()
    record = _record(5, 90.0).model_copy(update={"compile_s": 31.24})
    LineReporter(stream, trials=10).trial_finished(record, record)
    assert "#5 90.0 samples/s, 300 MiB (fits), compiled in 31.2 s  [trials" in stream.getvalue()


def test_a_trial_that_ran_shows_its_prediction_beside_its_measurement() -> None:
    from autotune.report import memory_cell

    record = _record(5, 100.0).model_copy(
        update={"predicted_memory_bytes": 270 << 20, "predicted_memory_source": "fake-tensor"}
    )
    stream = io.StringIO()
    LineReporter(stream).trial_finished(record, record)
    assert "300 MiB (fits; predicted ~270 MiB, 10% low)" in stream.getvalue()
    # show and the HTML report say the error in the progress line's words, not as a sign
    assert memory_cell(record) == "300.0 MiB (~270.0 MiB predicted, 10% low)"
    high = record.model_copy(update={"predicted_memory_bytes": 330 << 20})
    assert memory_cell(high) == "300.0 MiB (~330.0 MiB predicted, 10% high)"
    skipped = record.model_copy(update={"status": "skipped", "memory_used_bytes": None})
    assert memory_cell(skipped) == "~270.0 MiB predicted"  # never shown as measured
    pruned = record.model_copy(update={"status": "pruned"})  # its peak may be partial: no error
    assert memory_cell(pruned) == "300.0 MiB (~270.0 MiB predicted)"


def test_skips_in_a_row_are_said_five_then_summed_up_and_said_again_after_a_trial() -> None:
    # A search where nothing fits proposed 218 configurations in a row, a line each.
    stream = io.StringIO()
    skips = SkipLines(LineReporter(stream, trials=10))

    def skipped(number: int, mib: int) -> TrialRecord:
        return _record(number, None, status="skipped").model_copy(
            update={
                "config": CONFIG.model_copy(update={"global_batch_size": 8 * number}),
                "message": "predicted not to fit: ...",
                "feasible": False,
                "predicted_memory_bytes": mib << 20,
            }
        )

    for number in range(1, 8):
        skips.skipped(skipped(number, 500 + number), None)
    skips.skipped(skipped(1, 501), None)  # proposed again: in silence, and not held
    lines = stream.getvalue().splitlines()
    assert len(lines) == SAID_IN_A_ROW and all("skipped" in line for line in lines)
    skips.trial_runs()  # the two held back are summed up
    summed = stream.getvalue().splitlines()[SAID_IN_A_ROW:]
    assert len(summed) == 1
    assert (
        "#6-#7: 2 more configurations decided without running (2 predicted not to fit"
        in (summed[0])
    )
    assert "the least ~506 MiB predicted; `autotune show` lists each)" in summed[0]
    skips.skipped(skipped(9, 600), None)  # said again after the trial
    assert "#9 skipped" in stream.getvalue().splitlines()[-1]
    for number in range(10, 10 + SAID_IN_A_ROW + SUMMED_EVERY):  # a progress line while none runs
        skips.skipped(skipped(number, 700), None)
    assert "50 more configurations" in stream.getvalue().splitlines()[-1]


def test_a_slow_models_throughput_reads_in_three_figures_everywhere() -> None:
    # A large model on a small machine, 38 s a step of 1: the progress line, show and the
    # trial's own output said "0.0 samples/s", where the pruning line already said 0.0263.
    from autotune.report import format_trial
    from autotune.result import TrialResult

    stream = io.StringIO()
    slow = _record(1, 0.02634)
    LineReporter(stream, trials=4).trial_finished(slow, slow)
    assert "#1 0.0263 samples/s, 300 MiB (fits)  [trials 1/4, best 0.0263 samples/s]" in (
        stream.getvalue()
    )
    result = TrialResult(
        config=CONFIG,
        status="ok",
        samples_per_s=0.02634,
        samples_per_s_low=0.0251,
        samples_per_s_high=0.0277,
        step_time_median_s=38.0,
        step_time_p10_s=37.0,
        step_time_p90_s=39.0,
        step_time_spread=0.05,
        data_wait_share=0.0,
    )
    assert "throughput    0.0263 samples/s [95%: 0.0251-0.0277]" in format_trial(result)
