"""Whether a micro-batch's loss couples its samples: told from three forwards of two samples."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import default_collate

from autotune.config import TrainConfig
from autotune.runner.coupling import loss_couples_samples
from autotune.runner.workload import WorkloadSpec, build_workload, first_samples
from autotune.search.coupled import coupling, loss_coupling
from autotune.search.recipe import Coupling, numerics_changes, simplicity


def _couples(reference: str) -> bool | str:
    shape = (3, 8, 8) if "norms" in reference else None  # a model without data of its own
    workload = build_workload(WorkloadSpec(model=reference, input_shape=shape))
    samples = first_samples(workload.dataset, 2)
    collate = workload.collate or default_collate
    return loss_couples_samples(workload.model, samples, collate, workload.loss)


@pytest.mark.parametrize(
    ("reference", "couples"),
    [
        ("tests.fixtures.contrastive:TwoTowers", True),  # in-batch negatives
        ("tests.fixtures.padded:Tagger", True),  # a mean over the tokens of padded samples
        ("tests.fixtures.models:Small", False),  # cross-entropy of each sample, averaged
        ("tests.fixtures.norms:Normed", False),  # batch norms are told by their class
        ("tests.fixtures.graphs:Classifier", False),  # one graph a sample, however batched
        ("tests.fixtures.contrastive:Sampled", "draws at random"),  # cannot be told: why
        # its losses in training, its detections in eval mode (torchvision's detection models):
        # the detections' mean square differed, and the losses were said to couple
        ("tests.fixtures.detection:Detector", "its output in eval mode is not what it trains on"),
    ],
)
def test_a_loss_that_couples_its_samples_is_told_apart(reference: str, couples: bool | str) -> None:
    told = _couples(reference)
    assert told is couples if isinstance(couples, bool) else couples in str(told)


@pytest.mark.parametrize(
    ("reference", "shape"),
    [("tests.fixtures.contrastive:TwoTowers", None), ("tests.fixtures.norms:Normed", (3, 8, 8))],
)
def test_the_check_leaves_the_model_as_it_found_it(
    reference: str, shape: tuple[int, ...] | None
) -> None:
    # a training-mode forward tells which loss it trains on: a batch norm's statistics move
    workload = build_workload(WorkloadSpec(model=reference, input_shape=shape))
    before = {k: v.clone() for k, v in workload.model.state_dict().items()}
    samples = first_samples(workload.dataset, 2)
    collate = workload.collate or default_collate
    assert loss_couples_samples(workload.model, samples, collate, workload.loss) is not None
    assert workload.model.training
    assert all(torch.equal(before[k], v) for k, v in workload.model.state_dict().items())


def test_the_probe_builds_the_model_and_reads_the_first_samples() -> None:
    towers = WorkloadSpec(model="tests.fixtures.contrastive:TwoTowers")
    assert loss_coupling(towers) is True
    assert coupling(towers) == Coupling(batch_norm=None, loss=True)
    assert coupling(WorkloadSpec(model="tests.fixtures.models:Small")) is None


def test_a_loss_that_cannot_be_told_is_said_in_the_searchs_header() -> None:
    from autotune.search.driver import _coupling_lines

    sampled = coupling(WorkloadSpec(model="tests.fixtures.contrastive:Sampled"))
    assert sampled is not None and not sampled  # nothing couples that is known...
    assert "draws at random" in sampled.loss_untold  # ...and what was not told, why
    line = _coupling_lines(sampled)["loss"]
    assert line.startswith("not told whether it couples each micro-batch's samples (its loss ")
    assert line.endswith("is taken to train the same")
    base = TrainConfig(global_batch_size=8, device="cpu")
    split = base.model_copy(update={"grad_accum_steps": 2})
    assert numerics_changes(split, sampled, base) == []  # taken to train the same, as said


def test_a_coupled_loss_over_other_samples_than_the_baselines_is_a_numerics_change() -> None:
    base = TrainConfig(global_batch_size=32, device="cpu")
    ddp = TrainConfig(global_batch_size=32, parallel="ddp", world_size=2, device="cpu")
    accumulating = base.model_copy(update={"grad_accum_steps": 4})
    loss = Coupling(loss=True)
    assert numerics_changes(ddp, loss, base) == ["loss_samples=16 (the baseline's 32)"]
    assert numerics_changes(accumulating, loss, base) == ["loss_samples=8 (the baseline's 32)"]
    assert numerics_changes(base, loss, base) == []
    both = Coupling(batch_norm="synced", loss=True)  # SyncBatchNorm keeps 32; the loss does not
    assert numerics_changes(ddp, both, base) == ["loss_samples=16 (the baseline's 32)"]
    assert simplicity(ddp, base, loss)[0] == 1 and simplicity(ddp, base)[0] == 0


def test_whether_the_loss_gathers_is_traced_for_the_trials_device() -> None:
    # FlexAttention trains on CUDA, not on a CPU: traced for a CPU, a CUDA search took the
    # trace's refusal for a loss that does not gather
    spec = WorkloadSpec(model="tests.fixtures.contrastive:FlexGatheredTowers")
    assert coupling(spec, "cuda") == Coupling(loss=True, loss_gathered=True)
    assert coupling(spec) == Coupling(loss=True)  # a CPU trace stops at the refusal, as before


def test_a_loss_over_negatives_gathered_from_every_rank_couples_them_all() -> None:
    from autotune.search.driver import _coupling_lines

    # the unguarded gather needs a group: the check runs it in a real one of one
    gathered = coupling(WorkloadSpec(model="tests.fixtures.contrastive:GatheredTowers"))
    guarded = coupling(WorkloadSpec(model="tests.fixtures.contrastive:GuardedTowers"))
    assert gathered == guarded == Coupling(loss=True, loss_gathered=True)
    assert not torch.distributed.is_initialized()
    line = _coupling_lines(gathered)["loss"]
    assert line.startswith("over every rank's micro-batches together (it gathers from every")
    base = TrainConfig(global_batch_size=32, device="cpu")
    ddp = TrainConfig(global_batch_size=32, parallel="ddp", world_size=2, device="cpu")
    assert numerics_changes(ddp, gathered, base) == []  # 2 x 16 gathered: the baseline's 32
    accumulating = ddp.model_copy(update={"grad_accum_steps": 2})
    assert numerics_changes(accumulating, gathered, base) == ["loss_samples=16 (the baseline's 32)"]


def test_a_forward_that_asks_for_a_group_is_held_as_fsdps_bf16_parameters_hold_it() -> None:
    from autotune.search.refusals import fsdp_bf16_refusals

    spec = WorkloadSpec(model="tests.fixtures.contrastive:GatheredCentred")
    refusals = fsdp_bf16_refusals(spec)  # before: no group, so no verdict on the dtypes
    assert [r.value for r in refusals] == ["bf16", "bf16-reduce-fp32"]
    assert "same dtype" in refusals[0].reason
    assert not torch.distributed.is_initialized()


def test_a_forward_slower_than_the_budget_leaves_the_loss_unchecked() -> None:
    workload = build_workload(WorkloadSpec(model="tests.fixtures.contrastive:TwoTowers"))
    samples = first_samples(workload.dataset, 2)
    check = (workload.model, samples, default_collate, workload.loss)
    assert loss_couples_samples(*check, budget_s=60.0) is True
    slow = loss_couples_samples(*check, budget_s=0.0)  # any forward takes longer
    assert isinstance(slow, str) and slow.startswith("a forward of two samples took ")


def test_float64_tells_a_token_mean_that_float32_cannot() -> None:
    # A freshly initialised model gives every token about the same loss: the token mean over
    # padded samples of 4 and 11 tokens moves the pair's loss by less than float32's tolerance
    # (a Hugging Face GPT-2 of vocabulary 500: 7.7e-4 of it).
    workload = build_workload(WorkloadSpec(model="tests.fixtures.padded:FreshTagger"))
    samples = first_samples(workload.dataset, 2)
    check = (workload.model, samples, workload.collate, workload.loss)
    assert loss_couples_samples(*check) is False
    assert loss_couples_samples(*check, float64=True) is True
    assert next(workload.model.parameters()).dtype == torch.float64  # converted in place


def test_a_forward_counted_over_the_operations_budget_is_not_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from autotune.search import coupled, meta_build

    towers = WorkloadSpec(model="tests.fixtures.contrastive:TwoTowers")
    batch = default_collate(list(meta_build.read_samples(towers, 2) or ()))
    flops = coupled._meta_forward_flops(meta_build.meta_model(towers.model)[1], batch)
    assert flops is not None and 0 < flops < coupled.COUPLING_FORWARD_FLOPS
    monkeypatch.setattr(coupled, "COUPLING_FORWARD_FLOPS", flops - 1)
    told = loss_coupling(towers)
    assert isinstance(told, str) and f"counts {flops:.1e} operations, over the " in told
    monkeypatch.setattr(coupled, "COUPLING_BUILD_BYTES", 1)  # the model's size, before anything
    assert "the model holds 0.0 GiB, over the " in str(loss_coupling(towers))
