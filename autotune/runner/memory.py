"""Peak memory of one rank over the measured window.

CUDA: the caching allocator's peak (allocated and reserved, reset when the window opens) and the
device-level memory in use as NVML reports it, sampled in a background thread. A trial is judged
by the reserved peak: what the process takes from the device, fragmentation and CUDA graphs'
private pools included (these can be far above the allocated peak: 5 GiB allocated against
43 GiB reserved for GPT-2 small under torch.compile's reduce-overhead on an H100). Reserved
memory only grows until released, so its peak in the window covers the warm-up too.

CPU: the rank process's resident high-water mark (``VmHWM``, reset through
``/proc/self/clear_refs`` when the window opens, so it is exact, short spikes included) plus the
sampled peak of what its DataLoader workers hold beside it (``workers_bytes``): pages a worker
shares with the rank are already in the rank's figure.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from autotune.runner import compile_state
from autotune.runner.references import resolve_reference
from autotune.runner.workload import (
    WorkloadSpec,
    load_dataset,
    load_loss,
    load_model,
    put_on_path,
)

SAMPLE_INTERVAL_S = 0.02
SAMPLER_SHARE = 0.02
"""The most of a core the sampler of a CPU trial's DataLoader workers may take (its page walks
compete with the step it measures): it waits fifty times as long as its last sample took,
``SAMPLE_INTERVAL_S`` at least. What the workers hold grows as the rank writes, not in spikes,
and the window's end is sampled too."""


def _status_kib(field: str, pid: int | str = "self") -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def _rollup_kib(pid: int | str) -> dict[str, int]:
    """The fields of ``/proc/PID/smaps_rollup`` in KiB ({}: the process exited meanwhile)."""
    fields: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                name, _, rest = line.partition(":")
                value = rest.split()
                if value and value[0].isdigit():
                    fields[name] = int(value[0])
    except OSError:
        return {}
    return fields


def workers_bytes(pids: list[int]) -> int:
    """What this process's DataLoader workers ``pids`` hold beside its own resident set.

    A worker forked from the rank shares the rank's pages until either writes one. Where the
    rank writes (its collector, its optimizer), it takes a copy and the old page is left to the
    workers: with one worker, that page is the worker's private memory; with several, it is
    shared among them and private to none (``gpt_tiny`` compiled, one device: 78 MiB of private
    pages with one worker, 22 with two). So the workers' part is their anonymous and shared
    memory less what the rank maps too, from proportional set sizes (each page shared by k
    processes counts 1/k in each): the group's anonymous pages, ``sum(Pss_Anon)`` over the rank
    and its workers (such pages are shared only within it), less the rank's own, ``Anonymous``;
    shared memory (batches handed over) alike. Kernels without ``Pss_Anon`` (before 5.x): the
    workers' private pages alone, an undercount with more than one worker."""
    workers = [fields for fields in map(_rollup_kib, pids) if fields]
    if not workers:
        return 0
    if any("Pss_Anon" not in fields for fields in workers):
        return 1024 * sum(w.get("Private_Clean", 0) + w.get("Private_Dirty", 0) for w in workers)
    rank = _rollup_kib("self")
    group = sum(f["Pss_Anon"] + f.get("Pss_Shmem", 0) for f in [rank, *workers])
    held = rank.get("Anonymous", 0) + _status_kib("RssShmem")
    return 1024 * max(0, group - held)


EPOCH_COPY_S = 3.0
"""How long ``epoch_copy_bytes`` may walk a dataset's objects before it reports what it reached."""


def epoch_copy_bytes(data: Any, budget_s: float = EPOCH_COPY_S) -> tuple[int, bool]:
    """What a DataLoader worker copies of ``data`` over an epoch, beyond what a trial's few
    batches show: reading a sample writes the reference counts of the Python objects it is made
    of, so the worker copies every page that holds them (1,000,000 strings: 18 MiB after three
    batches, 122 MiB over the epoch; ``scripts/bench_epoch_copy.py``). Tensors' and arrays'
    buffers are not copied (only their small headers are written). Measured in a forked child
    that touches every object reachable from ``data`` (modules and tensors' storages left out),
    as its private pages' growth less its own bookkeeping; (bytes, whether the walk reached
    every object within ``budget_s``: else a lower bound). (0, False) where it cannot fork."""
    import gc
    import sys
    import types

    skip = (torch.Tensor, torch.nn.Module, type, types.ModuleType, types.FunctionType)
    try:
        read, write = os.pipe()
        pid = os.fork()
    except (OSError, AttributeError):
        return 0, False
    if pid == 0:  # the child: touch, measure, report, leave without running any cleanup
        try:
            os.close(read)
            before = _rollup_kib("self").get("Private_Dirty", 0)
            seen: set[int] = set()
            stack, deadline = [data], time.perf_counter() + budget_s
            while stack and time.perf_counter() < deadline:
                obj = stack.pop()
                if isinstance(obj, skip) or id(obj) in seen:
                    continue
                seen.add(id(obj))
                # an atom is touched as it is listed; only containers are walked further
                stack.extend(o for o in gc.get_referents(obj) if gc.is_tracked(o))
            after = _rollup_kib("self").get("Private_Dirty", 0)
            own = (sys.getsizeof(seen) + sys.getsizeof(stack) + 32 * len(seen)) // 1024
            os.write(write, f"{max(0, after - before - own)} {int(not stack)}".encode())
        finally:
            os._exit(0)
    os.close(write)
    try:
        with os.fdopen(read) as answer:
            kib, whole = answer.read().split()
        return int(kib) * 1024, whole == "1"
    except ValueError:  # the child died before it answered
        return 0, False
    finally:
        os.waitpid(pid, 0)


