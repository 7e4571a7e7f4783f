"""The Ray executor beyond the shared contract: what it says when Ray was started by its caller."""

from __future__ import annotations

import pytest

from autotune.runner.platform import detect_platform
from tests.helpers import FEW

pytestmark = pytest.mark.usefixtures("ray_cluster")


def test_an_address_or_cpu_count_an_existing_ray_instance_overrides_is_reported() -> None:
    from autotune.runner.ray_executor import RayExecutor

    platform = detect_platform("cpu")
    joined = RayExecutor(platform, address="10.0.0.7:6379")
    assert any("'10.0.0.7:6379' is not used" in note for note in joined.notes)
    wider = RayExecutor(platform, num_cpus=64)  # the session's instance has 16 CPUs
    assert any("with 16 CPUs; the search asked for 64" in note for note in wider.notes)
    fitting = RayExecutor(platform, num_cpus=4)
    assert fitting.notes == []
    for executor in (joined, wider, fitting):
        executor.shutdown()


def test_why_ray_could_not_start_or_join_is_one_line_with_what_to_try() -> None:
    from autotune.runner.ray_executor import _init_failure

    refused = _init_failure(ConnectionError("Failed to connect"), "10.0.0.7:6379", "/w")
    assert refused.startswith("cannot join the Ray cluster at '10.0.0.7:6379' (Failed to connect)")
    assert "RAY_AUTH_MODE=token" in refused and "\n" not in refused
    too_big = _init_failure(ValueError("Package size (600 MiB) exceeds the maximum"), "h:1", "/w")
    assert too_big.startswith("cannot ship '/w' to the Ray cluster") and "--no-ship-code" in too_big
    local = _init_failure(RuntimeError("no space\\nleft"), None, None)
    assert local == "cannot start a local Ray instance: no space\\nleft"


@pytest.mark.parametrize(
    ("device", "compile", "reused"),
    [
        ("cuda", "off", True),
        ("cuda", "default", True),
        ("cuda", "reduce-overhead", False),
        ("cuda", "max-autotune", False),
        ("cpu", "reduce-overhead", True),
    ],
)
def test_a_gang_is_not_reused_after_cuda_graphs(device: str, compile: str, reused: bool) -> None:
    # CUDA graphs' pools live in the thread that ran the trial (seen on an H100: 38 GiB kept).
    from autotune.config import make_config
    from autotune.runner.ray_gang import reusable
    from autotune.runner.request import TrialOptions, TrialRequest
    from autotune.runner.workload import WorkloadSpec

    config = make_config({"global_batch_size": 8, "device": device, "compile": compile})
    spec = WorkloadSpec(model="m:M")
    request = TrialRequest(config=config, workload=spec, options=TrialOptions())
    assert reusable(request) is reused


@pytest.mark.slow
def test_a_rank_actor_runs_every_call_on_one_thread_and_answers_its_phase_meanwhile() -> None:
    """Trials that alternated between two threads of one actor measured ~10% apart by thread
    alone; the phase must still be readable while a trial runs (a hung trial reports it)."""
    import threading
    import time

    import ray

    from autotune.runner.ray_gang import _actor_class

    actor = _actor_class().remote()
    try:
        threads = {ray.get(actor.__ray_call__.remote(lambda _: threading.get_ident()))
                   for _ in range(6)}  # fmt: skip
        assert len(threads) == 1
        busy = actor.__ray_call__.remote(lambda _: time.sleep(3) or threading.get_ident())
        time.sleep(0.5)
        started = time.perf_counter()
        phase, running_s = ray.get(actor.where.remote(), timeout=2.0)
        assert phase == "starting" and running_s > 0.5  # in it since the actor started
        assert time.perf_counter() - started < 2.0  # answered while the call still sleeps
        assert ray.get(busy) in threads
    finally:
        ray.kill(actor)


