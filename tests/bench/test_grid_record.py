"""A landscape recorded run by run (``autotune.bench.grid_record``): the grid's order, and a
recording stopped and resumed from its saved state makes the same choices as one that never
stopped. Nothing runs: each run is a recorded one of ``tests/data/landscape.json``."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.bench.grid_record import ORACLE_REPEATS, ORACLE_TOP, GridState
from autotune.bench.landscape import Landscape, Run, memory_line

LANDSCAPE = Path(__file__).resolve().parent.parent / "data" / "landscape.json"


@pytest.fixture(scope="module")
def recorded() -> Landscape:
    return Landscape.load(LANDSCAPE)


def _fresh(recorded: Landscape) -> GridState:
    return GridState.start(
        [p.config for p in recorded.points],
        workload=recorded.workload,
        platform=recorded.platform,
        devices=recorded.devices,
        space=recorded.space,
        global_batch_size=recorded.global_batch_size,
        warmup_steps=recorded.warmup_steps,
        measured_steps=recorded.measured_steps,
    )


def _run(recorded: Landscape, index: int, nth: int) -> Run:
    """The ``nth`` run of configuration ``index``: its recorded first run, then the same run
    slowed by a share that differs per configuration and repeat (so repeats can reorder)."""
    first = recorded.points[index].runs[0]
    if nth == 0 or first.samples_per_s is None:
        return first
    slower = 1.0 - 0.01 * ((index * 7 + nth * 3) % 11)
    return first.model_copy(update={"samples_per_s": first.samples_per_s * slower})


def _record(recorded: Landscape, state: GridState, stop_after: int | None = None) -> GridState:
    done = 0
    while (i := state.next_run()) is not None and (stop_after is None or done < stop_after):
        state = state.with_run(i, _run(recorded, i, len(state.runs[i])))
        done += 1
    return state


def test_every_configuration_once_then_the_fastest_eight_that_fit_three_more_times_in_rounds(
    recorded: Landscape,
) -> None:
    state = _fresh(recorded)
    order = []
    while (i := state.next_run()) is not None:
        order.append(i)
        state = state.with_run(i, _run(recorded, i, len(state.runs[i])))
    n = len(recorded.points)
    assert order[:n] == list(range(n))
    peaks = [p.runs[0].memory_used_bytes for p in recorded.points if p.runs[0].memory_used_bytes]
    limit = memory_line(peaks)
    fitting = [
        i
        for i, p in enumerate(recorded.points)
        if p.runs[0].status == "ok" and (p.runs[0].memory_used_bytes or limit + 1) <= limit
    ]
    top = sorted(fitting, key=lambda i: recorded.points[i].runs[0].samples_per_s or 0.0)
    top = top[::-1][:ORACLE_TOP]
    assert len(top) == ORACLE_TOP
    assert order[n:] == top * ORACLE_REPEATS  # rounds: A B C .., A B C .., not A A A B B B
    landscape = state.landscape()
    assert landscape.memory_limit_bytes == limit
    assert [len(p.runs) for p in landscape.points] == [
        1 + ORACLE_REPEATS if i in top else 1 for i in range(n)
    ]
    assert landscape.optimum().config in [recorded.points[i].config for i in top]


@pytest.mark.parametrize("stop_after", [0, 1, 50, 96, 97, 110])
def test_a_recording_stopped_and_resumed_from_its_file_ends_as_one_that_never_stopped(
    recorded: Landscape, stop_after: int, tmp_path: Path
) -> None:
    whole = _record(recorded, _fresh(recorded))
    path = tmp_path / "state.json"
    _record(recorded, _fresh(recorded), stop_after).save(path)
    assert not list(tmp_path.glob("*.writing")), "the write goes through a file renamed into place"
    resumed = _record(recorded, GridState.load(path))
    assert resumed == whole
    assert resumed.next_run() is None and resumed.runs_left() == 0


def test_runs_left_counts_down_to_the_end_once_the_eight_are_known(recorded: Landscape) -> None:
    state = _fresh(recorded)
    assert state.runs_left() == len(recorded.points) + ORACLE_TOP * ORACLE_REPEATS
    state = _record(recorded, state, len(recorded.points))
    assert state.first_pass_done
    left = state.runs_left()
    assert left == ORACLE_TOP * ORACLE_REPEATS
    for expected in range(left - 1, -1, -1):
        state = _record(recorded, state, 1)
        assert state.runs_left() == expected