def child_pids() -> list[int]:
    """PIDs of this process's direct children (DataLoader workers, on a rank), whichever of its
    threads forked them: ``/proc/PID/task/TID/children`` lists a thread's own children only, and
    a Ray actor runs its trials on a thread of its own (read from the main thread alone, a Ray
    trial's workers were never counted)."""
    pid = os.getpid()
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        threads = []
    found: list[int] = []
    read = False
    for tid in threads:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                found.extend(int(p) for p in f.read().split())
            read = True
        except OSError:  # the thread ended between listing and reading, or no such file
            continue
    if read:
        return sorted(set(found))
    import psutil  # without the children files (kernels built without them): by parent PID

    return [c.pid for c in psutil.Process(pid).children()]


@dataclass
class MemoryPeak:
    peak_bytes: int
    reserved_bytes: int | None = None
    device_used_bytes: int | None = None


class MemoryTracker:
    """Opens a measurement window with ``start()`` and reports its peak with ``stop()``."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._sampled_peak = 0
        self._nvml_handle: Any = None
        if device.type == "cuda":
            self._nvml_handle = _nvml_handle(device.index or 0)

    def _sample(self) -> int:
        if self.device.type == "cuda":
            if self._nvml_handle is None:
                return 0
            import pynvml

            return int(pynvml.nvmlDeviceGetMemoryInfo(self._nvml_handle).used)
        return workers_bytes(child_pids())

    def _run(self) -> None:
        wait = SAMPLE_INTERVAL_S
        while not self._stop.wait(wait):
            began = time.perf_counter()
            self._sampled_peak = max(self._sampled_peak, self._sample())
            # a rank's own page walk costs ~4 ms at 500 MiB: sampled so, it takes <= 2% of a core
            wait = max(SAMPLE_INTERVAL_S, (time.perf_counter() - began) / SAMPLER_SHARE)

    def start(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            try:
                with open("/proc/self/clear_refs", "w") as f:
                    f.write("5")  # resets VmHWM to the current resident size
            except OSError:
                pass  # without the reset the high-water mark covers the whole process life
        self._sampled_peak = self._sample()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="memory-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> MemoryPeak:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._sampled_peak = max(self._sampled_peak, self._sample())
        if self.device.type == "cuda":
            return MemoryPeak(
                peak_bytes=int(torch.cuda.max_memory_allocated(self.device)),
                reserved_bytes=int(torch.cuda.max_memory_reserved(self.device)),
                device_used_bytes=self._sampled_peak if self._nvml_handle is not None else None,
            )
        return MemoryPeak(peak_bytes=_status_kib("VmHWM") * 1024 + self._sampled_peak)


def release_earlier_trials(device: torch.device) -> None:
    """Give back what earlier trials in this process still hold; called as a trial starts.

    A rank that runs trial after trial keeps the freed memory of earlier trials: glibc holds on
    to freed heap pages, so without this the resident figure of a trial grows with what ran
    before it in the same process (the same configuration was measured up to ~100 MiB apart).
    On CUDA, torch.compile's caches keep the compiled graphs and, with mode=reduce-overhead,
    the CUDA graphs' private memory pools alive (seen on an H100: 38 GiB of pools from one
    trial made the next trial, an uncompiled one that fitted before, run out of memory), and
    the caching allocator keeps what it reserved. Called before the build, not when the window
    opens, so the trial's own warm heap stays warm.
    """
    import contextlib
    import ctypes
    import gc

    compile_state.reset()
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):  # not glibc: retained heap then counts
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _nvml_handle(index: int) -> Any:
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml.nvmlDeviceGetHandleByIndex(index)
    except Exception:  # NVML missing (e.g. some containers): allocator numbers still stand
        return None


_BARE: dict[tuple[str, tuple[str, ...]], int] = {}
_WORKER: dict[tuple[str, tuple[str, ...]], int] = {}
_COPIED: dict[tuple[str, tuple[str, ...]], tuple[int, bool]] = {}
_COMPILED: dict[tuple[str, tuple[str, ...]], int] = {}
_STARTED: dict[tuple[str, tuple[str, ...]], tuple[Any, bool]] = {}  # (Popen, compiles)
_Measured = TypeVar("_Measured")


_BARE_RANK = """
import sys, torch, torch.distributed as dist, autotune.runner.rank
for name in sys.argv[3:]:
    __import__(name)  # the executor's own (a Ray worker imports ray)
