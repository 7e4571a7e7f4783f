"""Real trials: rank processes, gloo process groups, DataLoader workers, failures."""

from __future__ import annotations

import pytest

from autotune.config import make_config
from autotune.result import TrialResult
from autotune.runner.launch import run_trial
from autotune.runner.request import TrialOptions
from autotune.runner.workload import WorkloadSpec
from tests.fixtures import io_bound
from tests.helpers import FEW

pytestmark = pytest.mark.usefixtures("no_leftover_processes")


def _trial(model: str, options: TrialOptions | None = None, **values: object) -> TrialResult:
    config = make_config({"global_batch_size": 16, "device": "cpu", **values})
    options = options or TrialOptions(
        warmup_steps=1, measured_steps=3, target_interval=0, timeout_s=120
    )
    return run_trial(config, WorkloadSpec(model=model), options)


def _assert_measured(result: TrialResult) -> None:
    assert result.status == "ok", result.message
    assert result.samples_per_s and result.samples_per_s > 0
    assert result.peak_memory_bytes and result.peak_memory_bytes > 50 << 20
    assert result.loss_finite
    assert result.measured_s > 0 and result.total_s > result.measured_s + result.warmup_s
    assert result.platform is not None and result.platform.backend == "gloo"


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_two_rank_trial_is_measured(parallel: str) -> None:
    result = _trial(
        "workloads.gpt:gpt_tiny", parallel=parallel, world_size=2, amp="bf16", checkpoint_segments=2
    )
    _assert_measured(result)
    assert len(result.ranks) == 2
    for rank in result.ranks:
        assert rank.diagnostics is not None
        assert rank.diagnostics.checkpointed_blocks == 2
        assert rank.diagnostics.repeated_blocks == 4
        assert rank.diagnostics.output_dtype == "bfloat16"
        assert len(rank.step_times_s) == 3


def test_fp16_hook_runs_on_sync_steps_only_and_optimizer_steps_once_per_accumulation() -> None:
    options = TrialOptions(warmup_steps=1, measured_steps=3, target_interval=0, timeout_s=120)
    result = _trial(
        "workloads.mlp:mlp_tiny",
        options,
        parallel="ddp",
        world_size=2,
        comm_hook="fp16",
        grad_accum_steps=4,
    )
    _assert_measured(result)
    for rank in result.ranks:
        diagnostics = rank.diagnostics
        assert diagnostics is not None
        # 1 warm-up + 3 measured + 1 that starts a new epoch (its cost is measured too)
        assert diagnostics.optimizer_steps == 5
        assert diagnostics.micro_steps == 20
        calls = diagnostics.comm_hook_calls_per_micro_step
        for step in range(5):
            accumulating, last = calls[step * 4 : step * 4 + 3], calls[step * 4 + 3]
            assert accumulating == [0, 0, 0]
            assert last >= 1  # one call per gradient bucket


def test_powersgd_compressing_on_gloo_ends_with_a_status() -> None:
    # PowerSGD that really compresses (from step 2) can abort a gloo rank with SIGABRT or leave
    # it hanging in a collective; whichever happens, the trial must end with a status within its
    # timeout and leave no process behind. When it runs, the hook ran on every synced step.
    # A healthy run takes about 5 s here: a hang costs the whole timeout, so it is kept short.
    options = TrialOptions(warmup_steps=1, measured_steps=3, target_interval=0, timeout_s=15)
    result = _trial(
        "workloads.mlp:mlp_tiny",
        options,
        parallel="ddp",
        world_size=2,
        comm_hook="powersgd",
        powersgd_start_iter=2,
    )
    assert result.status in ("ok", "crashed", "timed_out"), result.message
    assert result.total_s < 30
    if result.status == "crashed":
        assert "SIGABRT" in result.message
    if result.ok:
        assert result.ranks[0].diagnostics is not None
        assert all(c >= 1 for c in result.ranks[0].diagnostics.comm_hook_calls_per_micro_step)


@pytest.mark.parametrize(("start", "compressing"), [(2, True), (1000, False)])
def test_powersgd_sends_low_rank_factors_only_from_its_start_iteration(
    start: int, compressing: bool
) -> None:
    # One gloo rank: the hook runs on every synced backward whatever the world size, without
    # the two-rank gloo abort above. Compressing on gloo can still hang a step now and then
    # (seen once in a full CI run, in measured step 2; never in isolation): a hung or aborted
    # attempt is tried again, twice at most, and one attempt must finish and show the calls.
    options = TrialOptions(warmup_steps=1, measured_steps=3, target_interval=0, timeout_s=30)
    failures = []
    for _ in range(3):
        result = _trial(
            "workloads.mlp:mlp_tiny",
            options,
            parallel="ddp",
            world_size=1,
            comm_hook="powersgd",
            powersgd_start_iter=start,
            powersgd_rank=1,
        )
        if result.status not in ("timed_out", "crashed"):
            break
        failures.append(f"{result.status}: {result.message}")
    assert result.status == "ok", (result.message, failures)
    diagnostics = result.ranks[0].diagnostics
    assert diagnostics is not None and all(diagnostics.comm_hook_calls_per_micro_step)
    assert (diagnostics.powersgd_lowrank_calls > 0) is compressing