def test_on_cpu_a_gang_serves_only_trials_that_leave_what_its_trials_left() -> None:
    # Inductor stays resident in the ranks: a plain DDP trial of gpt_tiny after a compiled one
    # in its gang measured 26% more than on a fresh gang; autocast's oneDNN kernels too (a
    # mixture of experts' fp32 DDP trial, 59% more after bf16 trials).
    from autotune.config import make_config
    from autotune.runner.ray_executor import RayExecutor
    from autotune.runner.ray_gang import Gang, gang_shape, leaves_behind
    from autotune.runner.request import TrialOptions, TrialRequest
    from autotune.runner.workload import WorkloadSpec

    def request(compile: str, amp: str = "off") -> TrialRequest:  # device auto: resolved later
        config = make_config({"global_batch_size": 8, "compile": compile, "amp": amp})
        return TrialRequest(
            config=config, workload=WorkloadSpec(model="m:M"), options=TrialOptions()
        )

    plain, compiled, bf16 = request("off"), request("default"), request("off", "bf16")
    assert leaves_behind(plain, "cpu") == () and leaves_behind(compiled, "cpu") == ("compiler",)
    assert leaves_behind(bf16, "cpu") == ("autocast kernels",)
    assert leaves_behind(request("default", "bf16"), "cpu") == ("compiler", "autocast kernels")
    for r in (compiled, bf16):  # the device's memory is what is measured
        assert leaves_behind(r, "cuda") == ()
    executor = RayExecutor.__new__(RayExecutor)  # the gang choice alone: nothing started
    executor.platform, executor.cpus_per_rank = detect_platform("cpu"), 1.0
    shape = gang_shape(plain, "cpu", 1.0)
    warm_plain = Gang(shape, None, [])
    warm_compiled = Gang(shape, None, [], left=("compiler",))
    warm_bf16 = Gang(shape, None, [], left=("autocast kernels",))
    executor._idle = [warm_compiled, warm_bf16, warm_plain]
    assert executor._gang(shape, ()) is warm_plain
    assert executor._idle == [warm_compiled, warm_bf16]
    assert executor.fits_now(compiled) and executor.fits_now(bf16)
    assert executor._gang(shape, ("autocast kernels",)) is warm_bf16
    assert executor._gang(shape, ("compiler",)) is warm_compiled


def test_debug_copies_each_ranks_output_of_each_trial() -> None:
    # A Ray actor's prints and a failure's traceback went to a log file of Ray's session, so a
    # search's --debug showed none of them (the trial command's local ranks did).
    import io

    from autotune.config import make_config
    from autotune.runner.executor import run_to_end
    from autotune.runner.ray_executor import RayExecutor
    from autotune.runner.request import TrialOptions, TrialRequest
    from autotune.runner.workload import WorkloadSpec

    shown = io.StringIO()
    executor = RayExecutor(detect_platform("cpu"), cpus_per_rank=1.0, rank_output=shown)
    config = make_config({"global_batch_size": 8, "device": "cpu", "parallel": "ddp",
                          "world_size": 2})  # fmt: skip
    options = TrialOptions(**FEW, timeout_s=120)

    def run(model: str) -> str:
        request = TrialRequest(config=config, workload=WorkloadSpec(model=model), options=options)
        run_to_end(executor, request)
        said = shown.getvalue()
        shown.seek(0)
        shown.truncate()
        return said

    try:
        said = run("tests.fixtures.models:Chatty")
        for rank in (0, 1):
            below = said.split(f"--- rank {rank}'s output (below) ---\n")[1].split("---")[0]
            assert "building Chatty\n" in below and "forward of (4, 8)" in below
        again = run("tests.fixtures.models:Chatty")  # the same gang: its model is reused
        assert "forward of (4, 8)" in again and "building Chatty" not in again
        failed = run("tests.fixtures.models:Raising")
        assert "Traceback (most recent call last)" in failed
        assert "shape mismatch in layer 3" in failed
    finally:
        executor.shutdown()
