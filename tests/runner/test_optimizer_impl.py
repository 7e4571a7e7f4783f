"""optimizer_impl: the user's optimizer runs fused (or foreach) where its class takes the flag,
and the probe drops the flag where it does not."""

from __future__ import annotations

import pytest
import torch

from autotune.api import run_trial
from autotune.errors import ConfigError
from autotune.runner.optimizer import with_implementation
from autotune.runner.workload import WorkloadSpec
from autotune.search.meta_build import optimizer_flags
from tests.helpers import FEW


def test_the_users_optimizer_is_rebuilt_fused_keeping_its_hyperparameters() -> None:
    model = torch.nn.Linear(8, 8)
    built = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    fused = with_implementation(built, "fused")
    assert type(fused) is torch.optim.SGD
    assert fused.param_groups[0]["fused"] is True and fused.param_groups[0]["foreach"] is False
    assert fused.param_groups[0]["momentum"] == 0.9 and fused.defaults["lr"] == 0.1
    model(torch.randn(2, 8)).sum().backward()
    fused.step()  # the fused kernel runs on this device
    assert with_implementation(built, "default") is built


def test_an_optimizer_without_the_flag_is_refused_in_one_line() -> None:
    lbfgs = torch.optim.LBFGS(torch.nn.Linear(2, 2).parameters())
    with pytest.raises(ConfigError, match="LBFGS takes no 'fused' flag"):
        with_implementation(lbfgs, "fused")


def test_the_probe_reads_the_users_optimizer_class() -> None:
    name, flags = optimizer_flags(WorkloadSpec(model="tests.fixtures.optimizers:Wide")) or ("", ())
    assert name == "SGD" and flags == ("foreach", "fused")
    assert optimizer_flags(WorkloadSpec(model="workloads.gpt:gpt_tiny")) == (
        "AdamW",
        ("foreach", "fused"),
    )


def test_a_trial_runs_its_optimizer_fused() -> None:
    config = {"global_batch_size": 8, "device": "cpu", "optimizer_impl": "fused"}
    result = run_trial("tests.fixtures.models:Small", config, **FEW)
    assert result.status == "ok", result.message
    assert result.ranks[0].diagnostics is not None
    assert result.ranks[0].diagnostics.optimizer_impl == "fused"


def test_a_default_optimizer_is_traced_for_cuda_as_cuda_runs_it_foreach() -> None:
    # On CUDA PyTorch steps a default AdamW foreach (one temporary the size of all the
    # parameters); a CPU steps it one tensor at a time. A trace for CUDA runs on CPU tensors,
    # so it asks for foreach itself, unless the user's optimizer set a flag of its own.
    from autotune.runner.fake_memory import trace_step
    from autotune.runner.optimizer import device_default

    params = list(torch.nn.Linear(8, 8).parameters())
    assert device_default(torch.optim.AdamW(params), "cuda") == "foreach"
    assert device_default(torch.optim.AdamW(params), "cpu") == "default"
    assert device_default(torch.optim.AdamW(params, foreach=False), "cuda") == "default"
    assert device_default(torch.optim.AdamW(params, fused=True), "cuda") == "default"
    assert device_default(torch.optim.LBFGS(params), "cuda") == "default"  # takes no flag

    spec = WorkloadSpec(model="tests.fixtures.traced:WideBlocks")  # four 16 MiB blocks

    def state(impl: str, device_type: str) -> int:
        return trace_step(spec, 4, optimizer_impl=impl, device_type=device_type).optimizer_bytes

    cuda = state("default", "cuda")
    assert cuda == state("foreach", "cuda") == state("foreach", "cpu")
    # two moments of 64 MiB, then sqrt of all of them at once against two of one block's
    assert cuda - state("default", "cpu") == pytest.approx(32 * 2**20, rel=0.01)
