"""Jobs run side by side in forked copies: the same answers as one after another, a copy that
dies or hangs costs its job (its caller runs it), and no copies where forking is unsafe; a plan's
traces taken so predict what traced one by one predicts."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import pytest

from autotune.config import TrainConfig
from autotune.runner.fake_memory import TraceError
from autotune.runner.workload import WorkloadSpec
from autotune.search import side_by_side, step_traces
from autotune.search.memory_model import MemoryModel
from autotune.search.side_by_side import forked_autograd_runs, processes_here, run_side_by_side


def test_jobs_taken_side_by_side_answer_as_one_after_another() -> None:
    here = os.getpid()
    started: list[int] = []

    def work(job: int) -> tuple[int, int]:
        time.sleep(0.2)  # long enough for every copy to take a job
        return job * job, os.getpid()

    done = run_side_by_side(list(range(8)), work, 3, lambda index, _: started.append(index))
    assert {index: square for index, (square, _) in done.items()} == {j: j * j for j in range(8)}
    by = {index: pid for index, (_, pid) in done.items()}
    assert len(set(by.values())) > 1  # copies took some
    assert sorted(started) == sorted(i for i, pid in by.items() if pid == here)  # told of its own


def test_one_process_runs_every_job_here_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    import multiprocessing

    def no_fork(method: str) -> None:
        raise ValueError(f"cannot find context for {method!r}")  # as on Windows

    monkeypatch.setattr(multiprocessing, "get_context", no_fork)
    said: list[str] = []
    done = run_side_by_side(
        ["a", "b"], lambda job: said.append(job) or job.upper(), 1,
        lambda index, _: said.append(f"start {index}"),
    )  # fmt: skip
    assert done == {0: "A", 1: "B"} and said == ["start 0", "a", "start 1", "b"]


def test_a_job_whose_copy_died_is_left_to_its_caller() -> None:
    here = os.getpid()

    def work(job: int) -> int:
        if os.getpid() != here:
            os._exit(1)  # a copy killed mid-job (out of memory, a crash in a library)
        time.sleep(0.2)
        return job

    started = time.monotonic()
    done = run_side_by_side(list(range(6)), work, 2)
    assert done and len(done) < 6 and all(done[i] == i for i in done)
    assert time.monotonic() - started < side_by_side._PATIENCE_S  # noticed, not waited out


def test_a_copy_that_stops_answering_is_given_up(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(side_by_side, "_PATIENCE_S", 1.0)
    here = os.getpid()

    def work(job: int) -> int:
        if os.getpid() != here:
            time.sleep(600)  # a lock the fork copied, held by a thread the copy lacks
        time.sleep(0.2)
        return job

    started = time.monotonic()
    done = run_side_by_side(list(range(4)), work, 2)
    assert 0 < len(done) < 4 and time.monotonic() - started < 30


def test_no_copies_where_forking_is_unsafe(monkeypatch: pytest.MonkeyPatch) -> None:
    release = threading.Event()
    thread = threading.Thread(target=release.wait)
    thread.start()
    try:
        assert processes_here() == 1  # another thread: its locks would be copied held
    finally:
        release.set()
        thread.join()
    monkeypatch.setattr(threading, "active_count", lambda: 1)
    assert processes_here() == len(os.sched_getaffinity(0))
    monkeypatch.setattr(side_by_side.sys, "platform", "darwin")
    assert processes_here() == 1


def _cuda_build() -> bool:
    import torch

    return torch.version.cuda is not None


def _table(parallel: str, worlds: list[int], segments: tuple[int, ...]) -> list[TrainConfig]:
    return [
        TrainConfig(
            global_batch_size=mb * world,
            parallel=parallel if world > 1 else "single",  # type: ignore[arg-type]
            world_size=world,
            amp=amp,  # type: ignore[arg-type]
            checkpoint_segments=k,
            device="cpu",
        )
        for mb in (2, 8, 16)
        for world in worlds
        for amp in ("off", "bf16")
        for k in segments
    ]


def _predicted(
    model: str, configs: list[TrainConfig], processes: int
) -> tuple[list[Any], MemoryModel, list[str]]:
    step_traces._TRACED.clear()  # shared by every model of the process: trace afresh
    said: list[str] = []
    predicting = MemoryModel(WorkloadSpec(model=model), "cpu")
    predicting.tracing = said.append
    predicting.interpolate_between(configs)
    predicting.trace_ahead(configs, processes)
    ahead = len(said)
    predictions = [predicting.predict(c) for c in configs]
    assert len(said) == ahead or processes == 1  # every step was traced ahead
    return predictions, predicting, said


@pytest.mark.parametrize(
    ("model", "parallel", "segments"),
    [
        ("tests.fixtures.traced:Stack", "fsdp", (0, 2, 4)),
        # traced per world, ~7 s: the default run traces it so in test_fake_group
        pytest.param(
            "tests.fixtures.contrastive:GatheredTowers", "ddp", (0,), marks=pytest.mark.slow
        ),
    ],
)
def test_a_tables_steps_traced_side_by_side_predict_as_traced_one_by_one(
    model: str, parallel: str, segments: tuple[int, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(step_traces, "_TRACED", {})
    configs = _table(parallel, [1, 2, 8], segments)
    alone, one_by_one, said_alone = _predicted(model, configs, 1)
    together, side, said = _predicted(model, configs, 2)
    assert together == alone and None not in together
    assert side.gathers == one_by_one.gathers == ("Gathered" in model)
    # the copy traced the others (where a copy can: after this process's traces, a CUDA build's
    # cannot, and they are all traced here)
    assert len(said) < len(said_alone) or not forked_autograd_runs()
    assert all(line.endswith(" at a time)") for line in said)


CPU_BUILD = pytest.mark.skipif(
    _cuda_build(),
    reason="a CUDA build's copies cannot run a backward once this process has traced a step",
)


@CPU_BUILD
def test_a_step_only_a_copy_failed_is_traced_here_again(monkeypatch: pytest.MonkeyPatch) -> None:
    # A CUDA build of torch (2.11+cu130), once this process had traced a step, left copies whose
    # backward raised: that failure was taken as the model's, and the plan of a model whose step
    # depends on the world (a second round of copies) had no prediction at all.
    monkeypatch.setattr(step_traces, "_TRACED", {})
    here, real = os.getpid(), step_traces.trace_step

    def fails_in_a_copy(*args: Any, **kwargs: Any) -> Any:
        if os.getpid() != here:
            raise TraceError("RuntimeError: Unable to handle autograd's threading ...")
        return real(*args, **kwargs)

    configs = _table("fsdp", [1, 2, 8], (0, 2, 4))
    alone, _, said_alone = _predicted("tests.fixtures.traced:Stack", configs, 1)
    monkeypatch.setattr(step_traces, "trace_step", fails_in_a_copy)
    together, side, said = _predicted("tests.fixtures.traced:Stack", configs, 2)
    assert together == alone and side.trace_error is None
    again = [line for line in said if not line.endswith(" at a time)")]
    assert again and len(said) == len(said_alone)  # the copies' steps traced here, after them


@CPU_BUILD
def test_no_copies_where_a_forked_backward_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    assert forked_autograd_runs()  # the CPU build's copies can
    monkeypatch.setattr(step_traces, "_TRACED", {})
    configs = _table("fsdp", [1, 2], (0, 2))
    alone, _, _ = _predicted("tests.fixtures.traced:Stack", configs, 1)

    def raises(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("Unable to handle autograd's threading in combination with fork")

    with monkeypatch.context() as patched:
        patched.setattr(torch.autograd, "backward", raises)  # the forked probe's backward
        assert not forked_autograd_runs()
    with monkeypatch.context() as patched:
        patched.setattr(side_by_side, "_PROBE_S", 0.2)
        patched.setattr(torch.autograd, "backward", lambda *_, **__: time.sleep(60))  # stuck
        started = time.monotonic()
        assert not forked_autograd_runs() and time.monotonic() - started < 5
    monkeypatch.setattr(step_traces, "forked_autograd_runs", lambda: False)
    together, side, said = _predicted("tests.fixtures.traced:Stack", configs, 2)
    assert together == alone and side.trace_error is None
    assert said and all(line.endswith(", 1 at a time)") for line in said)


@pytest.mark.parametrize(
    ("model", "segments"),
    [
        ("tests.fixtures.traced:DataDependent", (0,)),  # no step traces
        ("tests.fixtures.contrastive:GatheredTowers", (0, 4)),  # no blocks to checkpoint
    ],
)
def test_a_step_a_copy_could_not_trace_fails_the_predictions_as_it_would_here(
    model: str, segments: tuple[int, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(step_traces, "_TRACED", {})
    configs = _table("ddp", [1, 2], segments)
    alone, one_by_one, _ = _predicted(model, configs, 1)
    together, side, _ = _predicted(model, configs, 2)
    # one by one, a configuration after the failure whose own step was traced before it is
    # predicted still; a plan stops at the first None either way
    assert alone[0] is together[0] is None and set(together) == {None}
    assert side.trace_error == one_by_one.trace_error and side.trace_error


def test_what_this_process_buffered_is_written_once() -> None:
    # A script embedding the tuner, its output to a file (block-buffered), printed before a plan:
    # a forked copy holds the buffer too, and would write it again as it ends, had
    # multiprocessing not flushed it before forking (it does: pinned here).
    import subprocess
    import sys

    script = (
        "from autotune.search.side_by_side import run_side_by_side\n"
        "print('before', end='')\n"
        "run_side_by_side([1, 2, 3, 4], abs, 2)\n"
        "print(' after')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    )
    assert done.stdout == "before after\n"


def test_what_a_copys_jobs_warned_of_is_said_here_once_each() -> None:
    # A copy's warnings were its own to print: a model's deprecation note, given each time it is
    # built, was said once by this process and again by every copy. They come back with the
    # answers now, to be shown here (once each, within warnings_once, as the traces are).
    import warnings

    from autotune.runner.fake_memory import warnings_once

    here = os.getpid()

    def work(job: int) -> int:
        time.sleep(0.2)  # long enough for every copy to take a job
        warnings.warn("the same note from every job", FutureWarning, stacklevel=1)
        warnings.warn(f"job {job}'s own note", UserWarning, stacklevel=1)
        return os.getpid()

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("default")
        with warnings_once():
            done = run_side_by_side(list(range(6)), work, 3)
    assert set(done.values()) - {here}  # copies took some
    notes = ["the same note from every job", *(f"job {j}'s own note" for j in range(6))]
    assert sorted(str(w.message) for w in seen) == sorted(notes)


def test_a_warning_whose_category_cannot_be_pickled_comes_back_named() -> None:
    # A class made in a function has no name pickle can find: the answer carrying it would not
    # reach this process at all, so it comes as a plain Warning with its own name in the text.
    import pickle
    import warnings

    class Local(UserWarning):
        pass

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        warnings.warn("made in a function", Local, stacklevel=1)
        warnings.warn("a module's own", DeprecationWarning, stacklevel=1)
    local, known = (side_by_side._portable(w) for w in seen)
    assert local[:2] == ("Local: made in a function", Warning)
    assert known[:2] == ("a module's own", DeprecationWarning)
    assert pickle.loads(pickle.dumps([local, known])) == [local, known]


@pytest.mark.slow  # a plan in a process of its own; the copies' warnings are checked in process
def test_a_plan_says_a_models_warning_once_however_many_copies_trace_it() -> None:
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "autotune.cli", "plan", "--model",
         "tests.fixtures.models:Deprecated", "--devices", "8", "--device-memory", "1GiB"],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": os.getcwd()},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-500:]
    assert "2 at a time" in done.stderr or processes_here() == 1  # traced side by side here
    assert done.stderr.count("FutureWarning: Deprecated's argument is deprecated") == 1
