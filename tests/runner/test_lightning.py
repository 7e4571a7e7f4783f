"""A LightningModule is trained as Lightning's Trainer trains it: its training step's loss and
its configure_optimizers' optimizer, not its forward with the default loss and AdamW."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from autotune.api import run_trial
from autotune.apply import prepare
from autotune.config import TrainConfig
from autotune.errors import WorkloadError
from autotune.runner.lightning import LightningStep, is_lightning_module, only_optimizer
from autotune.runner.optimizer import chosen_optimizer
from autotune.runner.training import WHOLE_BATCH, forward_keywords, split_batch
from autotune.runner.workload import (
    WorkloadSpec,
    build_workload,
    describe_optimizer,
    load_model,
    model_optimizer,
)
from autotune.search.meta_build import configures_optimizer, data_source
from tests.fixtures import lit
from tests.helpers import FEW


def test_the_step_is_the_modules_training_step_on_the_whole_batch() -> None:
    _, step = load_model("tests.fixtures.lit:Classifier")
    assert isinstance(step, LightningStep) and is_lightning_module(step.module)
    assert not is_lightning_module(torch.nn.Linear(2, 2))
    assert forward_keywords(step) is WHOLE_BATCH
    x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
    assert split_batch((x, y), WHOLE_BATCH) == (((x, y),), {}, None)
    logits = step.module(x)
    expected = F.cross_entropy(logits, y) + lit.PENALTY * logits.pow(2).mean()
    assert torch.allclose(step((x, y)), expected)  # the penalty too: not the forward's loss
    assert step.batch_idx == 1


def test_the_optimizer_is_the_one_configure_optimizers_returns() -> None:
    workload = build_workload(WorkloadSpec(model="tests.fixtures.lit:Classifier"))
    assert workload.optimizer is None  # no --optimizer, no autotune_optimizer: the module's
    factory = model_optimizer(workload.model)
    assert factory is not None
    optimizer = factory(workload.model.parameters())
    assert type(optimizer) is torch.optim.SGD and optimizer.defaults["momentum"] == 0.9
    held = {id(p) for group in optimizer.param_groups for p in group["params"]}
    assert held == {id(p) for p in workload.model.parameters()}  # this instance's parameters
    assert describe_optimizer(WorkloadSpec(model="tests.fixtures.lit:Classifier")) == (
        "the LightningModule's configure_optimizers"
    )


def test_the_users_optimizer_comes_before_the_modules_and_the_modules_before_adamw() -> None:
    _, step = load_model("tests.fixtures.lit:Classifier")
    params = list(step.parameters())

    def users(parameters: object) -> torch.optim.Optimizer:
        return torch.optim.Adagrad(params)

    assert type(chosen_optimizer(users, step)(params)) is torch.optim.Adagrad
    assert type(chosen_optimizer(None, step)(params)) is torch.optim.SGD
    plain = chosen_optimizer(None, torch.nn.Linear(2, 2), learning_rate=0.5)(params)
    assert type(plain) is torch.optim.AdamW and plain.defaults["lr"] == 0.5


def test_a_factory_built_module_is_said_to_configure_its_optimizer() -> None:
    # the reference names a function: only the model it builds tells (the probe builds it)
    spec = WorkloadSpec(model="tests.fixtures.lit:make")
    assert describe_optimizer(spec).startswith("default AdamW")
    assert configures_optimizer(spec.model) and not configures_optimizer(
        "tests.fixtures.models:Small"
    )
    assert describe_optimizer(spec, configures=True) == "the LightningModule's configure_optimizers"


def test_apply_trains_a_module_as_its_trials_did() -> None:
    # a user's loop given the LightningModule itself runs the training step and its optimizer
    config = TrainConfig(global_batch_size=16, device="cpu")
    module = lit.Classifier()
    training = prepare(config, module, lit.autotune_dataset(module))
    assert isinstance(training.model, LightningStep) and training.model.module is module
    assert type(training.optimizer) is torch.optim.SGD
    x, y = next(iter(training.loader))
    logits = module(x)
    expected = F.cross_entropy(logits, y) + lit.PENALTY * logits.pow(2).mean()
    assert training.model((x, y)).item() == pytest.approx(expected.item())
    stats = training.step(training.batches())
    assert stats.loss == stats.loss
    training.close()


def test_configure_optimizers_forms_give_their_one_optimizer() -> None:
    params = [torch.nn.Parameter(torch.ones(2))]
    sgd = torch.optim.SGD(params, lr=0.1)
    for form in (sgd, [sgd], ([sgd], []), {"optimizer": sgd}, [{"optimizer": sgd}]):
        assert only_optimizer(form) is sgd
    with pytest.raises(WorkloadError, match="returned 2 optimizers"):
        only_optimizer([sgd, torch.optim.SGD(params, lr=0.1)])
    with pytest.raises(WorkloadError, match=r"returned a NoneType, expected a torch\.optim"):
        only_optimizer(None)


def test_a_step_that_skips_its_batch_is_said_to_in_one_line() -> None:
    step = LightningStep(lit.Skipping())
    batch = (torch.randn(8, 16), torch.randint(0, 4, (8,)))
    assert step(batch).dim() == 0  # batch 0 trains
    with pytest.raises(WorkloadError) as error:
        step(batch)
    assert str(error.value) == (
        "Skipping.training_step returned None for batch 1 (Lightning skips such a batch): a "
        "trial runs and times the step of every batch; return the loss for each"
    )


def test_a_module_that_optimizes_by_hand_is_refused_in_one_line() -> None:
    with pytest.raises(WorkloadError) as error:
        load_model("tests.fixtures.lit:ByHand")
    assert "automatic_optimization = False" in str(error.value)
    assert "\n" not in str(error.value)


@pytest.mark.slow
def test_trials_train_the_training_steps_loss_with_the_configured_optimizer() -> None:
    two = {"global_batch_size": 16, "world_size": 2, "device": "cpu"}
    for model, parallel, optimizer in (
        ("Classifier", "ddp", "SGD"),
        ("Scheduled", "fsdp", "RMSprop"),
    ):
        result = run_trial(f"tests.fixtures.lit:{model}", {**two, "parallel": parallel}, **FEW)
        assert result.status == "ok", result.message
        assert result.optimizer == optimizer
        assert result.loss_rule.endswith(", returned by the LightningModule's training_step")


def test_a_compiled_step_is_not_compiled_again_for_each_batch_index() -> None:
    # The batch index read as the step's int attribute was a constant compile guarded on: the
    # forward compiled again every step up to dynamo's limit (164 ms a step of a small
    # classifier under compile, 1.4 ms with the index fixed). Dynamo's frame counter (private,
    # as ``rank._compiled_graphs`` reads its graphs) says what compiled.
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    _, step = load_model("tests.fixtures.lit:Classifier")
    compiled = torch.compile(step, backend="eager")
    batch = (torch.randn(8, 16), torch.randint(0, 4, (8,)))
    for _ in range(2):  # the step's frames, and its index made dynamic once
        compiled(batch)
    frames = counters["frames"]["ok"]
    for _ in range(6):
        compiled(batch)
    assert step.batch_idx == 8
    assert counters["frames"]["ok"] == frames  # nothing compiled again


def test_importing_the_step_leaves_the_compiler_unimported() -> None:
    # every driver imports this module to check a model; torch._dynamo took 1.6 s of that
    code = "import sys, autotune.runner.lightning; print('torch._dynamo' in sys.modules)"
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert found.stdout.strip() == "False"


def test_the_data_comes_from_a_data_module_or_the_modules_own_loader() -> None:
    # Lightning users keep their data in a LightningDataModule or the module's train_dataloader;
    # neither was read, and a module without autotune_dataset had no data at all.
    module = WorkloadSpec(model="tests.fixtures.lit_loaders:Loading")
    workload = build_workload(module)
    assert workload.data_source == "the LightningModule's train_dataloader()"
    assert len(workload.dataset) == 256  # the loader's dataset, not its batches
    given = WorkloadSpec(model="tests.fixtures.lit:Classifier", data="tests.fixtures.lit:Sized")
    assert len(build_workload(given).dataset) == 256
    assert build_workload(given).data_source == "--data tests.fixtures.lit:Sized"  # shuffled


def test_a_loader_with_a_sampler_of_its_own_says_the_trials_do_not_use_it() -> None:
    # A DataModule drawing by weight had its trials sample with a DistributedSampler, silently.
    weighted = WorkloadSpec(
        model="tests.fixtures.lit:Classifier", data="tests.fixtures.lit:Weighted"
    )
    workload = build_workload(weighted)
    assert len(workload.dataset) == 256
    assert workload.data_source == (
        "--data tests.fixtures.lit:Weighted (its train_dataloader() samples with "
        "WeightedRandomSampler, which trials do not use: they shuffle with a DistributedSampler, "
        "so their batches, and with them padding and speed, may differ from your training's)"
    )
    assert data_source(weighted) == workload.data_source  # the search's first lines say it


def test_a_loader_of_its_own_collate_or_none_at_all_is_one_line() -> None:
    padding = WorkloadSpec(model="tests.fixtures.lit:Classifier", data="tests.fixtures.lit:Padding")
    with pytest.raises(WorkloadError) as error:
        build_workload(padding)
    assert "train_dataloader() batches with its collate_fn Padding.train_dataloader.<locals>" in (
        str(error.value)
    )
    assert "--collate module:attr or autotune_collate" in str(error.value)
    given = padding.model_copy(update={"collate": "torch.utils.data:default_collate"})
    assert len(build_workload(given).dataset) == 256  # a collate given: the user's choice
    with pytest.raises(WorkloadError, match=r"train_dataloader\(\) returned a list, expected"):
        build_workload(WorkloadSpec(model="tests.fixtures.lit_loaders:Listing"))
