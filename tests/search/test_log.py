"""The memory a trial is judged by."""

from __future__ import annotations

from autotune.config import make_config
from autotune.result import RankReport, TrialResult
from autotune.search.log import memory_used

GIB = 1 << 30


def _result(device: str, *ranks: RankReport) -> TrialResult:
    config = make_config({"global_batch_size": 8, "device": device})
    return TrialResult(config=config, status="ok", ranks=list(ranks))


def test_cuda_is_judged_by_what_the_allocator_reserved() -> None:
    # CUDA graphs' private pools: 5 GiB allocated at the peak, 43 GiB taken from the device.
    rank = RankReport(rank=0, status="ok", peak_memory_bytes=5 * GIB, peak_reserved_bytes=43 * GIB)
    assert memory_used(_result("cuda", rank), "cuda") == 43 * GIB


def test_cuda_takes_the_largest_rank_and_cpu_adds_the_ranks_up() -> None:
    ranks = [
        RankReport(rank=0, status="ok", peak_memory_bytes=2 * GIB, peak_reserved_bytes=3 * GIB),
        RankReport(rank=1, status="ok", peak_memory_bytes=4 * GIB, peak_reserved_bytes=5 * GIB),
    ]
    assert memory_used(_result("cuda", *ranks), "cuda") == 5 * GIB
    cpu = [RankReport(rank=i, status="ok", peak_memory_bytes=GIB) for i in range(2)]
    assert memory_used(_result("cpu", *cpu), "cpu") == 2 * GIB


def test_a_cuda_record_keeps_the_allocated_peak_beside_the_reserved_one() -> None:
    # The traced tensors are held to the allocator's allocated peak, the search to its reserve.
    from autotune.search.log import to_record

    ranks = [
        RankReport(rank=0, status="ok", peak_memory_bytes=2 * GIB, peak_reserved_bytes=3 * GIB),
        RankReport(rank=1, status="ok", peak_memory_bytes=4 * GIB, peak_reserved_bytes=5 * GIB),
    ]
    cuda = to_record(0, "search", _result("cuda", *ranks), "cuda", 8 * GIB)
    assert (cuda.memory_used_bytes, cuda.allocated_bytes) == (5 * GIB, 4 * GIB)
    cpu = [RankReport(rank=i, status="ok", peak_memory_bytes=GIB) for i in range(2)]
    assert to_record(0, "search", _result("cpu", *cpu), "cpu", 8 * GIB).allocated_bytes is None


def test_a_pruned_trial_is_told_its_memory_where_read_and_no_verdict_where_not() -> None:
    import optuna

    from autotune.records import TrialRecord
    from autotune.search.log import StudyLog

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    log = StudyLog(optuna.create_study(direction="maximize"), limit_bytes=GIB)
    config = make_config({"global_batch_size": 8, "device": "cpu"})
    ended_itself = TrialRecord(
        number=-1, role="search", status="pruned", config=config, samples_per_s=5.0,
        memory_used_bytes=GIB // 2, feasible=True,
    )  # fmt: skip
    cut = TrialRecord(number=-1, role="search", status="pruned", config=config, samples_per_s=2.0)
    for record in (ended_itself, cut):
        log.write(record, log.study.ask())
    first, second = log.study.trials
    assert first.state == second.state == optuna.trial.TrialState.PRUNED
    assert first.constraints == {"memory": -0.5}  # fits: a memory measurement to learn from
    assert second.constraints == {} and second.intermediate_values == {0: 2.0}  # not "over"
    again = TrialRecord(
        number=-1, role="search", status="duplicate", config=config, samples_per_s=2.0,
        message="same configuration as trial 1 (pruned)",
    )  # fmt: skip
    log.write(again, log.study.ask())  # the sampler hears the earlier outcome, not a failure
    third = log.study.trials[-1]
    assert third.state == optuna.trial.TrialState.PRUNED and third.intermediate_values == {0: 2.0}
