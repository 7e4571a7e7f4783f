"""FSDP2's reshard_after_forward reaches the blocks: with false, a block's parameters stay
gathered (whole tensors, not shards) from its forward to its backward. The memory that costs
is the memory model's to predict (tests/search/test_memory_model.py) and the allocator's to show
(tests/runner/test_gpu.py): on CPU, the resident peak hides it in the heap the build freed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.distributed.fsdp import CPUOffloadPolicy
from torch.distributed.tensor import DTensor

from autotune.config import TrainConfig
from autotune.errors import ConfigError
from autotune.runner.request import TrialOptions
from autotune.runner.session import leave_process_group
from autotune.runner.training import HookCounter, whole_parameters, wrap_model
from autotune.runner.workload import WorkloadSpec
from tests.fixtures.traced import WideBlocks
from tests.helpers import FEW, on_two_gloo_ranks

FSDP_X2 = TrainConfig(global_batch_size=8, parallel="fsdp", world_size=2, device="cpu")
FSDP_BF16_X2 = TrainConfig(
    global_batch_size=8, parallel="fsdp", world_size=2, device="cpu", fsdp_mixed_precision="bf16"
)


def _gathered_after_forward(reshard: bool) -> list[bool]:
    config = TrainConfig(
        global_batch_size=8, parallel="fsdp", world_size=1, device="cpu",
        reshard_after_forward=reshard,
    )  # fmt: skip
    model = wrap_model(WideBlocks(), config, torch.device("cpu"), HookCounter())
    model(torch.randn(2, 2048)).sum()  # forward only: backward has not come yet
    return [not isinstance(b[0].weight, DTensor) for b in model.blocks]  # type: ignore[union-attr]


@pytest.mark.usefixtures("one_rank_group")
def test_blocks_stay_gathered_until_backward_only_when_not_resharded() -> None:
    assert _gathered_after_forward(reshard=True) == [False] * 4
    assert _gathered_after_forward(reshard=False) == [True] * 4


@pytest.mark.usefixtures("one_rank_group")
def test_fsdp_leaves_moving_the_model_to_fully_shard_a_block_at_a_time() -> None:
    # The whole model went to the device before it was sharded, so a model that fits no one
    # device (what FSDP is for) could not be sharded. Built on the meta device, from which
    # nothing can be copied, the only moves left are fully_shard's own, which keep meta.
    with torch.device("meta"):
        model = WideBlocks()
    config = TrainConfig(global_batch_size=8, parallel="fsdp", world_size=1, device="cpu")
    wrapped = wrap_model(model, config, torch.device("cpu"), HookCounter())
    assert all(isinstance(p, DTensor) and p.is_meta for p in wrapped.parameters())


UNSHARDED_LEFT = """
import gc, sys, weakref
import torch, torch.distributed as dist
from autotune.config import TrainConfig
from autotune.runner.training import HookCounter, whole_parameters, wrap_model
from tests.fixtures.traced import WideBlocks

