"""Jobs run side by side in forked copies of this process, one per core: for ``plan``'s traces.

A table's plan traces up to nine distinct training steps (the corners of micro-batch and
checkpointing per precision, and one step as one rank of many), each seconds of pure Python
(fake tensors compute nothing, so one process traces on one core): ``gpt2_124m`` over the default
space took 42-45 s on a 2-core AMD EPYC, one trace after another. Here this process and
``processes - 1`` forked copies of it take the jobs in turn from one counter, each returning what
it computed through a queue, with the warnings its job raised (shown here, through
``warnings.showwarning``, not by each copy on its own); a job whose copy died (or stopped
answering) is missing from the answer, and its caller runs it itself, as before.

Forking copies a process as it is, so it is done only where that is safe: on Linux, from a
process with no other Python thread (a Ray driver's threads may hold locks no copy would see
released) and no CUDA context (a copy cannot use it). Elsewhere ``processes_here`` is 1 and the
jobs run here, one after another. Jobs that run autograd (traces) ask ``forked_autograd_runs``
too: a CUDA build of torch, once this process has run a backward, leaves copies that cannot.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

T = TypeVar("T")
J = TypeVar("J")

_POLL_S = 0.5
_PROBE_S = 10.0
"""How long ``forked_autograd_runs`` waits for its child's backward."""
_PATIENCE_S = 60.0
_PATIENCE_JOBS = 4
"""How long this process waits for a copy's next answer once its own jobs are done: a minute,
or four times its longest job, whichever is longer; then it gives the copies up."""


def processes_here() -> int:
    """How many jobs this process may run at once (itself and its forked copies)."""
    if sys.platform != "linux" or threading.active_count() > 1:
        return 1
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return 1
    return len(os.sched_getaffinity(0))


def forked_autograd_runs() -> bool:
    """Whether a process forked from this one can run a backward. Once a CUDA build of torch has
    run one here, its autograd engine holds a thread per device, and a forked copy's backward
    raises ("Unable to handle autograd's threading in combination with fork-based
    multiprocessing"; seen with torch 2.11+cu130 on a machine without a GPU, never with the CPU
    build). Torch has no call that tells, so a forked child tries one (milliseconds; one that
    has not ended in ``_PROBE_S``, a lock the fork copied held, is killed and answers no)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return True  # nothing has run a backward here
    if sys.platform != "linux":
        return False  # no fork
    with _forking():
        pid = os.fork()
    if pid == 0:  # the child: exits 0 only if its backward ran
        code = 1
        try:
            torch.ones(1, requires_grad=True).sum().backward()
            code = 0
        finally:
            os._exit(code)
    deadline = time.monotonic() + _PROBE_S
    while (ended := os.waitpid(pid, os.WNOHANG))[0] == 0:
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return False
        time.sleep(0.005)
    return os.waitstatus_to_exitcode(ended[1]) == 0


def run_side_by_side(
    jobs: Sequence[J],
    work: Callable[[J], T],
    processes: int,
    starting: Callable[[int, J], None] | None = None,
) -> dict[int, T]:
    """``work(job)`` of every job, by index, ``processes`` at a time: this process takes its
    turn with the copies (``starting(index, job)`` is told before each job it runs itself). A
    job whose copy died before answering is left out of the answer."""
    import multiprocessing

    copies = max(0, min(processes, len(jobs)) - 1)
    if not copies:  # no fork asked for (where there is none: Windows)
        alone: dict[int, T] = {}
        for number, job in enumerate(jobs):
            if starting is not None:
                starting(number, job)
            alone[number] = work(job)
        return alone
    context = multiprocessing.get_context("fork")
    counter = context.Value("i", 0)
    answers: Any = context.Queue()
    workers = [
        context.Process(target=_copy, args=(jobs, work, counter, answers), daemon=True)
        for _ in range(copies)
    ]
    with _forking():
        for worker in workers:
            worker.start()
    done: dict[int, T] = {}
    longest = 0.0
    try:
        while (index := _claim(counter, len(jobs))) is not None:
            if starting is not None:
                starting(index, jobs[index])
            started = time.monotonic()
            done[index] = work(jobs[index])
            longest = max(longest, time.monotonic() - started)
        patience = max(_PATIENCE_S, _PATIENCE_JOBS * longest)
        last = time.monotonic()
        while len(done) < len(jobs):
            try:
                answered, answer = answers.get(timeout=_POLL_S)
            except queue.Empty:
                if not any(w.is_alive() for w in workers) and answers.empty():
                    break  # a copy died (killed, crashed) without answering its job
                if time.monotonic() - last > patience:
                    break  # a copy stuck (a lock the fork copied held): its caller runs it
                continue
            answer, said = answer
            for warned in said:  # filtered in the copy already, by the filters it forked with
                warnings.showwarning(*warned)
            done[answered] = answer
            last = time.monotonic()
    finally:
        for worker in workers:
            worker.join(timeout=_POLL_S)
            if worker.is_alive():
                worker.terminate()
        answers.close()
    return done


@contextlib.contextmanager
def _forking() -> Iterator[None]:
    """Python 3.12's warning that forking a process with other threads may deadlock, left
    unsaid: this process has no other Python thread (``processes_here``), the threads 3.12
    counts are torch's own pools, and a copy that stops answering has its job run here."""
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message=r"This process .* is multi-threaded", category=DeprecationWarning
        )
        yield


def _claim(counter: Any, total: int) -> int | None:
    with counter.get_lock():
        index = int(counter.value)
        if index >= total:
            return None
        counter.value = index + 1
        return index


def _copy(jobs: Sequence[J], work: Callable[[J], T], counter: Any, answers: Any) -> None:
    """A forked copy's loop: jobs from the shared counter until none is left."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(1)  # as a DataLoader worker does: one core each
    while (index := _claim(counter, len(jobs))) is not None:
        try:
            with warnings.catch_warnings(record=True) as said:
                answer = work(jobs[index])
        except BaseException:  # its caller runs the job again and sees why
            continue
        answers.put((index, (answer, [_portable(w) for w in said])))
    answers.close()
    answers.join_thread()


def _portable(warned: warnings.WarningMessage) -> tuple[str, type[Warning], str, int]:
    """A warning a copy raised, as ``warnings.showwarning``'s arguments, in a form that pickles:
    a category pickle cannot find by name (a class made in a function) goes as ``Warning``, its
    name before the text."""
    import pickle

    text, category = str(warned.message), warned.category
    try:
        pickle.dumps(category)
    except Exception:
        text, category = f"{category.__name__}: {text}", Warning
    return text, category, warned.filename, warned.lineno
