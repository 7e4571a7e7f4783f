"""DDP's bucket size and gradient views: applied by the trials' own wrap, and observable."""

from __future__ import annotations

import pytest
import torch

from autotune.config import TrainConfig
from autotune.runner.training import HookCounter, wrap_model
from tests.fixtures.traced import Stack


def _wrapped(**values: object) -> torch.nn.Module:
    config = TrainConfig(
        global_batch_size=8,
        parallel="ddp",
        world_size=1,
        device="cpu",
        **values,  # type: ignore[arg-type]
    )
    return wrap_model(Stack(), config, torch.device("cpu"), HookCounter())


def _gradient_storages(model: torch.nn.Module) -> int:
    model(torch.randn(8, 256)).square().mean().backward()
    return len({p.grad.untyped_storage().data_ptr() for p in model.parameters()})


@pytest.mark.usefixtures("one_rank_group")
def test_the_ddp_object_holds_the_bucket_cap() -> None:
    assert _wrapped().bucket_bytes_cap == 25 * 2**20  # PyTorch's default, unchanged
    assert _wrapped(bucket_cap_mb=10).bucket_bytes_cap == 10 * 2**20


@pytest.mark.usefixtures("one_rank_group")
def test_gradients_become_views_of_the_buckets() -> None:
    parameters = len(list(Stack().parameters()))
    assert _gradient_storages(_wrapped()) == parameters  # each gradient its own copy
    assert _gradient_storages(_wrapped(gradient_as_bucket_view=True)) < parameters / 4


def test_ddp_on_gloo_trains_a_model_whose_lookup_has_sparse_gradients() -> None:
    # A recommender's EmbeddingBag(sparse=True): DDP reduces its sparse gradients (gloo does),
    # the user's SGD takes them, and the trial measures as any other.
    from autotune.api import run_trial

    config = {"global_batch_size": 16, "parallel": "ddp", "world_size": 2, "device": "cpu"}
    result = run_trial(
        "tests.fixtures.sparse:OneLookup", config, warmup_steps=1, measured_steps=2,
        target_interval=0,
    )  # fmt: skip
    assert result.status == "ok", result.message
    assert result.samples_per_s and result.optimizer == "SGD"


def test_ddp_on_a_cpu_of_several_sparse_lookups_is_refused_saying_why() -> None:
    # A DLRM's four embedding bags: one DDP trial in three died of a corrupted heap (SIGABRT),
    # and plain PyTorch does the same (scripts/bench_gloo_sparse.py).
    from autotune.api import run_trial
    from autotune.errors import ConfigError

    config = {"global_batch_size": 16, "parallel": "ddp", "world_size": 2, "device": "cpu"}
    with pytest.raises(ConfigError) as refused:
        run_trial("tests.fixtures.sparse:Lookups", config, warmup_steps=1, measured_steps=2)
    said = str(refused.value)
    assert said.startswith("parallel=ddp: DDP over gloo corrupts a rank's memory now and then")
    assert "(bag, table)" in said and said.endswith("; use single on a CPU")


def test_powersgd_keeps_a_layer_with_a_zero_gradient_finite() -> None:
    # DETR under PowerSGD: a gradient matrix of zeros made a column PowerSGD divided by its
    # norm, 0 (torch's orthogonalization_epsilon defaults to 0): the parameters were NaN after
    # the first compressed step
    from autotune.api import run_trial

    config = {
        "global_batch_size": 8, "parallel": "ddp", "world_size": 2, "device": "cpu",
        "comm_hook": "powersgd", "powersgd_rank": 1, "powersgd_start_iter": 2,
    }  # fmt: skip
    result = run_trial(
        "tests.fixtures.zero_gradient:Masked", config, input_shape=(32,),
        warmup_steps=2, measured_steps=3, target_interval=0,
    )  # fmt: skip
    assert result.status == "ok", result.message
    assert result.loss_finite, result.message


def test_a_forward_failing_on_parameters_left_nan_says_so() -> None:
    import torch

    from autotune.errors import DIVERGED, rank_hint
    from autotune.runner.hints import diverged_hint

    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    assert diverged_hint(model) is None
    with torch.no_grad():
        model[1].weight[0, 0] = float("nan")
    hint = diverged_hint(model) or ""
    assert hint.startswith(f"{DIVERGED} (1.weight): an update before this step diverged")
    assert rank_hint(f"rank 0: measured step 2: ValueError: boxes ({hint})") == hint
