"""What the machine is and computes natively (oneDNN's private checks, pinned, and their
fallback), and what a rank process holds before its workload."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from autotune.runner.platform import AUTOCASTS, native_autocast


def test_onednns_checks_exist_and_answer_a_bool() -> None:
    # Private ops: the recipe's autocast on a CPU rests on them (platform.native_autocast).
    for check in ("_is_mkldnn_bf16_supported", "_is_mkldnn_fp16_supported"):
        assert isinstance(getattr(torch.ops.mkldnn, check)(), bool)


def test_a_cpu_is_native_in_what_onednn_says_and_a_gpu_in_both() -> None:
    native, told = native_autocast("cpu")
    checks = ("_is_mkldnn_bf16_supported", "_is_mkldnn_fp16_supported")
    answers = [getattr(torch.ops.mkldnn, check)() for check in checks]
    expected = tuple(a for a, native in zip(AUTOCASTS, answers, strict=True) if native)
    assert native == expected and told == "oneDNN's check of this CPU's instructions"
    if not torch.cuda.is_available():
        assert native_autocast("cuda")[0] == ("bf16", "fp16")  # nothing to ask


@pytest.mark.parametrize(
    ("capability", "native"), [((7, 0), ("fp16",)), ((7, 5), ("fp16",)), ((8, 0), AUTOCASTS)]
)
def test_a_gpu_before_capability_8_computes_bf16_by_emulation_only(
    capability: tuple[int, int], native: tuple[str, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A V100 or a T4: torch.cuda.is_bf16_supported() answers True (emulated), so the space
    # keeps bf16; the recipe, as an engineer there, takes fp16.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *_: capability)
    assert native_autocast("cuda") == (
        native,
        f"CUDA capability {capability[0]}.{capability[1]}: "
        + ("bf16 and fp16 native" if "bf16" in native else "bf16 native from 8.0 on"),
    )


def test_without_the_checks_the_fallback_takes_neither_and_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(torch.ops, "mkldnn", object())
    native, told = native_autocast("cpu")
    assert native == () and told.startswith("fallback: ")


def test_the_bare_rank_trains_a_step_and_holds_more_than_its_imports(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The CPU memory model's first guess; a code string that failed would give 0 silently.
    # A search begins it while Ray starts, and collects it when the memory model asks.
    import subprocess
    import sys

    from autotune.runner import memory

    monkeypatch.setattr(memory, "_BARE", {})
    monkeypatch.setattr(memory, "_COMPILED", {})
    monkeypatch.setattr(memory, "_WORKER", {})
    monkeypatch.setattr(memory, "_COPIED", {})
    monkeypatch.setattr(memory, "_STARTED", {})
    memory.start_bare_rank(compiled=True)
    memory.start_bare_rank()  # one measurement, however often begun
    ((started, compiled),) = memory._STARTED.values()
    code = "import torch; print(open('/proc/self/status').read().split('VmHWM:')[1].split()[0])"
    imports = int(subprocess.run([sys.executable, "-c", code], capture_output=True,
                                 text=True, check=True).stdout) * 1024  # fmt: skip
    assert imports + 32 * 2**20 < memory.bare_rank_bytes() < 4 * 2**30
    assert compiled and started.returncode == 0 and memory._STARTED == {}  # collected
    # what compiling adds to a trial's window, from the same process: Inductor's modules and
    # caches (53 MiB on the Intel Xeon of docs/benchmarks.md)
    assert 8 * 2**20 < memory.compile_share_bytes() < 1024 * 2**20
    # one DataLoader worker's private pages while the rank trains (9-11 MiB here)
    assert 2 * 2**20 < memory.worker_share_bytes() < 256 * 2**20


def test_the_bare_rank_holds_the_workloads_data_but_not_its_parameters(tmp_path: Path) -> None:
    # The first guess counts what a rank holds beside its tensors: the dataset (64 MiB here) is
    # held, the model (256 MiB of parameters, which the trace counts) is built on meta.
    from autotune.runner.memory import (
        bare_rank_bytes,
        epoch_copy,
        start_bare_rank,
        worker_share_bytes,
    )
    from autotune.runner.workload import WorkloadSpec

    (tmp_path / "held.py").write_text(
        "import torch\n"
        "class Wide(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.layer = torch.nn.Linear(8192, 8192)\n"
        "def autotune_dataset(model):\n"
        "    return torch.utils.data.TensorDataset(torch.ones(16 * 2**20 // 64, 64))\n"
    )
    spec = WorkloadSpec(model=f"{tmp_path}/held.py:Wide").model_dump_json()
    missing = WorkloadSpec(model=f"{tmp_path}/missing.py:Wide").model_dump_json()
    for workload in (spec, "", missing):  # measured side by side, as a search starts them early
        start_bare_rank(workload)
    held = bare_rank_bytes(spec) - bare_rank_bytes()
    assert 60 * 2**20 < held < 160 * 2**20
    # a worker over that dataset: its own pages, not the dataset the rank already holds
    assert 2 * 2**20 < worker_share_bytes(spec) < 60 * 2**20
    copied, whole = epoch_copy(spec)  # its samples are one tensor's: nothing copied
    assert whole and copied < 8 * 2**20
    # a reference that cannot load leaves the rank without it, measured all the same
    assert bare_rank_bytes(missing) == bare_rank_bytes()


def test_a_model_that_will_not_build_on_meta_leaves_its_module_imported(tmp_path: Path) -> None:
    from autotune.runner.memory import hold_workload
    from autotune.runner.workload import WorkloadSpec

    (tmp_path / "valued.py").write_text(
        "import torch\n"
        "IMPORTED = True\n"
        "class Valued(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.layer = torch.nn.Linear(4, 4)\n"
        "        self.scale = float(self.layer.weight.abs().max())  # a value: not on meta\n"
    )
    held = hold_workload(WorkloadSpec(model=f"{tmp_path}/valued.py:Valued").model_dump_json())
    assert len(held) == 1  # no model, no dataset: the module and what it imported
    module, target = held[0]
    assert module.IMPORTED and target.__name__ == "Valued"


def test_a_ranks_children_are_found_whichever_thread_forked_them() -> None:
    # A Ray actor runs its trials on a thread of its own, and /proc lists a child under the
    # thread that forked it: read from the main thread alone, a Ray trial's DataLoader workers
    # were never counted in its peak.
    import subprocess
    import sys
    import threading

    from autotune.runner.memory import child_pids

    started: list[subprocess.Popen[bytes]] = []
    forked, checked = threading.Event(), threading.Event()

    def fork() -> None:  # the thread stays: a thread's children pass on when it ends
        started.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"]))
        forked.set()
        checked.wait(30)

    thread = threading.Thread(target=fork)
    thread.start()
    forked.wait(30)
    try:
        assert started[0].pid in child_pids()
    finally:
        checked.set()
        thread.join()
        started[0].kill()
        started[0].wait()


def test_workers_are_charged_the_pages_their_rank_wrote_after_forking_them_once() -> None:
    # The rank writes 64 MiB after forking two workers: their old copies are left to both, so
    # private to neither (counted by private pages: ~0, where one worker showed 64 MiB).
    import subprocess
    import sys

    code = """
