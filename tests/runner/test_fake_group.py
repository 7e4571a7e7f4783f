"""A model whose step calls ``torch.distributed`` (negatives gathered from every rank): a
one-process trial gives it a group of one, and the trace a fake one (``runner.fake_group``, a
private test backend of PyTorch's, pinned here)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from autotune.config import TrainConfig
from autotune.errors import NO_GROUP_HERE, TARGET_AS_INPUT
from autotune.runner.fake_group import NO_GROUP, fake_group
from autotune.runner.fake_memory import GROUP_TRACED, trace_step
from autotune.runner.launch import run_trial
from autotune.runner.request import TrialOptions
from autotune.runner.session import prepare
from autotune.runner.workload import WorkloadSpec, build_workload
from autotune.search.memory_model import MemoryModel
from tests.helpers import FEW

GATHERED = WorkloadSpec(model="tests.fixtures.contrastive:GatheredTowers")
PLAIN = WorkloadSpec(model="tests.fixtures.contrastive:TwoTowers")
SHORT = TrialOptions(**FEW, min_measure_s=0)


def test_the_fake_group_passes_fake_tensors_through_its_collectives_and_is_left() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    with pytest.raises(ValueError, match=NO_GROUP):
        dist.get_world_size()
    with fake_group(4):
        assert dist.get_world_size() == 4 and dist.get_rank() == 0
        with FakeTensorMode():
            x = torch.randn(8, 16)
            out = [torch.zeros_like(x) for _ in range(4)]
            dist.all_gather(out, x)
            dist.all_reduce(x)
            assert all(o.shape == x.shape == (8, 16) for o in out)
    assert not dist.is_initialized()


def test_a_trace_leaves_the_callers_excepthook_as_it_was() -> None:
    # init_process_group wraps sys.excepthook ("[rank0]: " before every line) and destroying
    # the group leaves it: each trace of a plan wrapped the caller's hook once more
    import sys

    from autotune.runner.fake_group import group_of_one

    hook = sys.excepthook
    trace_step(PLAIN, 4)  # in a fake group of one
    with fake_group(2):
        assert sys.excepthook is not hook  # torch's own, while the group lives
    with group_of_one():
        pass
    assert sys.excepthook is hook


def test_a_step_gathering_from_every_rank_is_traced_as_one_rank_of_the_configs() -> None:
    plain, gathered = trace_step(PLAIN, 8), trace_step(GATHERED, 8)  # raised NO_GROUP before
    assert (plain.group_world, gathered.group_world) == (1, 1)
    assert gathered.parameters_bytes == plain.parameters_bytes
    # one rank's gathered rows again, a copy of 8 x 16 floats a tower, and no more
    assert 0 <= gathered.backward_bytes - plain.backward_bytes <= 4 * 8 * 16 * 4
    four = trace_step(GATHERED, 8, world_size=4)
    # backward holds the 32 x 32 logits over every rank's rows, not one rank's 8 x 8
    assert four.group_world == 4
    assert four.backward_bytes - gathered.backward_bytes >= (32**2 - 8**2) * 4
    assert trace_step(PLAIN, 8, world_size=4).backward_bytes == plain.backward_bytes
    assert not dist.is_initialized()


def test_the_memory_model_traces_it_among_the_configs_ranks_and_says_so() -> None:
    model = MemoryModel(GATHERED, "cpu")
    ddp = TrainConfig(global_batch_size=32, parallel="ddp", world_size=4, device="cpu")
    single = TrainConfig(global_batch_size=8, device="cpu")
    assert model.tensor_peak(ddp).group_world == 4  # type: ignore[union-attr]
    assert model.tensor_peak(single).group_world == 1  # type: ignore[union-attr]
    assert GROUP_TRACED in (model.assumption or "")
    plain = MemoryModel(PLAIN, "cpu")  # one trace serves every world size
    assert plain.tensor_peak(ddp).group_world == 1  # type: ignore[union-attr]
    assert plain.assumption is None


def test_a_gather_guarded_by_the_world_size_is_traced_as_ddp_runs_it() -> None:
    guarded = MemoryModel(WorkloadSpec(model="tests.fixtures.contrastive:GuardedTowers"), "cpu")
    ddp = TrainConfig(global_batch_size=32, parallel="ddp", world_size=4, device="cpu")
    peak, gathered = guarded.tensor_peak(ddp), MemoryModel(GATHERED, "cpu").tensor_peak(ddp)
    assert peak is not None and gathered is not None and peak.group_world == 4
    assert peak.backward_bytes == gathered.backward_bytes


def test_a_one_process_trial_of_it_joins_a_group_of_one_that_apply_leaves_to_the_script() -> None:
    config = TrainConfig(global_batch_size=8, device="cpu")
    result = run_trial(config, GATHERED, SHORT)  # failed before: no default group
    assert result.status == "ok", result.message
    workload = build_workload(GATHERED)
    training = prepare(config, workload.model, workload.dataset)  # a user's script's own
    try:
        assert not dist.is_initialized()
    finally:
        training.close()


def test_sync_batch_norms_on_a_cpu_train_one_process_without_a_group() -> None:
    # a group of one would make them refuse the CPU's input
    config = TrainConfig(global_batch_size=8, device="cpu")
    result = run_trial(config, WorkloadSpec(model="tests.fixtures.synced:synced"), SHORT)
    assert result.status == "ok", result.message


def test_beside_them_a_call_that_needs_a_group_fails_saying_why() -> None:
    config = TrainConfig(global_batch_size=8, device="cpu")
    result = run_trial(config, WorkloadSpec(model="tests.fixtures.synced:SyncedScaled"), SHORT)
    assert result.status == "error"
    assert f"({NO_GROUP_HERE}, and holds SyncBatchNorm, which on a CPU refuses" in result.message
    assert TARGET_AS_INPUT not in result.message


def test_without_the_fake_backend_the_step_is_traced_without_a_group(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from autotune.runner import fake_group

    assert fake_group._fake_backend()  # this torch has it
    monkeypatch.setattr(fake_group, "_fake_backend", lambda: False)
    assert trace_step(PLAIN, 8).group_world == 0  # the fallback: as before the backend
