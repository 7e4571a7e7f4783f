"""The same runner on CUDA: NCCL, comm hooks, AMP, CUDA memory accounting, CUDA OOM.

Skipped without a GPU. One GPU cannot hold two NCCL ranks (NCCL refuses two ranks on one
device), so the DDP and FSDP paths run as one NCCL rank: the process group, the wrapper, every
comm hook (which runs on each synced backward, whatever the world size) and the sharded
optimizer step are the same code as with more ranks; only the peer traffic is absent.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from autotune.config import make_config
from autotune.result import TrialResult
from autotune.runner.launch import run_trial
from autotune.runner.rank import run_rank
from autotune.runner.request import TrialOptions, TrialRequest
from autotune.runner.workload import WorkloadCache, WorkloadSpec

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.usefixtures("no_leftover_processes"),
]

FIXED = TrialOptions(warmup_steps=1, measured_steps=4, target_interval=0, timeout_s=180)


def _trial(model: str, options: TrialOptions | None = None, **values: object) -> TrialResult:
    config = make_config({"global_batch_size": 16, "device": "cuda", **values})
    return run_trial(config, WorkloadSpec(model=model), options or FIXED)


def _ok(result: TrialResult) -> TrialResult:
    assert result.status == "ok", result.message
    assert result.samples_per_s and result.samples_per_s > 0
    assert result.loss_finite
    assert result.platform is not None and result.platform.device_type == "cuda"
    assert result.platform.backend == "nccl"
    return result


def test_cuda_trial_reports_allocator_and_device_memory() -> None:
    result = _ok(_trial("workloads.gpt:gpt_tiny", amp="bf16", checkpoint_segments=2))
    rank = result.ranks[0]
    assert rank.peak_memory_bytes > 0
    assert rank.peak_reserved_bytes is not None
    assert rank.peak_reserved_bytes >= rank.peak_memory_bytes
    # NVML sees the whole device: the allocator's reservation plus the CUDA context.
    assert rank.peak_device_used_bytes is not None, "nvidia-ml-py is a dependency"
    assert rank.peak_device_used_bytes > rank.peak_reserved_bytes


def test_checkpointing_lowers_the_cuda_allocator_peak() -> None:
    plain = _ok(_trial("workloads.gpt:gpt_long_context", global_batch_size=8))
    checkpointed = _ok(
        _trial("workloads.gpt:gpt_long_context", global_batch_size=8, checkpoint_segments=6)
    )
    assert checkpointed.ranks[0].diagnostics is not None
    assert checkpointed.ranks[0].diagnostics.checkpointed_blocks == 6
    assert checkpointed.peak_memory_bytes < 0.7 * plain.peak_memory_bytes  # type: ignore[operator]


@pytest.mark.parametrize("hook", ["fp16", "bf16", "powersgd"])
def test_each_comm_hook_runs_on_nccl(hook: str) -> None:
    # PowerSGD from step 2: the warm-up step is plain allreduce, measured steps compress.
    extra = {"powersgd_start_iter": 2} if hook == "powersgd" else {}
    result = _ok(
        _trial(
            "workloads.gpt:gpt_tiny",
            parallel="ddp",
            world_size=1,
            comm_hook=hook,
            grad_accum_steps=2,
            **extra,
        )
    )
    diagnostics = result.ranks[0].diagnostics
    assert diagnostics is not None
    calls = diagnostics.comm_hook_calls_per_micro_step
    assert calls[0::2] == [0] * (len(calls) // 2)  # no_sync micro-steps skip the hook
    assert all(c >= 1 for c in calls[1::2])  # one call per bucket on every synced step


def test_powersgd_really_compresses_on_nccl() -> None:
    result = _ok(
        _trial(
            "workloads.gpt:gpt_tiny",
            parallel="ddp",
            world_size=1,
            comm_hook="powersgd",
            powersgd_start_iter=2,
        )
    )
    diagnostics = result.ranks[0].diagnostics
    assert diagnostics is not None
    assert diagnostics.powersgd_lowrank_calls > 0


def test_fsdp_on_nccl() -> None:
    result = _ok(_trial("workloads.gpt:gpt_tiny", parallel="fsdp", world_size=1, amp="bf16"))
    assert result.ranks[0].diagnostics is not None
    assert result.ranks[0].diagnostics.output_dtype == "bfloat16"


def test_fp16_runs_with_a_live_cuda_gradient_scaler() -> None:
    # On CPU, GradScaler("cuda") disables itself and reports scale 1.0; on CUDA it starts at
    # 2**16 and only ever halves or doubles, so a live scaler reports a power of two above 1.
    result = _ok(_trial("workloads.gpt:gpt_tiny", amp="fp16"))
    diagnostics = result.ranks[0].diagnostics
    assert diagnostics is not None
    assert diagnostics.output_dtype == "float16"
    scale = diagnostics.grad_scaler_scale
    assert scale is not None and scale > 1.0
    assert float(scale).hex().startswith("0x1.0000000000000p")  # a power of two


def test_bf16_autocast_on_cuda_needs_no_scaler() -> None:
    result = _ok(_trial("workloads.gpt:gpt_tiny", amp="bf16"))
    diagnostics = result.ranks[0].diagnostics
    assert diagnostics is not None
    assert diagnostics.output_dtype == "bfloat16"
    assert diagnostics.grad_scaler_scale is None


def test_pinned_memory_with_workers_runs() -> None:
    result = _ok(
        _trial("workloads.convnet:resnet_tiny", num_workers=2, prefetch_factor=2, pin_memory=True)
    )
    assert result.data_wait_share is not None


def test_two_ranks_on_one_gpu_are_refused_with_a_reason() -> None:
    if torch.cuda.device_count() >= 2:
        pytest.skip("this machine has 2 GPUs: the two-rank tests below run instead")
    result = _trial("workloads.gpt:gpt_tiny", parallel="ddp", world_size=2)
    assert result.status != "ok"
    assert "world_size=2" in result.message and "1" in result.message


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
@pytest.mark.parametrize("hook", ["fp16", "bf16", "powersgd"])
def test_nccl_comm_hooks_on_two_gpus(hook: str) -> None:
    result = _ok(_trial("workloads.gpt:gpt_tiny", parallel="ddp", world_size=2, comm_hook=hook))
    assert len(result.ranks) == 2


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_data_parallel_on_two_gpus() -> None:
    _ok(_trial("workloads.gpt:gpt_tiny", parallel="dp", world_size=2))


@pytest.mark.usefixtures("rank_in_this_process")
def test_a_reused_rank_process_gives_back_what_earlier_trials_held() -> None:
    # A Ray gang's ranks run trial after trial in one process, as this test does. Seen on an
    # H100: CUDA graphs' pools (compile=reduce-overhead) kept 38 GiB, and the next trial, which
    # had fitted before, ran out of memory; a memory limit also outlived its trial.
    cache = WorkloadCache()

    def run(options: TrialOptions = FIXED, **values: object):  # type: ignore[no-untyped-def]
        config = make_config({"global_batch_size": 8, "device": "cuda", **values})
        spec = WorkloadSpec(model="workloads.gpt:gpt_long_context")
        return run_rank(TrialRequest(config=config, workload=spec, options=options), 0, None, cache)

    first = run()
    compiled = run(compile="reduce-overhead")
    limited = run(TrialOptions(timeout_s=180, memory_limit_bytes=256 << 20), global_batch_size=64)
    again = run()
    assert first.status == compiled.status == again.status == "ok", again.message
    assert limited.status == "oom", limited.message
    assert first.peak_reserved_bytes and again.peak_reserved_bytes
    assert again.peak_reserved_bytes <= 1.1 * first.peak_reserved_bytes


def test_cuda_oom_is_classified_as_oom() -> None:
    options = TrialOptions(timeout_s=180, memory_limit_bytes=256 << 20)
    result = _trial("workloads.gpt:gpt_long_context", options, global_batch_size=64)
    assert result.status == "oom", result.message


def test_matmul_precision_high_lets_fp32_matmuls_run_in_tf32() -> None:
    high = _ok(_trial("tests.fixtures.models:Small", matmul_precision="high"))
    highest = _ok(_trial("tests.fixtures.models:Small", matmul_precision="highest"))
    assert high.ranks[0].diagnostics is not None and highest.ranks[0].diagnostics is not None
    assert high.ranks[0].diagnostics.matmul_precision == "high"
    assert highest.ranks[0].diagnostics.matmul_precision == "highest"
    # The effect: TF32 rounds an fp32 matmul's inputs to a 10-bit mantissa.
    a = torch.randn(512, 512, device="cuda")
    torch.set_float32_matmul_precision("high")
    fast = a @ a
    torch.set_float32_matmul_precision("highest")
    exact = a @ a
    assert not torch.equal(fast, exact)


def test_the_fused_optimizer_and_the_users_own_train_on_cuda() -> None:
    fused = _ok(_trial("tests.fixtures.models:Small", optimizer_impl="fused"))
    assert fused.optimizer == "AdamW"
    assert fused.ranks[0].diagnostics is not None
    assert fused.ranks[0].diagnostics.optimizer_impl == "fused"  # a CUDA-only kernel, applied
    users = _ok(_trial("tests.fixtures.optimizers:Wide"))
    assert users.optimizer == "SGD"  # the module's autotune_optimizer, not the default AdamW


def _wide_fsdp_peak(**values: object) -> int:
    result = _trial("tests.fixtures.traced:WideBlocks", parallel="fsdp", world_size=1, **values)
    return _ok(result).peak_memory_bytes or 0


@contextlib.contextmanager
def _one_nccl_rank(store: Path) -> Iterator[None]:
    import torch.distributed as dist

    torch.cuda.set_device(0)
    dist.init_process_group("nccl", store=dist.FileStore(str(store), 1), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _held_after_forward(store: Path, reshard_after_forward: bool) -> int:
    """What WideBlocks' forward leaves on the device under FSDP of one rank: its activations,
    and the blocks still gathered."""
    from autotune.config import TrainConfig
    from autotune.runner.training import HookCounter, wrap_model
    from tests.fixtures.traced import WideBlocks

    with _one_nccl_rank(store):
        config = TrainConfig(
            global_batch_size=8, parallel="fsdp", world_size=1, device="cuda",
            reshard_after_forward=reshard_after_forward,
        )  # fmt: skip
        model = wrap_model(WideBlocks(), config, torch.device("cuda", 0), HookCounter())
        batch = torch.randn(8, 2048, device="cuda")
        before = torch.cuda.memory_allocated()
        output = model(batch)
        held = torch.cuda.memory_allocated() - before
        output.sum().backward()
        return held


def test_keeping_fsdp_blocks_gathered_holds_them_from_forward_to_backward(tmp_path: Path) -> None:
    # Between forward and backward: the four 16 MiB blocks stay gathered, or none does. (A
    # trial's peak cannot show it for this model: on an H100 both settings peaked at the same
    # 385 MiB, so not where blocks are gathered; by the count, in AdamW's step.)
    gathered = _held_after_forward(tmp_path / "a", reshard_after_forward=False)
    resharded = _held_after_forward(tmp_path / "b", reshard_after_forward=True)
    assert gathered - resharded >= 4 * 16 * 2**20


def test_offloading_fsdp_shards_to_the_host_lowers_the_allocator_peak() -> None:
    offloaded = _wide_fsdp_peak(fsdp_cpu_offload=True)
    # 64 MiB of fp32 parameters, their gradients and AdamW's two moments leave the device; what
    # stays is the gathered blocks and the activations.
    assert _wide_fsdp_peak(fsdp_cpu_offload=False) - offloaded > 3 * 64 * 2**20


def test_fsdp_moves_one_block_at_a_time_to_the_device(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The whole model went to the device before it was sharded: a model larger than one
    # device could not be sharded. With the shards offloaded, the device holds a block (and
    # its shard) at a time: WideBlocks' four 16 MiB blocks never together. On an H100 (torch
    # 2.11) the peak was 64 MiB: each call's allocated figure below says where it grows.
    import torch.distributed.fsdp as fsdp

    from autotune.config import TrainConfig
    from autotune.runner.training import HookCounter, wrap_model
    from tests.fixtures.traced import WideBlocks

    shard, after = fsdp.fully_shard, []

    def watched(module: torch.nn.Module, **kwargs: object) -> object:
        sharded = shard(module, **kwargs)
        after.append(
            f"{type(module).__name__}: {torch.cuda.memory_allocated() >> 20} MiB "
            f"(peak {torch.cuda.max_memory_allocated() >> 20})"
        )
        return sharded

    monkeypatch.setattr(fsdp, "fully_shard", watched)
    with _one_nccl_rank(tmp_path / "store"):
        torch.cuda.reset_peak_memory_stats()
        config = TrainConfig(
            global_batch_size=8, parallel="fsdp", world_size=1, device="cuda",
            fsdp_cpu_offload=True,
        )  # fmt: skip
        wrap_model(WideBlocks(), config, torch.device("cuda", 0), HookCounter())
        assert torch.cuda.max_memory_allocated() < 48 * 2**20, "; ".join(after)


def test_expandable_segments_reach_the_cuda_allocator() -> None:
    result = _ok(_trial("tests.fixtures.models:Small", expandable_segments=True))
    assert result.ranks[0].diagnostics is not None
    assert result.ranks[0].diagnostics.allocator_settings == "expandable_segments:True"


def _accumulated_grads(keep_grads: bool, compile_mode: str) -> list[torch.Tensor]:
    """One optimizer step's gradients over two micro-batches (the optimizer not stepped)."""
    from autotune.config import TrainConfig
    from autotune.runner.loss import default_loss
    from autotune.runner.training import TrainStep, prepare_model
    from tests.fixtures.models import Small

    config = TrainConfig(
        global_batch_size=16, device="cuda", grad_accum_steps=2, compile=compile_mode
    )
    torch.manual_seed(0)
    model = Small()
    device = torch.device("cuda")
    wrapped, hooks, _, _ = prepare_model(model, config, device)
    optimizer = torch.optim.SGD(wrapped.parameters(), lr=0.0)  # gradients only
    step = TrainStep(wrapped, optimizer, default_loss, config, device, hooks)
    step.keep_grads = keep_grads
    torch.manual_seed(1)
    batches = [(torch.randn(8, 8), torch.randint(0, 3, (8,))) for _ in range(6)]
    optimizer.zero_grad = lambda set_to_none=True: None  # type: ignore[method-assign]
    for start in (0, 2, 4):  # warm-up replays, then the step whose gradients are compared
        for param in model.parameters():
            param.grad = None if not keep_grads else torch.zeros_like(param)
        step.run(iter(batches[start : start + 2]))
    return [p.grad.detach().clone() for p in model.parameters()]  # type: ignore[union-attr]