dist.init_process_group("gloo", store=dist.FileStore(sys.argv[1], 1), rank=0, world_size=1)
gc.disable()  # what a collection would free is what this counts
model = WideBlocks()
unsharded = [weakref.ref(p) for p in model.parameters()]
config = TrainConfig(global_batch_size=8, parallel="fsdp", world_size=1, device="cpu")
wrap_model(model, config, torch.device("cpu"), HookCounter())
print(sum(ref() is not None for ref in unsharded))
dist.destroy_process_group()
"""


@pytest.mark.slow  # a fresh process's sharding; the default run shards in process
def test_no_block_outlives_its_sharding_in_a_reference_cycle(tmp_path: Path) -> None:
    # In a fresh process the first DTensor's lazy import keeps the frames of the first
    # block's sharding, and with them its unsharded parameters, until a collection runs: on a
    # device, a block's worth of memory held beside the next block's (an H100 held 64 MiB
    # sharding four 16 MiB blocks one at a time). wrap_model collects after each block.
    root = Path(__file__).resolve().parents[2]
    run = subprocess.run(
        [sys.executable, "-c", UNSHARDED_LEFT, str(tmp_path / "store")],
        capture_output=True, text=True, timeout=120, cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split()[-1] == "0"


def _step_dtypes(policy: str) -> tuple[torch.dtype, torch.dtype]:
    config = TrainConfig(
        global_batch_size=8, parallel="fsdp", world_size=1, device="cpu",
        fsdp_mixed_precision=policy,  # type: ignore[arg-type]
    )  # fmt: skip
    model = wrap_model(WideBlocks(), config, torch.device("cpu"), HookCounter())
    output = model(torch.randn(2, 2048))
    output.float().sum().backward()
    grad = model.blocks[0][0].weight.grad  # type: ignore[index]
    return output.dtype, grad.dtype


@pytest.mark.usefixtures("one_rank_group")
def test_the_mixed_precision_policy_computes_in_bf16_and_keeps_fp32_shards() -> None:
    assert _step_dtypes("off") == (torch.float32, torch.float32)
    assert _step_dtypes("bf16")[0] == torch.bfloat16
    assert _step_dtypes("bf16-reduce-fp32") == (torch.bfloat16, torch.float32)


def test_two_gloo_ranks_train_under_the_policy_with_offloaded_shards() -> None:
    from autotune.api import run_trial

    config = {
        "global_batch_size": 8, "parallel": "fsdp", "world_size": 2, "device": "cpu",
        "fsdp_mixed_precision": "bf16", "fsdp_cpu_offload": True, "grad_accum_steps": 2,
    }  # fmt: skip
    result = run_trial("tests.fixtures.models:Small", config, **FEW)
    assert result.status == "ok", result.message
    assert result.ranks[0].diagnostics is not None
    assert result.ranks[0].diagnostics.output_dtype == "bfloat16"


@pytest.mark.usefixtures("one_rank_group")
def test_cpu_offload_reaches_every_fully_sharded_module() -> None:
    config = TrainConfig(
        global_batch_size=8, parallel="fsdp", world_size=1, device="cpu", fsdp_cpu_offload=True
    )
    model = wrap_model(WideBlocks(), config, torch.device("cpu"), HookCounter())
    # FSDP2's parameter group keeps its policy under a private name: this pins where it is.
    groups = [m._get_fsdp_state()._fsdp_param_group for m in (*model.blocks, model)]
    policies = [g.offload_policy for g in groups if g is not None]
    # One per block; the root holds no parameters of its own here, so it has no group.
    assert len(policies) == 4 and all(isinstance(p, CPUOffloadPolicy) for p in policies)
    assert not any(p.pin_memory for p in policies)  # nothing to pin for on a CPU
    model(torch.randn(2, 2048)).sum().backward()  # and it trains


class _Scaled(torch.nn.Module):
    """Blocks and a 0-dim parameter, as CLIP's ``logit_scale``."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(2))
        self.scale = torch.nn.Parameter(torch.tensor(2.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x * self.scale


def _scalar_rank(rank: int, store_path: str, out: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.FileStore(store_path, 2), rank=rank, world_size=2)
    torch.manual_seed(0)  # the same model on both ranks
    model = wrap_model(_Scaled(), FSDP_X2, torch.device("cpu"), HookCounter())
    x = torch.full((2, 8), float(rank + 1))  # each rank its own data
    with torch.no_grad():  # what this rank alone would give the scale
        local = (model(x) / model.scale).sum().item()
    for _ in range(2):  # two micro-steps accumulate
        model(x).sum().backward()
    grads = [torch.zeros(()) for _ in range(2)]
    dist.all_gather(grads, model.scale.grad)
    locals_ = [torch.zeros(()) for _ in range(2)]
    dist.all_gather(locals_, torch.tensor(local))
    sharded = isinstance(model.blocks[0].weight, DTensor)
    if rank == 0:
        torch.save({"grads": grads, "locals": locals_, "sharded": sharded}, out)
    leave_process_group()  # a bare barrier and destroy aborted a rank about one run in 12


@pytest.mark.slow  # a model shape (CLIP's logit scale) on two ranks
def test_a_scalar_parameter_is_kept_whole_and_its_gradients_averaged_over_fsdp_ranks(
    tmp_path: object,
) -> None:
    # fully_shard refuses 0-dim parameters: a search of a Hugging Face CLIP lost FSDP to
    # "fully_shard doesn't support scalar parameters. Change logit_scale to a 1D tensor".
    result = on_two_gloo_ranks(_scalar_rank, tmp_path)
    grads, local = result["grads"], result["locals"]
    assert result["sharded"]  # the blocks are still FSDP's
    assert float(grads[0]) == float(grads[1])  # the replicas stay equal
    # two micro-steps of each rank's own gradient, averaged over the ranks
    assert float(grads[0]) == pytest.approx(2 * (float(local[0]) + float(local[1])) / 2)


FSDP_FAILS = [
    ("tests.fixtures.spectral:Spectral", "uniform original parameter dtype"),
    ("tests.fixtures.sparse:Lookups", "SparseCPU"),
    ("tests.fixtures.scripted:ScriptedBlocks", "is not supported on ScriptModules"),
]


def test_fsdp_is_refused_where_the_probe_leaves_it_out() -> None:
    from autotune.api import run_trial
    from autotune.search.refusals import fsdp_refusal

    for model, _ in FSDP_FAILS:
        refusal = fsdp_refusal(model)
        assert refusal is not None, model
        with pytest.raises(ConfigError, match=re.escape(f"parallel=fsdp: {refusal}; use ddp or")):
            run_trial(model, FSDP_X2)


@pytest.mark.slow  # ~5 s a case: pins torch's behaviour behind the refusal above
@pytest.mark.parametrize(("model", "says"), FSDP_FAILS)
def test_fsdp_fails_where_the_probe_leaves_it_out(model: str, says: str) -> None:
    # What ``refusals.fsdp_refusal`` foresees, pinned on this torch: should FSDP learn to shard a
    # unit of two dtypes or a sparse gradient, this fails, and the refusal should go. (The
    # trial is launched past ``autotune.api.run_trial``, which refuses it in one line.)
    from autotune.runner.launch import run_trial as launch

    options = TrialOptions(**FEW)
    result = launch(FSDP_X2, WorkloadSpec(model=model), options)
    assert result.status == "error" and says in result.message


MIXED_REFUSED = [
    ("tests.fixtures.normed:Discriminator", None,
     "embed, blocks.0.linear, blocks.1.linear and 2 more"),
    ("tests.fixtures.normed:FrozenBackbone", "tests.fixtures.normed:autotune_dataset",
     "layers.0.1, layers.1.1, layers.2.1 keep their"),
]  # fmt: skip


@pytest.mark.parametrize(("model", "data", "named"), MIXED_REFUSED)
def test_fsdps_bf16_parameters_are_refused_naming_the_units_whose_buffers_stay_float32(
    model: str, data: str | None, named: str
) -> None:
    from autotune.api import run_trial
    from autotune.search.refusals import fsdp_mixed_precision_refusal

    refusal = fsdp_mixed_precision_refusal(model)
    assert refusal is not None and named in refusal
    with pytest.raises(ConfigError, match=re.escape(f"fsdp_mixed_precision=bf16: {refusal}")):
        run_trial(model, FSDP_BF16_X2, data=data)
    assert fsdp_mixed_precision_refusal("tests.fixtures.models:Small") is None


@pytest.mark.slow  # ~10 s a case, two trials: pins torch's behaviour behind the refusal above
@pytest.mark.parametrize(("model", "data"), [(model, data) for model, data, _ in MIXED_REFUSED])
def test_fsdps_bf16_parameters_fail_where_the_probe_leaves_them_out(
    model: str, data: str | None
) -> None:
    # What ``refusals.fsdp_mixed_precision_refusal`` foresees, pinned on this torch: FSDP casts
    # no buffer. A GAN discriminator under spectral_norm failed its first step ("addmv input
    # tensors must have the same dtype": the power iteration's vectors are float32); so did a
    # backbone of frozen batch norms (torchvision's FrozenBatchNorm2d, DETR's: their float32
    # output met the next layer's bf16 weight, "Input type (torch.FloatTensor) and weight type
    # (CPUBFloat16Type) should be the same" in a convolution). Should FSDP cast buffers, this
    # fails and the refusal should go.
    from autotune.api import run_trial
    from autotune.runner.launch import run_trial as launch

    options = TrialOptions(**FEW)
    result = launch(FSDP_BF16_X2, WorkloadSpec(model=model, data=data), options)
    # torch 2.11's kernels word it "expected scalar type BFloat16 but found Float"
    mismatch = ("same dtype", "expected scalar type BFloat16 but found Float")
    assert result.status == "error" and any(m in result.message for m in mismatch), result.message
    assert run_trial(model, FSDP_BF16_X2.model_copy(update={"amp": "bf16",
        "fsdp_mixed_precision": "off"}), data=data, warmup_steps=1, measured_steps=2,
        target_interval=0).status == "ok"  # fmt: skip


BF16_UNITS = [
    ("Codebook", "expected m1 and m2 to have the same dtype", None),
    ("Positional", None, None),
    ("Distances", '"cdist" not implemented for', "cpu"),
]


@pytest.mark.parametrize(("model", "says", "device"), BF16_UNITS)
def test_a_forward_held_as_fsdps_bf16_parameters_hold_it_says_what_their_trial_would(
    model: str, says: str | None, device: str | None
) -> None:
    # Meta kernels take mixed dtypes (mm, linear, conv2d), so only a real forward shows a VQ
    # codebook's float32 buffer meeting a bf16 feature: ``refusals.fsdp_bf16_refusals`` runs
    # one, its parameters and each unit's inputs cast as FSDP casts them. A float32 buffer
    # added before the blocks trains (FSDP casts a block's inputs); an op without a bf16 kernel
    # fails on this CPU only. The trials that show each verdict right: the slow test below.
    from autotune.search.refusals import fsdp_bf16_refusals

    refusals = fsdp_bf16_refusals(WorkloadSpec(model=f"tests.fixtures.bf16_units:{model}"))
    if says is None:
        assert refusals == ()
        return
    assert [(r.knob, r.value, r.device) for r in refusals] == [
        ("fsdp_mixed_precision", "bf16", device),
        ("fsdp_mixed_precision", "bf16-reduce-fp32", device),
    ]
    assert says in refusals[0].reason and "failed here" in refusals[0].reason


@pytest.mark.slow  # ~5 s a case: the trials behind the verdicts above
@pytest.mark.parametrize(("model", "says"), [(model, says) for model, says, _ in BF16_UNITS])
def test_fsdps_bf16_parameters_trial_ends_as_the_forward_held_so_foresaw(
    model: str, says: str | None
) -> None:
    from autotune.runner.launch import run_trial as launch

    spec = WorkloadSpec(model=f"tests.fixtures.bf16_units:{model}")
    options = TrialOptions(**FEW)
    result = launch(FSDP_BF16_X2, spec, options)
    if says is None:
        assert result.status == "ok", result.message
    else:
        assert result.status == "error" and says in result.message, result.message


@pytest.mark.usefixtures("one_rank_group")
def test_fsdps_bf16_parameters_leave_batch_norms_whole_and_in_float32() -> None:
    # FSDP cast a batch norm's weight to bf16 and not its running statistics, and the kernel
    # refused them ("expected scalar type BFloat16 but found Float"): every convnet with batch
    # norms failed its first step (ResNet, EfficientNet, SegFormer's head, the built-in
    # convnet). Kept out of fully_shard in float32, they take the bf16 activations, as autocast
    # gives them, and their gradients are averaged over the ranks.
    from tests.fixtures.norms import Normed

    config = TrainConfig(
        global_batch_size=8, parallel="fsdp", world_size=1, device="cpu",
        fsdp_mixed_precision="bf16",
    )  # fmt: skip
    model = wrap_model(Normed(), config, torch.device("cpu"), HookCounter())
    norm = next(m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d))
    assert not isinstance(norm.weight, DTensor) and norm.weight.dtype == torch.float32
    assert any(isinstance(p, DTensor) for p in model.parameters())  # the rest is sharded
    model(torch.randn(4, 3, 8, 8)).float().square().backward()
    assert norm.weight.grad is not None and norm.weight.grad.dtype == torch.float32
    off = config.model_copy(update={"fsdp_mixed_precision": "off"})
    assert not any(p is norm.weight for p in whole_parameters(Normed(), off))


@pytest.mark.slow  # two ranks; the default run checks the batch norms in process
def test_a_convnet_with_batch_norms_trains_under_fsdps_bf16_parameters() -> None:
    from autotune.runner.launch import run_trial as launch
    from autotune.search.refusals import fsdp_bf16_refusals

    spec = WorkloadSpec(model="workloads.convnet:resnet_tiny")
    config = TrainConfig(
        global_batch_size=8, parallel="fsdp", world_size=2, device="cpu",
        fsdp_mixed_precision="bf16", checkpoint_segments=2,
    )  # fmt: skip
    options = TrialOptions(**FEW)
    result = launch(config, spec, options)
    assert result.status == "ok", result.message
    assert fsdp_bf16_refusals(spec) == ()  # the probe's forward holds them so too


def test_the_bf16_forward_is_not_tried_where_the_build_rules_fsdps_bf16_out() -> None:
    from autotune.search.refusals import fsdp_bf16_refusals

    spec = WorkloadSpec(
        model="tests.fixtures.normed:FrozenBackbone", data="tests.fixtures.normed:autotune_dataset"
    )
    assert fsdp_bf16_refusals(spec) == ()  # model_refusals says why


@pytest.mark.slow  # one model's message on two ranks
def test_a_float32_tensor_the_model_makes_under_fsdps_bf16_parameters_is_named() -> None:
    # An image model normalising its uint8 input itself (x.float() / 255 - mean) failed with
    # torch's "Input type (torch.FloatTensor) and weight type (CPUBFloat16Type) should be the
    # same" alone: FSDP casts the forward's inputs, not what the model makes of them
    from autotune.errors import FSDP_CASTS
    from autotune.runner.launch import run_trial as launch

    spec = WorkloadSpec(
        model="tests.fixtures.normed:Standardised", data="tests.fixtures.normed:autotune_dataset"
    )
    options = TrialOptions(**FEW)
    result = launch(FSDP_BF16_X2, spec, options)
    assert result.status == "error" and f"({FSDP_CASTS} and the forward's" in result.message


@pytest.mark.slow  # a model shape on two ranks
def test_fsdp_shards_layers_held_as_lists_of_their_parts() -> None:
    from autotune.api import run_trial

    config = {"global_batch_size": 8, "parallel": "fsdp", "world_size": 2, "device": "cpu"}
    result = run_trial(
        "tests.fixtures.part_lists:Decoder", {**config, "checkpoint_segments": 2},
        **FEW,
    )  # fmt: skip
    assert result.status == "ok", result.message


def test_an_op_without_a_bf16_kernel_under_fsdps_bf16_parameters_is_named() -> None:
    # YOLOS's Hungarian matcher under FSDP's bf16 parameters on a CPU: '"cdist" not implemented
    # for 'BFloat16'' alone (autocast keeps cdist in float32, and trained it)
    from autotune.errors import FSDP_CASTS
    from autotune.runner.hints import fsdp_dtype_hint

    missing = NotImplementedError('"cdist" not implemented for ' + "'BFloat16'")
    assert (fsdp_dtype_hint(missing, FSDP_BF16_X2) or "").startswith(
        f"{FSDP_CASTS}, so the model computes in bf16 throughout"
    )
    off = FSDP_BF16_X2.model_copy(update={"fsdp_mixed_precision": "off"})
    assert fsdp_dtype_hint(missing, off) is None
    assert fsdp_dtype_hint(RuntimeError("shapes cannot be multiplied"), FSDP_BF16_X2) is None


@pytest.mark.slow  # a model shape on two ranks
def test_a_looped_layer_checkpointed_under_fsdp_trains() -> None:
    # A Perceiver's self-attention, one of the fallback's blocks, lies inside its looped tower:
    # sharded as a unit of its own inside the checkpointed calls, its gathering inside the
    # recomputation failed every step ("A different number of tensors was saved during the
    # original forward and recomputation"); it is now sharded with the tower's other parameters.
    from autotune.api import run_trial

    config = TrainConfig(
        global_batch_size=8, parallel="fsdp", world_size=2, device="cpu", checkpoint_segments=4
    )
    result = run_trial(
        "tests.fixtures.looped:LatentTower", config, data="tests.fixtures.looped:autotune_dataset",
        **FEW,
    )  # fmt: skip
    assert result.status == "ok", result.message
    for rank in result.ranks:
        assert rank.diagnostics is not None
        assert (rank.diagnostics.checkpointed_blocks, rank.diagnostics.repeated_blocks) == (4, 4)