if sys.argv[1]:
    from autotune.runner.memory import hold_workload
    held = hold_workload(sys.argv[1])
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
layers = [torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 8)]
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(*layers))
optimizer = torch.optim.AdamW(model.parameters())
def steps(model, count=3):
    for _ in range(count):
        model(torch.randn(32, 64)).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
def high_water():  # KiB
    return int([l for l in open("/proc/self/status") if l.startswith("VmHWM")][0].split()[1])
def peak(model):  # the window a trial measures: reset, then steps
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    steps(model)
    return high_water()
steps(model)
print(high_water(), flush=True)
def worker_share(data, collate):  # what one DataLoader worker holds beside the rank meanwhile
    from autotune.runner.memory import child_pids, workers_bytes
    loader = torch.utils.data.DataLoader(data, batch_size=8, num_workers=1, collate_fn=collate)
    most = 0
    for _, batch in zip(range(8), loader):
        steps(model, 1)
        most = max(most, workers_bytes(child_pids()))
    return most
samples = torch.utils.data.TensorDataset(torch.randn(256, 64))
data, collate = samples, None
if sys.argv[1] and len(held) > 2:
    from autotune.runner.workload import WorkloadSpec, load_collate
    data = held[2][0]
    collate = load_collate(WorkloadSpec.model_validate_json(sys.argv[1]), held[0])[0]
try:
    share = worker_share(data, collate)
except Exception:  # a dataset a plain loader cannot serve: the worker's own share, on samples
    share = worker_share(samples, None)