import os, signal, time
from autotune.runner.memory import _rollup_kib, workers_bytes
buffer = bytearray(os.urandom(64 * 2**20))
children = []
for _ in range(2):
    pid = os.fork()
    if pid == 0:
        time.sleep(60)
        os._exit(0)
    children.append(pid)
for i in range(0, len(buffer), 4096):
    buffer[i] ^= 1  # the rank writes every page again: a copy of its own
private = sum(_rollup_kib(p)["Private_Dirty"] for p in children) * 1024
print(workers_bytes(children), private)
for pid in children:
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    charged, private = map(int, out.stdout.split())
    assert 60 * 2**20 < charged < 80 * 2**20, (charged, private)
    assert private < 16 * 2**20  # what the private pages alone said


def test_a_workers_copy_of_a_dataset_of_python_objects_is_measured_and_of_tensors_is_not() -> None:
    # Reading a sample writes the reference counts of its objects: a worker copies their pages.
    import subprocess
    import sys

    code = """
import torch
from autotune.runner.memory import epoch_copy_bytes
strings = [f"sample number {i} " * 4 for i in range(400_000)]
print(*epoch_copy_bytes(strings), *epoch_copy_bytes(torch.randn(400_000, 16)))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    strings, whole, tensor, tensor_whole = out.stdout.split()
    assert whole == tensor_whole == "True"
    assert 35 * 2**20 < int(strings) < 90 * 2**20  # 400,000 strings of ~100 bytes
    assert int(tensor) < 4 * 2**20  # its buffer is not copied