def test_cuda_graphs_accumulate_like_eager_with_gradients_kept() -> None:
    eager = _accumulated_grads(keep_grads=False, compile_mode="off")
    graphed = _accumulated_grads(keep_grads=True, compile_mode="reduce-overhead")
    for a, b in zip(eager, graphed, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("amp", ["off", "bf16"])
def test_a_cuda_step_holds_what_its_trace_for_cuda_says_through_fused_attention(amp: str) -> None:
    # Traced on the CPU for a CUDA device, F.scaled_dot_product_attention with dropout holds
    # what CUDA's fused kernels hold (fake_attention), not the CPU math path's scores: checked
    # here against a real CUDA step, as tests/runner/test_fake_attention.py checks the CPU one.
    from autotune.bench.traced_step import real_step_peak
    from autotune.runner.fake_memory import trace_step
    from tests.fixtures.traced import WIDTH, AttendsLong

    spec = WorkloadSpec(model="tests.fixtures.traced:AttendsLong")
    traced = trace_step(spec, 8, amp, device_type="cuda")
    cpu = trace_step(spec, 8, amp, device_type="cpu")
    torch.manual_seed(0)
    model = AttendsLong().cuda().train()
    real = real_step_peak(model, torch.randn(8, 256, WIDTH, device="cuda"), amp=amp)
    assert traced.total_bytes == pytest.approx(real, rel=0.02)
    assert cpu.total_bytes > 1.2 * real  # the CPU's math path: what the fix took away


@pytest.mark.parametrize(
    "name", ["AttendsMath", "AttendsGroupedWithoutDropout", "AttendsCudnnOnly"]
)
def test_the_attention_kernel_cuda_picks_holds_what_its_trace_for_cuda_says(name: str) -> None:
    # The code's own sdpa_kernel choice (the math path; cuDNN's) and grouped keys in float32
    # (flash takes 16 bits only): the trace for CUDA follows CUDA's pick (fake_attention).
    from autotune.bench.traced_step import real_step_peak
    from autotune.runner.fake_memory import trace_step
    from tests.fixtures import traced as fixtures

    amp = "bf16" if name == "AttendsCudnnOnly" else "off"
    spec = WorkloadSpec(model=f"tests.fixtures.traced:{name}")
    predicted = trace_step(spec, 8, amp, device_type="cuda")
    torch.manual_seed(0)
    model = getattr(fixtures, name)().cuda().train()
    real = real_step_peak(model, torch.randn(8, 128, fixtures.WIDTH, device="cuda"), amp=amp)
    assert predicted.total_bytes == pytest.approx(real, rel=0.02)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_the_trace_takes_a_fused_kernel_where_this_gpu_has_one(dtype: torch.dtype) -> None:
    # fake_attention._fusable decides by the capability (planned_gpu.capability, this GPU's
    # here) what torch's sdp_utils decide by the device: held against torch's own predicates
    # over masks, grouped keys, dropout and causality, as a training step calls them.
    from torch.backends.cuda import (
        SDPAParams,
        can_use_cudnn_attention,
        can_use_efficient_attention,
        can_use_flash_attention,
    )

    from autotune.runner.fake_attention import _fusable

    batch, heads, positions, head = 2, 4, 128, 64
    for kv_heads, mask, dropout, causal in itertools.product(
        (4, 2), (False, True), (0.0, 0.1), (False, True)
    ):
        if mask and causal:
            continue  # an error on any device
        q = torch.randn(batch, heads, positions, head, device="cuda", dtype=dtype)
        k, v = (
            torch.randn(batch, kv_heads, positions, head, device="cuda", dtype=dtype)
            for _ in range(2)
        )
        for t in (q, k, v):
            t.requires_grad_()
        attn_mask = None  # a boolean one torch makes additive before it picks: this
        if mask:
            attn_mask = torch.zeros(batch, 1, positions, positions, device="cuda", dtype=dtype)
        gqa = kv_heads != heads
        params = SDPAParams(q, k, v, attn_mask, dropout, causal, gqa)
        cuda_fuses = any(
            can(params) for can in (can_use_flash_attention, can_use_efficient_attention,
                                    can_use_cudnn_attention)
        )  # fmt: skip
        assert _fusable(q, k, attn_mask, gqa) == cuda_fuses, (dtype, kv_heads, mask, dropout)


def test_a_dataset_kept_on_the_gpu_fails_forked_workers_and_pinning_as_its_refusals_say() -> None:
    # What refusals.dataset_refusals foresees, pinned where it holds: should either run, the
    # refusal can go.
    from torch.utils.data import DataLoader

    from tests.fixtures.gpu_data import on_gpu

    dataset = on_gpu()
    assert next(iter(DataLoader(dataset, batch_size=8)))[0].is_cuda  # no worker, no pinning
    with pytest.raises(RuntimeError):
        next(iter(DataLoader(dataset, batch_size=8, num_workers=2)))
    with pytest.raises(RuntimeError, match="pin"):
        next(iter(DataLoader(dataset, batch_size=8, pin_memory=True)))


def test_activations_offloaded_by_save_on_cpu_leave_the_gpu_as_its_trace_for_cuda_says() -> None:
    # Traced on the CPU for CUDA (fake_offload), the tensors torch's save_on_cpu packs are held
    # in host memory and come back for their own backward: held here against a real CUDA step
    # (its device's tensors; the pinned host copies are the CPU's), and below the model's
    # step without offloading.
    from autotune.bench.traced_step import real_step_peak
    from autotune.runner.fake_memory import trace_step
    from tests.fixtures.traced import Offloaded, Stack

    spec = WorkloadSpec(model="tests.fixtures.traced:Offloaded")
    traced = trace_step(spec, 4096, device_type="cuda")
    torch.manual_seed(0)
    x = torch.randn(4096, 256, device="cuda")
    real = real_step_peak(Offloaded().cuda().train(), x)
    assert traced.total_bytes == pytest.approx(real, rel=0.02)
    assert real < 0.8 * real_step_peak(Stack().cuda().train(), x)


def test_gpu_only_code_and_its_own_autocast_regions_hold_what_their_traces_for_cuda_say() -> None:
    # Traced on the CPU for CUDA: tensors the code makes on "cuda" by name (fake_device), and a
    # region kept in float32 by torch.autocast("cuda", enabled=False) in a bf16 trial
    # (fake_autocast.cuda_regions), each held here against the real CUDA step.
    from autotune.bench.traced_step import real_step_peak
    from autotune.runner.fake_memory import trace_step
    from tests.fixtures.named_cuda import POSITIONS, WIDTH, NamesCuda
    from tests.fixtures.traced import CudaFp32Region

    named = trace_step(
        WorkloadSpec(model="tests.fixtures.named_cuda:NamesCuda"), 8, device_type="cuda"
    )
    torch.manual_seed(0)
    x = torch.randn(8, POSITIONS, WIDTH, device="cuda")
    assert named.total_bytes == pytest.approx(real_step_peak(NamesCuda().cuda(), x), rel=0.02)
    spec = WorkloadSpec(model="tests.fixtures.traced:CudaFp32Region")
    region = trace_step(spec, 4096, "bf16", device_type="cuda")
    x = torch.randn(4096, 256, device="cuda")
    real = real_step_peak(CudaFp32Region().cuda(), x, amp="bf16")
    assert region.total_bytes == pytest.approx(real, rel=0.02)


def test_code_asking_after_its_gpu_and_overlapping_on_it_holds_what_its_trace_says() -> None:
    # On a machine with a GPU the code's questions get the GPU's own answers; its generator
    # made for CUDA and its record_stream meet the trace's CPU tensors (idle_gpu.for_cpu_tensors)
    from autotune.bench.traced_step import real_step_peak
    from autotune.runner.fake_memory import trace_step
    from tests.fixtures.asks_gpu import POSITIONS, WIDTH, OverlapsAndTimes

    spec = WorkloadSpec(model="tests.fixtures.asks_gpu:OverlapsAndTimes")
    traced = trace_step(spec, 8, device_type="cuda")
    assert traced.cuda_asked == ()  # this machine's answers: nothing assumed
    x = torch.randn(8, POSITIONS, WIDTH, device="cuda")
    real = real_step_peak(OverlapsAndTimes().cuda(), x)
    assert traced.total_bytes == pytest.approx(real, rel=0.02)


def _allocated_over_its_start(model: torch.nn.Module, x: torch.Tensor) -> int:
    """What the allocator's peak of a second bf16 AdamW step rose over what was allocated at
    its start (the parameters, the optimizer's state, the batch, and anything left before)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)

    def step() -> None:
        with torch.autocast("cuda", torch.bfloat16):
            loss = model(x).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = torch.cuda.memory_allocated()
    step()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - start


def test_flex_attention_on_cuda_holds_what_its_trace_for_cuda_says() -> None:
    # Traced on the CPU for CUDA (fake_flex), FlexAttention runs its dense kernels, as CUDA
    # runs it without torch.compile, and its fused kernel's shapes where the model's own code
    # compiled it: held here against the real CUDA step through the same tracker, and against
    # the allocator of the step as torch runs it (its front end, no dispatch mode).
    from autotune.bench.traced_step import real_step_peak
    from autotune.runner.fake_flex import CudaFlexAttention
    from autotune.runner.fake_memory import TensorPeak, trace_step
    from tests.fixtures.flex import WIDTH, CompiledFlexBlocks, FlexBlocks

    def traced(model: str) -> TensorPeak:
        spec = WorkloadSpec(model=f"tests.fixtures.flex:{model}")
        return trace_step(spec, 32, "bf16", device_type="cuda")

    def rise(peak: TensorPeak) -> int:  # the trace's peak over the parameters and their state
        return peak.total_bytes - peak.parameters_bytes - peak.optimizer_bytes

    dense = traced("FlexBlocks")
    torch.manual_seed(0)
    x = torch.randn(32, 256, WIDTH, device="cuda")
    real = real_step_peak(FlexBlocks().cuda().train(), x, amp="bf16", above=CudaFlexAttention)
    assert dense.total_bytes == pytest.approx(real, rel=0.02)
    eager = _allocated_over_its_start(FlexBlocks().cuda().train(), x)
    assert eager == pytest.approx(rise(dense), rel=0.10)
    fused = _allocated_over_its_start(CompiledFlexBlocks().cuda().train(), x)
    assert fused == pytest.approx(rise(traced("CompiledFlexBlocks")), rel=0.10)
    assert fused < 0.8 * eager


def test_a_model_the_caller_moved_to_the_gpu_is_pickled_in_host_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Unpickled as it was, every rank would have put its copy on the first GPU.
    import tempfile

    from autotune.runner import pickled
    from autotune.runner.references import import_location
    from tests.fixtures.models import Small

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    model = Small().cuda()
    reference = pickled.pickled_reference(model, "--model", None)
    del pickled._HELD[reference]
    _, loaded = pickled.load_pickled(reference, "--model", import_location)
    assert all(t.device.type == "cpu" for t in loaded.state_dict().values())
    assert all(t.is_cuda for t in model.state_dict().values())  # the caller's, where it was


def test_a_one_device_trial_gathering_from_every_rank_joins_an_nccl_group_of_one() -> None:
    # its all_gather and all_reduce run on NCCL, whose communicator the first one makes
    _ok(_trial("tests.fixtures.contrastive:GatheredTowers", global_batch_size=8))


@pytest.mark.parametrize("policy", ["full", "selective"])
def test_a_checkpointed_cuda_step_holds_what_its_trace_for_cuda_says(policy: str) -> None:
    # Selective checkpointing keeps its blocks' matmul and fused-attention outputs: on CUDA
    # those are the flash or memory-efficient kernels' (traced on the CPU by fake_attention).
    pytest.importorskip("transformers")
    from torch.utils.data import default_collate

    from autotune.bench.traced_step import real_step_peak
    from autotune.runner.checkpointing import apply_checkpointing, checkpoint_units
    from autotune.runner.fake_memory import trace_step
    from autotune.runner.workload import load_dataset, load_model

    spec = WorkloadSpec(model="examples.hf_models:llama_tiny")
    torch.manual_seed(0)
    module, model = load_model(spec.model)
    dataset = load_dataset(spec, module, model)[0]
    batch = {k: v.cuda() for k, v in default_collate([dataset[i] for i in range(8)]).items()}
    blocks = checkpoint_units(model).count
    apply_checkpointing(model, blocks, policy=policy)
    real = real_step_peak(model.cuda().train(), **batch, amp="bf16")
    traced = trace_step(spec, 8, "bf16", blocks, device_type="cuda", checkpoint_policy=policy)
    assert traced.total_bytes == pytest.approx(real, rel=0.05)


def test_a_cuda_step_in_backward_holds_what_its_trace_for_cuda_says() -> None:
    # each parameter's AdamW (foreach, as CUDA defaults) stepped as its gradient completes
    from autotune.bench.traced_step import built_batch, real_step_peak
    from autotune.runner.checkpointing import apply_checkpointing, checkpoint_units
    from autotune.runner.fake_memory import trace_step

    spec = WorkloadSpec(model="workloads.gpt:gpt_small")
    torch.manual_seed(0)
    model, batch = built_batch(spec, 1)
    blocks = checkpoint_units(model).count
    apply_checkpointing(model, blocks)
    cuda = {k: v.cuda() for k, v in batch.items()}
    peaks = {}
    for flag in (False, True):
        real = real_step_peak(model.cuda().train(), **cuda, in_backward=flag)
        traced = trace_step(spec, 1, "off", blocks, device_type="cuda", optimizer_in_backward=flag)
        assert traced.total_bytes == pytest.approx(real, rel=0.05), flag
        peaks[flag] = real
    assert peaks[True] < peaks[False]