print(share // 1024, flush=True)
from autotune.runner.memory import epoch_copy_bytes
copied, whole = epoch_copy_bytes(data)
print(copied // 1024, int(whole), flush=True)
if sys.argv[2] == "compiled":
    eager = peak(model)
    compiled = torch.compile(model)
    steps(compiled, 2)  # compiled, as a trial's warm-up compiles
    print(max(0, peak(compiled) - eager))
dist.destroy_process_group()
"""
"""A rank without its tensors: what it imports (the workload's module and the libraries that
imports, the executor's), the workload's model built on the meta device (its lazy imports, no
parameters), its dataset and loss, a gloo group (of one), and three training steps of a model
too small to count (autograd's engine, the optimizer, the thread pools). Then what one DataLoader
worker over the workload's dataset (else samples) holds beside the rank while it trains: its
own heap and the pages the rank writes after forking it; and what a worker copies of the
dataset over an epoch (``epoch_copy_bytes``). With ``compiled``, then what
``torch.compile`` of that model adds to a trial's window (Inductor's modules and caches): the
window of three compiled steps less that of three eager ones."""


def hold_workload(spec_json: str) -> tuple[Any, ...]:
    """Build what a rank holds of a workload beside its tensors (``_BARE_RANK``): its module,
    the model on the meta device (no parameter memory; its lazy imports happen), its dataset and
    its loss. A model that will not build on the meta device is left out, with what needs it."""
    spec = WorkloadSpec.model_validate_json(spec_json)
    put_on_path(spec)
    try:
        with torch.device("meta"):
            module, model = load_model(spec.model)
    except Exception:  # built for real it would count its parameters, which the trace has
        return (resolve_reference(spec.model, "--model"),)
    try:
        return module, model, load_dataset(spec, module, model), load_loss(spec, module)
    except Exception:  # a dataset that needs the real model: its module's imports stand
        return module, model


def start_bare_rank(
    workload_json: str = "", imports: tuple[str, ...] = (), compiled: bool = False
) -> None:
    """Start measuring ``bare_rank_bytes(workload_json, imports)`` in the background (and with
    ``compiled``, ``compile_share_bytes``), so that what the caller does meanwhile (starting
    Ray: seconds) overlaps it."""
    import subprocess
    import sys

    key = (workload_json, imports)
    started = _STARTED.get(key)
    if key in _BARE and (not compiled or key in _COMPILED):
        return
    if started is not None and (started[1] or not compiled):
        return
    try:
        _STARTED[key] = (
            subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    _BARE_RANK,
                    workload_json,
                    "compiled" if compiled else "eager",
                    *imports,
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            ),
            compiled,
        )
    except OSError:
        return  # measured in the foreground when asked, or its fallback
    if started is not None:  # begun without the compiled share: this one measures both
        _stop(started[0])


def _stop(process: Any) -> None:
    if process.poll() is None:
        process.kill()
    process.communicate()


def _collect(key: tuple[str, tuple[str, ...]]) -> None:
    """Read what the process begun for ``key`` measured into ``_BARE`` (and ``_COMPILED``);
    where it failed, the fallbacks ``bare_rank_bytes`` names (and no compiled share: 0)."""
    import subprocess

    process, compiled = _STARTED.pop(key, (None, False))
    try:
        if process is None:
            raise OSError("the measuring process did not start")
        out, _ = process.communicate(timeout=180)
        lines = out.split()
        _BARE.setdefault(key, int(lines[0]) * 1024)  # one figure a search, however measured
        _WORKER.setdefault(key, int(lines[1]) * 1024)
        _COPIED.setdefault(key, (int(lines[2]) * 1024, lines[3] == "1"))
        if compiled:
            _COMPILED[key] = int(lines[4]) * 1024
    except (OSError, ValueError, IndexError, subprocess.SubprocessError):
        if process is not None:
            _stop(process)
        if key not in _BARE:  # the first trial calibrates it; without the workload, the rest
            workload_json, imports = key
            _BARE[key] = bare_rank_bytes("", imports) if workload_json else 0
            _WORKER[key] = worker_share_bytes("", imports) if workload_json else 0
        _WORKER.setdefault(key, 0)
        _COPIED.setdefault(key, (0, False))
        if compiled:
            _COMPILED.setdefault(key, 0)


def bare_rank_bytes(workload_json: str = "", imports: tuple[str, ...] = ()) -> int:
    """The resident peak of a rank process without its tensors (``_BARE_RANK``): the CPU
    memory model's first guess at a rank's share beyond its tensors, measured once per workload
    (a few seconds; ``start_bare_rank`` begins it early), until trials calibrate it.
    ``workload_json`` is a ``WorkloadSpec`` as JSON (empty: none), ``imports`` what the
    executor's ranks import besides. Imports alone measured 231 MiB on the AMD EPYC of
    docs/benchmarks.md, the rank without a workload 321 MiB. A workload that cannot be loaded
    this way leaves the rank without it."""
    key = (workload_json, imports)
    if key not in _BARE:
        start_bare_rank(workload_json, imports)
        _collect(key)
    return _BARE[key]


def compile_share_bytes(workload_json: str = "", imports: tuple[str, ...] = ()) -> int:
    """What ``torch.compile`` adds to a CPU rank's measured window, measured on a model too
    small to count (``_BARE_RANK``): the first guess at a compiled trial's share until a
    compiled trial teaches it (Inductor's modules and caches; a larger model's compiled code
    adds to it: measured 53 MiB here against 82-88 MiB more for two small models' compiled
    trials, docs/benchmarks.md). 0 where it could not be measured."""
    key = (workload_json, imports)
    if key not in _COMPILED:
        start_bare_rank(workload_json, imports, compiled=True)
        _collect(key)
    return _COMPILED.get(key, 0)


def worker_share_bytes(workload_json: str = "", imports: tuple[str, ...] = ()) -> int:
    """What one DataLoader worker adds to a CPU trial's peak, measured beside the bare rank
    (``_BARE_RANK``): the first guess at a worker's share until trials with workers teach it
    (``gpt_tiny``: 11 MiB measured so, 11-14 MiB a worker in its compiled trials). 0 where it
    could not be measured."""
    return _beside_bare_rank(_WORKER, workload_json, imports, 0)


def epoch_copy(workload_json: str = "", imports: tuple[str, ...] = ()) -> tuple[int, bool]:
    """``epoch_copy_bytes`` of the workload's dataset, measured beside the bare rank
    (``_BARE_RANK``): (0, False) where it could not be measured."""
    return _beside_bare_rank(_COPIED, workload_json, imports, (0, False))


def _beside_bare_rank(
    found: dict[tuple[str, tuple[str, ...]], _Measured],
    workload_json: str,
    imports: tuple[str, ...],
    missing: _Measured,
) -> _Measured:
    """What the bare rank of ``workload_json`` measured into ``found`` (measured first where it
    has not run yet); ``missing`` where it could not be measured."""
    key = (workload_json, imports)
    if key not in found:
        bare_rank_bytes(workload_json, imports)
    return found.get(key, missing)