@pytest.mark.slow
def test_checkpointing_lowers_measured_peak_memory_on_the_transformer() -> None:
    options = TrialOptions(**FEW, timeout_s=300)
    plain = _trial("workloads.gpt:gpt_long_context", options, global_batch_size=8)
    checkpointed = _trial(
        "workloads.gpt:gpt_long_context", options, global_batch_size=8, checkpoint_segments=6
    )
    _assert_measured(plain)
    _assert_measured(checkpointed)
    assert plain.peak_memory_bytes and checkpointed.peak_memory_bytes
    assert checkpointed.peak_memory_bytes < 0.85 * plain.peak_memory_bytes


@pytest.mark.slow
def test_a_dataloader_worker_lowers_the_data_wait_share() -> None:
    # Reads that wait (a slow disk) and a step of a fixed time: inline, a step waits 32 ms for
    # its batch beside 50 ms of its own; a worker reads the next batch meanwhile. Loading that
    # computed instead (workloads.mlp:mlp_loading_bound, the benchmarks') read either way on a
    # 2-core box running other work: the worker and the rank then share the cores.
    options = TrialOptions(warmup_steps=2, measured_steps=10, target_interval=0, timeout_s=120)
    plain = _trial("tests.fixtures.io_bound:Net", options)
    loaded = _trial("tests.fixtures.io_bound:Net", options, num_workers=1, prefetch_factor=4)
    for result in (plain, loaded):
        assert result.status == "ok" and result.data_wait_share is not None, result.message
    expected = io_bound.READ_S * 16 / (io_bound.READ_S * 16 + io_bound.STEP_S)  # 0.39
    assert plain.data_wait_share > 0.6 * expected  # loading is its share of the step
    assert loaded.data_wait_share < 0.25 * expected, (plain.data_wait_share, loaded.data_wait_share)


def test_warm_up_consumes_the_batches_workers_prefetched() -> None:
    # 2 workers x prefetch 4 = 8 queued micro-batches = 4 optimizer steps at accumulation 2:
    # measured steps must not be served from that queue, or loading looks free.
    options = TrialOptions(**FEW, timeout_s=120)
    config = {"num_workers": 2, "prefetch_factor": 4, "grad_accum_steps": 2}
    result = _trial("tests.fixtures.models:Small", options, **config)
    assert result.status == "ok", result.message
    assert result.warmup_steps == 1 + 4 and result.measured_steps == 2
    diagnostics = result.ranks[0].diagnostics
    assert diagnostics is not None and diagnostics.optimizer_steps == 1 + 4 + 2 + 1  # boundary
    inline = _trial("tests.fixtures.models:Small", options, grad_accum_steps=2)
    assert inline.warmup_steps == 1


def test_persistent_workers_survive_epochs() -> None:
    # 256 samples / 16 per step = 16 steps an epoch; 40 steps cross two epoch boundaries, and
    # the step that measures one boundary starts a fourth epoch.
    options = TrialOptions(warmup_steps=1, measured_steps=39, target_interval=0, timeout_s=120)
    kept = _trial("tests.fixtures.models:Small", options, num_workers=1, persistent_workers=True)
    fresh = _trial("tests.fixtures.models:Small", options, num_workers=1)
    kept_pids = kept.ranks[0].diagnostics.dataloader_worker_pids  # type: ignore[union-attr]
    fresh_pids = fresh.ranks[0].diagnostics.dataloader_worker_pids  # type: ignore[union-attr]
    assert len(kept_pids) == len(fresh_pids) == 4
    assert len({tuple(p) for p in kept_pids}) == 1
    assert len({tuple(p) for p in fresh_pids}) == 4


def test_an_aborting_rank_is_a_crash_with_its_signal() -> None:
    # Beyond the executor contract (test_executor_contract.py): a local launcher sees the
    # signal, which Ray does not expose.
    result = _trial("tests.fixtures.models:Aborting", parallel="ddp", world_size=2)
    assert result.status == "crashed"
    assert "rank 1" in result.message and "SIGABRT" in result.message


def test_a_failed_trial_says_how_far_its_ranks_got_and_what_the_model_was_given() -> None:
    result = _trial("tests.fixtures.texts:Net")
    assert result.status == "error"
    assert result.message.startswith("rank 0: warm-up step 1: AttributeError")
    assert "(the model was given a tuple of 16 str as input 0, not a tensor" in result.message
    # the time before the failing step was measured: not shown as 0 beside the overhead
    assert result.startup_s > 0 and result.build_s > 0
    assert result.overhead_s >= result.startup_s + result.build_s


def test_ranks_output_is_headed_by_rank_and_one_line_where_none_printed() -> None:
    import io

    from autotune.runner.launch import write_rank_output

    def shown(texts: list[str | None]) -> str:
        out = io.StringIO()
        write_rank_output(out, texts)
        return out.getvalue()

    assert shown(["", " \n"]) == "--- the 2 rank(s) printed nothing ---\n"
    assert shown(["a", None]) == (
        "--- rank 0's output (below) ---\na\n--- rank 1's output (lost with its process) ---\n"
    )
