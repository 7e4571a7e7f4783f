"""What the memory prediction relies on in PyTorch's private tools (FakeTensorMode, MemTracker),
pinned: a release that changes it fails here, not in a search."""

from __future__ import annotations

import pytest

from autotune.bench.traced_step import real_batch_peak, real_step_peak
from autotune.runner.fake_memory import TraceError, trace_step
from autotune.runner.workload import WorkloadSpec
from tests.fixtures.optimizers import BLOCKS, PARAMETER_BYTES
from tests.fixtures.optimizers import WIDTH as WIDE_WIDTH
from tests.fixtures.traced import WIDTH

WIDE = WorkloadSpec(model="tests.fixtures.optimizers:Wide")
STACK = WorkloadSpec(model="tests.fixtures.traced:Stack")
STACK_PARAMETER_BYTES = 4 * (256 * 1024 + 1024 + 1024 * 256 + 256) * 4


def test_parameters_gradients_and_the_users_optimizer_state_are_counted_exactly() -> None:
    sgd = trace_step(WIDE, 8)  # the module's autotune_optimizer: plain SGD, no state
    adamw = trace_step(WIDE.model_copy(update={"optimizer": "tests.fixtures.optimizers:adamw"}), 8)
    assert sgd.parameters_bytes == adamw.parameters_bytes == PARAMETER_BYTES
    assert sgd.gradient_bytes_full == PARAMETER_BYTES
    assert sgd.optimizer_bytes == 0
    # exp_avg and exp_avg_sq, and the step's foreach temporaries at its peak
    assert 2 * PARAMETER_BYTES <= adamw.optimizer_bytes <= 3 * PARAMETER_BYTES
    assert adamw.total_bytes - sgd.total_bytes >= 2 * PARAMETER_BYTES


def test_an_optimizer_that_branches_on_values_in_its_step_is_traced() -> None:
    # Adafactor (seen on a user's T5) stopped the trace at min(lr, 1 / step.item() ** 0.5): in
    # the step, a value read out is concrete, since an optimizer's values decide its numbers,
    # not what it allocates. At the step's peak: its factored state (a row and a column per
    # matrix, a second moment per bias) and one matrix's variance estimate (row @ column).
    factored = 2 * BLOCKS * WIDE_WIDTH * 4 + BLOCKS * WIDE_WIDTH * 4
    optimizer = "tests.fixtures.optimizers:adafactor"
    peak = trace_step(WIDE.model_copy(update={"optimizer": optimizer}), 8)
    assert peak.optimizer_bytes == pytest.approx(factored + WIDE_WIDTH**2 * 4, rel=0.01)
    assert peak.optimizer_bytes < PARAMETER_BYTES / 3  # AdamW's: twice the parameters


def test_an_optimizer_that_makes_its_state_when_built_is_counted_once() -> None:
    # Adagrad's sums exist from its constructor on, so the first step's backward holds them
    # already: a DLRM trained with Adagrad was predicted to hold them twice (2x its state).
    import torch

    from tests.fixtures.optimizers import Wide

    traced = trace_step(
        WIDE.model_copy(update={"optimizer": "tests.fixtures.optimizers:adagrad"}), 8
    )
    real = real_step_peak(Wide(), torch.randn(8, WIDE_WIDTH), optimizer="Adagrad")
    assert traced.total_bytes == pytest.approx(real, rel=0.01)
    assert PARAMETER_BYTES <= traced.optimizer_bytes < 1.5 * PARAMETER_BYTES


def test_frozen_parameters_hold_no_gradient_and_no_optimizer_state() -> None:
    # MemTracker hooks every parameter's gradient; a frozen one refuses the hook
    frozen = WorkloadSpec(
        model="tests.fixtures.optimizers:HalfFrozen",
        optimizer="tests.fixtures.optimizers:trainable_adamw",
    )
    peak = trace_step(frozen, 8)
    assert peak.parameters_bytes == PARAMETER_BYTES
    assert peak.gradient_bytes_full == PARAMETER_BYTES // 2
    assert peak.gradients_bytes <= PARAMETER_BYTES // 2
    assert PARAMETER_BYTES <= peak.optimizer_bytes <= 3 * PARAMETER_BYTES // 2


def test_nothing_is_allocated() -> None:
    import resource

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    peak = trace_step(STACK, 32768)  # gigabytes of activations, if they were real
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert peak.total_bytes > 2**30
    assert grown * 1024 < peak.total_bytes / 10


def test_activations_grow_with_the_micro_batch_and_shrink_with_checkpointing_and_bf16() -> None:
    small, large = trace_step(STACK, 4096), trace_step(STACK, 8192)
    assert large.activations_bytes == pytest.approx(2 * small.activations_bytes, rel=0.1)
    assert small.parameters_bytes == STACK_PARAMETER_BYTES
    assert small.block_parameters_bytes == STACK_PARAMETER_BYTES // 4
    checkpointed = [trace_step(STACK, 8192, checkpoint_segments=k).total_bytes for k in (0, 2, 4)]
    assert checkpointed[0] > checkpointed[1] > checkpointed[2]
    assert trace_step(STACK, 8192, amp="bf16").activations_bytes < large.activations_bytes


def test_a_model_the_fake_tensors_cannot_trace_raises_one_line() -> None:
    with pytest.raises(TraceError, match="depends on tensor values") as raised:
        trace_step(WorkloadSpec(model="tests.fixtures.traced:DataDependent"), 2)
    assert "\n" not in str(raised.value)


def test_an_error_of_the_model_itself_is_named_as_possibly_its_own_and_prints_nothing(
    capfd: pytest.CaptureFixture[str],
) -> None:
    # A shape the model gets wrong fails a meta kernel's check: fake tensors are not at fault,
    # and torch's own log of the failure (a traceback on stderr) is not the user's to read.
    with pytest.raises(TraceError, match="must have same reduction dim") as raised:
        trace_step(WorkloadSpec(model="tests.fixtures.traced:Mismatched"), 2)
    assert "\n" not in str(raised.value) and "the model is at fault" in str(raised.value)
    assert capfd.readouterr().err == ""


def test_a_size_no_routing_rule_decides_falls_back_in_one_line_and_prints_nothing(
    capfd: pytest.CaptureFixture[str],
) -> None:
    import gc

    with pytest.raises(TraceError, match=r"torch\.where\(mask\)") as raised:
        trace_step(WorkloadSpec(model="tests.fixtures.traced:Thresholded"), 2)
    assert "\n" not in str(raised.value)
    del raised
    gc.collect()  # the fake storages of data-dependent size are collected: their callbacks run
    assert capfd.readouterr().err == ""


def test_a_model_whose_constructor_reads_its_values_is_built_on_meta_and_traced() -> None:
    # Hugging Face ViT could not be built under fake tensors (trunc_normal_'s mask.any()), so
    # every ViT fell back to the fit over trials; its shapes are the same on the meta device.
    import torch

    from tests.fixtures.traced import InitReadsValues

    spec = WorkloadSpec(model="tests.fixtures.traced:InitReadsValues")
    traced = trace_step(spec, 8)
    assert traced.parameters_bytes == STACK_PARAMETER_BYTES
    real = real_step_peak(InitReadsValues(), torch.randn(8, 256))
    assert traced.total_bytes == pytest.approx(real, rel=0.01)


def test_a_model_its_factory_builds_on_the_meta_device_is_traced_as_built_for_real() -> None:
    # Its fakes were on the meta device: the step's move to the CPU failed ("_apply(): Couldn't
    # swap Linear.weight") and `autotune plan` fell back, for the very models built that way
    # because they do not fit the machine that plans them.
    on_meta = trace_step(WorkloadSpec(model="tests.fixtures.traced:stack_on_meta"), 8)
    assert on_meta == trace_step(STACK, 8)


def test_a_custom_function_running_modules_on_views_of_its_input_is_traced() -> None:
    # Reformer's reversible layers stopped the trace ("Expected gradient function to be set"):
    # the memory tracker hooks every module's inputs' gradients, and a view made inside a
    # custom autograd Function's forward has no node to hook. Its backward runs them again.
    import torch

    from tests.fixtures.traced import Reversible

    traced = trace_step(WorkloadSpec(model="tests.fixtures.traced:Reversible"), 8)
    real = real_step_peak(Reversible(), torch.randn(8, 16, 256))
    assert traced.total_bytes == pytest.approx(real, rel=0.01)
    assert traced.gradients_bytes > 0 and traced.unused_parameters == 0


def test_layerdrop_and_a_masked_assignment_are_traced_as_a_step_that_drops_nothing() -> None:
    # Hugging Face Wav2Vec2 in training fell back to the fit: LayerDrop branches on a draw,
    # SpecAugment assigns through a random mask and backward selects by it.
    import torch

    from tests.fixtures.traced import Dropped

    traced = trace_step(WorkloadSpec(model="tests.fixtures.traced:Dropped"), 8)
    assert traced.drawn_branches == 4 and traced.routed_sizes == 0  # one draw per layer
    assert traced.needs_unused_parameters  # a dropped layer leaves DDP parameters unused
    real = real_step_peak(Dropped(layerdrop=0.0), torch.randn(8, 32, 256))  # every layer runs
    assert traced.total_bytes == pytest.approx(real, rel=0.01)


def test_parameters_a_step_leaves_without_a_gradient_are_counted() -> None:
    head = trace_step(WorkloadSpec(model="tests.fixtures.models:AuxHead"), 4)
    assert head.unused_parameters == 2 and head.needs_unused_parameters  # its weight and bias
    small = trace_step(WorkloadSpec(model="tests.fixtures.models:Small"), 4)
    assert small.unused_parameters == 0 and not small.needs_unused_parameters


def test_a_selection_by_the_batchs_labels_is_traced_at_the_first_samples_share() -> None:
    # DeBERTa-v2's classification loss fell back to the fit: (labels >= 0).nonzero() counts
    # values a fake batch does not have. Half of these positions are unlabelled (-100).
    from torch.utils.data import default_collate

    from tests.fixtures.labelled import HalfLabelled, LabelFiltered

    traced = trace_step(WorkloadSpec(model="tests.fixtures.labelled:LabelFiltered"), 8)
    assert traced.sampled_selections == 1 and traced.routed_sizes == traced.drawn_branches == 0
    batch = default_collate([HalfLabelled()[i] for i in range(8)])
    assert traced.total_bytes == real_step_peak(LabelFiltered(), **batch)


def test_a_ctc_head_is_traced_at_a_real_steps_peak() -> None:
    # Wav2Vec2ForCTC fell back to the fit: its labels.max() check, the mask of (labels !=
    # -100) & (labels != blank), and CTC's kernel sizing its table by the longest target
    spec = WorkloadSpec(model="tests.fixtures.ctc:CTCRecogniser")
    traced = trace_step(spec, 8)
    assert traced.sampled_selections >= 2 and traced.routed_sizes == 0
    assert traced.total_bytes == real_batch_peak(spec, 8)


def test_a_module_converted_to_its_own_dtype_in_forward_is_traced() -> None:
    # Switch Transformers' router: under fake tensors Module._apply swaps the parameters, which
    # the tracker's weak references forbid (_apply(): Couldn't swap Linear.weight)
    import torch

    from tests.fixtures.traced import MovesItsRouter

    traced = trace_step(WorkloadSpec(model="tests.fixtures.traced:MovesItsRouter"), 8)
    assert traced.total_bytes == pytest.approx(
        real_step_peak(MovesItsRouter(), torch.randn(8, 256)), rel=0.01
    )
    # what it relies on: torch's private parser of .to()'s arguments
    assert torch._C._nn._parse_to(torch.float32)[:2] == (None, torch.float32)
    assert torch._C._nn._parse_to("cpu", dtype=torch.bfloat16)[:2] == (
        torch.device("cpu"),
        torch.bfloat16,
    )
    assert torch.nn.Module.to is not None and "unmoved" not in torch.nn.Module.to.__qualname__


def test_an_lstms_onednn_workspace_is_counted_at_a_real_steps_peak() -> None:
    # mkldnn_rnn_layer's fake kernel gave its workspace no elements: an LSTM traced 30-51% low
    from autotune.runner.fake_recurrent import measured_workspace, workspace_bytes

    spec = WorkloadSpec(model="tests.fixtures.packed:Unpacked")
    for micro_batch in (8, 16):
        traced = trace_step(spec, micro_batch)
        assert traced.total_bytes == pytest.approx(real_batch_peak(spec, micro_batch), rel=0.01)
    # the fit over four small shapes, against the real kernel's workspace at a larger one
    # (oneDNN sizes it by the machine's instructions: 9.8 MiB here on an AMD EPYC)
    import torch

    real_workspace = measured_workspace(128, 256, torch.float32, True, 40, 16)
    fitted = workspace_bytes(128, 256, torch.float32, True, 40, 16)
    assert fitted == pytest.approx(real_workspace, rel=0.05)


def test_a_workspace_dtype_the_cpu_cannot_run_takes_fp32s(monkeypatch: pytest.MonkeyPatch) -> None:
    # oneDNN on a CPU without fp16 has no LSTM in fp16 (a CUDA plan's autocast): the calibration
    # raised and the whole trace fell back to the fit over trials
    import torch

    from autotune.runner import fake_recurrent

    layer = fake_recurrent._LAYER

    def no_half(*args: object) -> object:
        if args[0].dtype is torch.float16:  # type: ignore[attr-defined]
            raise RuntimeError("could not create a primitive descriptor for the LSTM")
        return layer(*args)

    fake_recurrent._workspace_fit.cache_clear()
    monkeypatch.setattr(fake_recurrent, "_LAYER", no_half)
    try:
        half = fake_recurrent.workspace_bytes(64, 128, torch.float16, True, 20, 8)
        assert half == fake_recurrent.workspace_bytes(64, 128, torch.float32, True, 20, 8) > 0
    finally:
        fake_recurrent._workspace_fit.cache_clear()


def _torch_before(*release: int) -> bool:
    import torch
    from packaging.version import Version

    return Version(torch.__version__).release < release


OLDER_LSTM = pytest.mark.xfail(
    _torch_before(2, 13),
    reason="torch 2.11 runs a packed LSTM of one length on its own kernel, as the trace then "
    "does: 54.8 MB traced against 58.5 of a real step (6.4% low; over mixed lengths below)",
    strict=True,
)


@pytest.mark.parametrize(
    ("model", "rel"),
    [
        pytest.param("PackedTagger", 0.01, marks=OLDER_LSTM),
        pytest.param("packed_gru", 0.05, marks=pytest.mark.slow),  # ~8 s
    ],
)
def test_recurrent_layers_over_packed_sequences_are_traced_at_a_real_steps_peak(
    model: str, rel: float
) -> None:
    # pack_padded_sequence's rows are the lengths' sum, and the layers read batch_sizes' values
    # in C++: the trace stopped. Packed at the first samples' mean length, run unpacked: an LSTM
    # within 1% of a real step, a GRU 3-4% low (torch's packed GRU holds a little more than
    # its unpacked one, which the trace meets exactly)
    spec = WorkloadSpec(model=f"tests.fixtures.packed:{model}")
    traced = trace_step(spec, 16)
    assert traced.sampled_selections == 1 and traced.routed_sizes == 0
    assert traced.total_bytes == pytest.approx(real_batch_peak(spec, 16), rel=rel)


@pytest.mark.parametrize(
    "model",
    ["PackedTagger", pytest.param("packed_gru", marks=pytest.mark.slow)],  # ~4 s
)
def test_packed_sequences_of_mixed_lengths_are_traced_on_torchs_own_kernel(model: str) -> None:
    # Over mixed lengths torch runs its own kernel, not oneDNN's (which keeps a workspace):
    # the LSTM's block, traced as oneDNN's, lay 49.8% over a real step (82.7 against 55.2
    # MiB); on torch's kernel 6.2% under it (the GRU, which has no such workspace, 2.5%).
    spec = WorkloadSpec(
        model=f"tests.fixtures.packed:{model}", data="tests.fixtures.packed:MixedLengths"
    )
    assert trace_step(spec, 16).total_bytes == pytest.approx(real_batch_peak(spec, 16), rel=0.1)


def test_a_cuda_trace_keeps_onednns_workspace_for_cudnns_reserve_over_mixed_lengths() -> None:
    spec = WorkloadSpec(
        model="tests.fixtures.packed:PackedTagger", data="tests.fixtures.packed:MixedLengths"
    )
    on_cpu, for_cuda = (trace_step(spec, 16, device_type=d).total_bytes for d in ("cpu", "cuda"))
    assert for_cuda > 1.4 * on_cpu  # 82.7 against 51.8 MiB: the stand-in, unmeasured on CUDA


def test_unpadding_by_the_batchs_attention_mask_is_traced_at_the_first_samples_share() -> None:
    from torch.utils.data import default_collate

    from tests.fixtures.labelled import HalfPadded, Unpadded

    spec = WorkloadSpec(
        model="tests.fixtures.labelled:Unpadded", data="tests.fixtures.labelled:padded_data"
    )
    traced = trace_step(spec, 8)
    assert traced.sampled_selections == 1
    batch = default_collate([HalfPadded()[i] for i in range(8)])
    assert traced.total_bytes == real_step_peak(Unpadded(), **batch)


def test_a_mixture_of_experts_is_traced_at_uniform_routing() -> None:
    """Every token reaches its two experts whatever the router's split, so what the experts
    hold for backward sums to the same bytes as under any routing: the trace's estimate (each
    expert its share) meets a real step's peak."""
    import torch

    from tests.fixtures.traced import Routed

    torch.manual_seed(0)
    tokens = 256
    real = real_step_peak(Routed(), torch.randn(tokens, 8, WIDTH))
    traced = trace_step(WorkloadSpec(model="tests.fixtures.traced:Routed"), tokens)
    # the experts hit; per expert its tokens and its index, read to select a mask and 2 weights
    assert traced.routed_sizes == 1 + Routed.experts * (1 + 3)
    assert traced.total_bytes == pytest.approx(real, rel=0.01)
    assert traced.activations_bytes > traced.parameters_bytes  # the tokens' share is what is judged


@pytest.mark.parametrize("experts", ["grouped_mm", "eager"])
def test_hugging_face_mixtral_is_traced_as_a_real_step_measures(experts: str) -> None:
    """Its default experts multiply with ``torch._grouped_mm``, whose fake kernel refuses fp32
    (the CPU kernel takes it); its eager experts route with ``torch.where``."""
    pytest.importorskip("transformers")
    import torch

    from examples import hf_models

    torch.manual_seed(0)
    model = hf_models.mixtral_tiny(experts)
    batch = torch.randint(0, model.config.vocab_size, (4, hf_models.SEQ_LEN))
    real = real_step_peak(model, input_ids=batch, labels=batch)
    name = "mixtral_tiny" if experts == "grouped_mm" else "mixtral_tiny_eager"
    traced = trace_step(WorkloadSpec(model=f"examples.hf_models:{name}"), 4)
    assert traced.total_bytes == pytest.approx(real, rel=0.01)
    assert (traced.routed_sizes > 0) == (experts == "eager")


def test_switch_transformers_capacity_routing_is_traced() -> None:
    # It stopped three times: the router converts itself to its dtype in forward, a token's
    # place among its expert's (cumsum of the one-hot routing) is kept within a capacity, and
    # an expert is named f"expert_{index}" from a 0-dim tensor. Traced now, but under a real
    # step's tensors at random initialisation: 11% here, 4-6% with 64-token inputs. With one
    # expert the trace is exact, so the gap is in the split: likely a transient that follows
    # the largest expert's tokens, which uniform routing takes as 1/4 (not measured). Pinned as
    # it stands, so a change either way shows.
    pytest.importorskip("transformers")
    spec = WorkloadSpec(
        model="tests.fixtures.hf_zoo:switch", data="tests.fixtures.hf_zoo:data_switch"
    )
    traced = trace_step(spec, 4)
    assert traced.routed_sizes > 0
    assert 0.85 < traced.total_bytes / real_batch_peak(spec, 4) < 0.95


def test_tokens_per_expert_counted_and_split_as_torchtitan_loops_over_experts() -> None:
    """Counts read out of routing (``histc`` or ``bincount``, then ``.tolist()``) are each
    expert's share, so splitting the sorted tokens by them works."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    from autotune.runner.fake_routing import UniformRouting

    with FakeTensorMode(shape_env=ShapeEnv(), static_shapes=True), UniformRouting() as routing:
        _, chosen = torch.topk(torch.randn(64, 8), 2, dim=-1)  # 128 choices of 8 experts
        flat = chosen.view(-1)
        histogram = torch.histc(flat.float(), bins=8, min=0, max=7).tolist()
        counts = torch.bincount(flat, minlength=8).tolist()
        tokens = torch.randn(128, 4)[torch.argsort(flat, stable=True)]
        parts = torch.split(tokens, [int(c) for c in counts])
        first_expert = torch.masked_select(torch.randn(64, 2), chosen == 0)
    assert histogram == [16.0] * 8
    assert first_expert.shape == (16,)
    assert counts == [16] * 8
    assert [p.shape[0] for p in parts] == [16] * 8
    assert routing.estimated == 1 + 8 + 8 + 1  # the bincount, each value read, the selection


def test_counts_that_do_not_divide_evenly_still_sum_to_the_tokens() -> None:
    """100 choices over 7 experts: each count read as 14 summed to 98 and torch.split refused
    them; the counts now take the rounding's leftovers in turn (15, 15, 14, ...)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    from autotune.runner.fake_routing import UniformRouting

    with FakeTensorMode(shape_env=ShapeEnv(), static_shapes=True), UniformRouting():
        _, chosen = torch.topk(torch.randn(50, 7), 2, dim=-1)
        flat = chosen.view(-1)
        counts = torch.bincount(flat, minlength=7).tolist()
        histogram = torch.histc(flat.float(), bins=7, min=0, max=6).tolist()
        parts = torch.split(torch.randn(100, 4), [int(c) for c in counts])
    assert counts == [15, 15, 14, 14, 14, 14, 14]
    assert sum(histogram) == 100.0 and max(histogram) - min(histogram) == 1.0
    assert sum(p.shape[0] for p in parts) == 100


def test_the_fake_grouped_mm_still_refuses_fp32() -> None:
    """Pins why ``fake_routing`` shapes ``torch._grouped_mm`` itself for fp32: once the fake
    kernel takes fp32, the override can go. Its shapes match the CPU kernel's."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from autotune.runner.fake_routing import _grouped_mm_output

    a, b = torch.randn(12, 16), torch.randn(3, 16, 8)
    offs = torch.tensor([4, 8, 12], dtype=torch.int32)
    grads = torch.randn(12, 8)
    for args in ((a, b, offs), (a.t(), grads, offs)):  # forward; the weights' gradient
        assert _grouped_mm_output(*args).shape == torch._grouped_mm(*args).shape
    refusal = r"BF16|BFloat16"  # torch 2.13's words, 2.14's
    with FakeTensorMode(allow_non_fake_inputs=True), pytest.raises(RuntimeError, match=refusal):
        torch._grouped_mm(a, b, offs=offs)


@pytest.mark.parametrize("device_type", ["cpu", "cuda"])
def test_blocks_the_model_compiles_itself_with_fullgraph_are_traced_as_eager(
    device_type: str, recwarn: pytest.WarningsRecorder
) -> None:
    # torchtitan compiles a model block by block (fullgraph=True): the trace's dispatch modes
    # keep dynamo from compiling, which a fullgraph compile raised for ("found no compiled
    # frames"), so the model could not be traced at all; the warning of global module hooks
    # beside a compiled module is the tracker's own
    def traced(name: str) -> int:
        spec = WorkloadSpec(model=f"tests.fixtures.precompiled:{name}", input_shape=(16,))
        return trace_step(spec, 8, device_type=device_type).total_bytes

    assert traced("CompilesItsBlocks") == traced("Net")
    assert not [w for w in recwarn if "global hooks" in str(w.message)]


def test_a_value_read_for_logging_in_forward_does_not_stop_the_trace() -> None:
    logs = trace_step(WorkloadSpec(model="tests.fixtures.traced:LogsValues"), 2)
    assert logs.parameters_bytes == (WIDTH * WIDTH + WIDTH) * 4


def _two_traced_steps(micro_batch: int, micro_steps: int = 1) -> int:
    """The peak of two whole steps of Stack under MemTracker, as PyTorch's tests use it, each
    accumulating the gradients of ``micro_steps`` forwards and backwards, the output held as a
    trial's step holds it: through backward and the optimizer's step, until the next forward's
    output replaces it."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

    from tests.fixtures.traced import Stack

    with FakeTensorMode():
        model = Stack()
        optimizer = torch.optim.AdamW(model.parameters())
        batch = torch.zeros(micro_batch, 256)
        tracker = MemTracker()
        tracker.track_external(model, optimizer)
        with tracker:
            for _ in range(2):
                for _ in range(micro_steps):  # the default loss, without a target
                    output = model(batch)
                    output.square().mean().backward()
                    tracker.reset_mod_stats()  # one forward per module per iteration
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                tracker.reset_mod_stats()
        return int(next(iter(tracker.get_tracker_snapshot("peak").values()))["Total"])


@pytest.mark.parametrize("micro_batch", [64, 8192])  # the peak in the step; in backward
def test_one_traced_step_plus_the_state_is_the_peak_of_two(micro_batch: int) -> None:
    # to a few bytes: a scalar or two (the loss, a step counter) live at different moments
    assert abs(trace_step(STACK, micro_batch).total_bytes - _two_traced_steps(micro_batch)) < 1024


@pytest.mark.parametrize("micro_batch", [64, 8192])  # the peak in the step; in backward
def test_an_accumulating_step_holds_the_earlier_micro_steps_gradients_as_predicted(
    micro_batch: int,
) -> None:
    from autotune.config import TrainConfig
    from autotune.search.memory_model import device_parts

    peak = trace_step(STACK, micro_batch)
    config = TrainConfig(global_batch_size=2 * micro_batch, grad_accum_steps=2, device="cpu")
    predicted = sum(device_parts(peak, config).values())
    traced = _two_traced_steps(micro_batch, micro_steps=2)
    if micro_batch == 8192:  # the gradients were not there at the one step's peak: added
        assert predicted - peak.total_bytes == STACK_PARAMETER_BYTES
        assert abs(predicted - traced) < 1024
    else:  # the peak moves from the optimizer step to the second backward, where each new
        # gradient is computed beside the one it is added to: a temporary not counted (4% here)
        assert predicted == peak.total_bytes
        assert 0 < traced - predicted < 0.05 * traced


def test_sparse_gradients_of_lookups_are_traced_at_a_real_steps_peak() -> None:
    # A recommender's EmbeddingBag(sparse=True) stopped the trace (the tracker asked a sparse
    # gradient for its storage), and fake tensors gave such a gradient no entries.
    import torch

    from tests.fixtures import sparse

    traced = trace_step(WorkloadSpec(model="tests.fixtures.sparse:Lookups"), 32)
    batch = torch.stack([sparse.Ids()[i] for i in range(32)])
    real = real_step_peak(sparse.Lookups(), batch, optimizer="SGD")
    assert traced.total_bytes == pytest.approx(real, rel=0.01)
    # One entry per index looked up, in each table: a small share of the tables' gradients
    entries = 2 * 32 * sparse.LOOKUPS * (sparse.DIM * 4 + 8)  # values, int64 indices
    head = (2 * sparse.DIM + 1) * 4
    assert traced.gradient_bytes_full == entries + head


def test_a_sparse_clone_and_sum_keep_their_entries_under_the_trace() -> None:
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from autotune.runner.fake_routing import UniformRouting

    with FakeTensorMode(allow_non_fake_inputs=True):
        a, b = (
            torch.sparse_coo_tensor(
                torch.zeros(1, n, dtype=torch.long),
                torch.zeros(n, 3),
                (9, 3),
                check_invariants=False,
            )
            for n in (40, 8)
        )
        assert a.clone()._nnz() == 0  # fake tensors' own kernel: what this mode mends
        with UniformRouting():
            assert a.clone()._nnz() == 40 and (a * 2)._nnz() == 40
            assert (a + b)._nnz() == 48  # uncoalesced, as a real sum of the two holds


def test_a_batch_the_users_collate_function_pads_is_traced_at_a_real_steps_peak() -> None:
    # Samples of different lengths: the traced batch is the one the collate function makes of
    # the first samples (padded to the longest of them), as a real step on that batch holds.
    import torch

    from tests.fixtures import padded

    traced = trace_step(WorkloadSpec(model="tests.fixtures.padded:Tagger"), 8)
    batch = padded.autotune_collate([padded.Sentences()[i] for i in range(8)])
    assert batch["ids"].shape[1] == max(padded.length(i) for i in range(8))
    model = padded.Tagger()

    class WithLoss(torch.nn.Module):  # the user's loss, as the trial computes it
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, **batch: torch.Tensor) -> torch.Tensor:
            return padded.autotune_loss(self.model(**batch), batch)

    real = real_step_peak(WithLoss(), **batch)
    assert traced.total_bytes == pytest.approx(real, rel=0.01)


@pytest.mark.parametrize("micro_batch", [12, 80])
def test_a_graph_batch_sized_by_its_own_values_is_traced_at_a_real_steps_peak(
    micro_batch: int,
) -> None:
    # The number of graphs in a batch is a value (the largest graph index + 1); the traced batch
    # holds exactly the samples the collate function batched, so the trace reads the batch's
    # own number rather than stopping (it fell back to the fit over trials before). Past the 64
    # samples a padded batch is widened from, concatenated nodes cannot be widened: the whole
    # micro-batch is batched.
    import torch

    from tests.fixtures import graphs

    spec = WorkloadSpec(model="tests.fixtures.graphs:Classifier")
    traced = trace_step(spec, micro_batch)
    assert traced.sampled_selections == traced.routed_sizes == 0, "read exactly, not assumed"
    samples = [graphs.Graphs()[i] for i in range(micro_batch)]
    x, edges, graph, labels = graphs.autotune_collate(samples)
    model = graphs.Classifier()

    class WithLoss(torch.nn.Module):  # the default loss for integer targets, as a trial's
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.cross_entropy(self.model(*inputs), labels)

    real = real_step_peak(WithLoss(), x, edges, graph)
    assert traced.total_bytes == pytest.approx(real, rel=0.001)


@pytest.mark.parametrize("collate", [None, "tests.fixtures.graph_objects:as_dataclass"])
def test_a_graph_batch_in_an_object_is_traced_as_its_tensors_are(collate: str | None) -> None:
    # A PyTorch Geometric batch (neither tensor, dict nor tuple) was passed through as it was:
    # its real tensors beside the fake ones, a batch of the first 64 graphs whatever the
    # micro-batch, so past it the trace failed against the widened labels and fell back. Its
    # tensors, and a dataclass's, are now faked as a tuple's: the same peak as the tuple batch's
    # (traced at a real step's, above).
    model = "tests.fixtures.graph_objects:Classifier"
    traced = trace_step(WorkloadSpec(model=model, collate=collate), 80)
    as_tuples = trace_step(WorkloadSpec(model="tests.fixtures.graphs:Classifier"), 80)
    assert traced.total_bytes == as_tuples.total_bytes
    assert traced.sampled_selections == traced.routed_sizes == 0, "read exactly, not assumed"


def test_a_model_of_lazy_modules_is_traced_with_its_shapes() -> None:
    from tests.fixtures.lazy import CLASSES, FEATURES, HIDDEN

    peak = trace_step(WorkloadSpec(model="tests.fixtures.lazy:LazyMLP"), 8)
    weights = HIDDEN * FEATURES + 3 * HIDDEN + CLASSES * HIDDEN + CLASSES + 2 * HIDDEN  # + running
    assert peak.parameters_bytes == 4 * weights + 8  # num_batches_tracked: one int64


def test_an_ensemble_under_vmap_is_traced_at_a_real_steps_peak() -> None:
    # The tracker asked vmap's batched parameters for their storage, which they do not have
    # ("Cannot access storage of BatchedTensorImpl"): the trace fell back to a fit.
    import torch

    from autotune.runner.fake_memory import _transformed
    from tests.fixtures.ensemble import FEATURES, Ensemble

    spec = WorkloadSpec(model="tests.fixtures.ensemble:Ensemble", input_shape=(FEATURES,))
    traced = trace_step(spec, 256)
    real = real_step_peak(Ensemble(), torch.randn(256, FEATURES))
    assert traced.total_bytes == pytest.approx(real, rel=0.01)
    assert traced.activations_bytes > traced.parameters_bytes  # vmap's outputs counted
    seen = []
    torch.vmap(lambda t: seen.append(_transformed(t)) or t)(torch.ones(2, 3))
    assert seen == [True] and not _transformed(torch.ones(2))


def test_maml_s_backward_inside_its_forward_is_traced_at_a_real_steps_peak() -> None:
    # The inner autograd.grad ends the modules it runs through, and the tracker refused their
    # second forward ("multiple iterative calls", then "hierarchy tracking is wrong").
    from torch.utils.data import default_collate

    from tests.fixtures.maml import Maml, Tasks

    traced = trace_step(WorkloadSpec(model="tests.fixtures.maml:Maml"), 512)
    support, target, query, _ = default_collate([Tasks()[i % 64] for i in range(512)])
    real = real_step_peak(Maml(), support, target, query)
    assert traced.total_bytes == pytest.approx(real, rel=0.01)
    assert traced.activations_bytes > 512 * 256 * 4 * 4  # the hidden layer's, both passes


def test_a_batch_encoding_batch_is_traced_at_a_real_steps_peak() -> None:
    # Hugging Face's BatchEncoding is one leaf to torch's pytree: its tensors were left real,
    # at the collated samples' count, beside the fake model.
    import torch

    from tests.fixtures import encodings

    traced = trace_step(WorkloadSpec(model="tests.fixtures.encodings:Classifier"), 16)
    batch = encodings.autotune_collate([encodings.Encoded()[i] for i in range(16)])
    model = encodings.Classifier()

    class WithLoss(torch.nn.Module):  # the default loss, against the batch's labels
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            logits = self.model(input_ids, attention_mask)
            return torch.nn.functional.cross_entropy(logits, batch["labels"])

    real = real_step_peak(WithLoss(), input_ids=batch["input_ids"],
                          attention_mask=batch["attention_mask"])  # fmt: skip
    assert traced.total_bytes == pytest.approx(real, rel=0.01)


def test_a_warning_the_models_construction_gives_is_shown_once_for_all_traces() -> None:
    import warnings

    spec = WorkloadSpec(model="tests.fixtures.models:Deprecated")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("default")  # once a place, as a user's interpreter shows them
        trace_step(spec, 4)
        trace_step(spec, 8)  # builds the model again
    assert [str(w.message) for w in seen].count("Deprecated's argument is deprecated") == 1


def test_a_looped_layers_checkpointed_calls_are_traced_at_a_real_steps_peak() -> None:
    # One layer applied four times: the trace counts its calls as a rank does and checkpoints
    # the same ones, so each k is a step of its own, and the peak a real step's.
    import torch

    from autotune.runner.checkpointing import apply_checkpointing, count_calls
    from tests.fixtures.looped import Looped, autotune_dataset

    spec = WorkloadSpec(model="tests.fixtures.looped:Looped")
    peaks = [trace_step(spec, 512, checkpoint_segments=k).total_bytes for k in (0, 2, 4)]
    assert peaks[0] > peaks[1] > peaks[2]
    batch = torch.stack(autotune_dataset * 8)
    for segments, traced in zip((0, 4), (peaks[0], peaks[2]), strict=True):
        model = Looped()
        apply_checkpointing(model, segments, count_calls(model, lambda m=model: m(batch[:2])))
        assert traced == real_step_peak(model, batch)


@pytest.mark.parametrize("name", ["NormalVAE", "Flow"])
def test_models_written_with_torch_distributions_are_traced_at_a_real_steps_peak(
    name: str,
) -> None:
    # A distribution checks its arguments and raises unless every element holds: a branch on
    # values, which stopped the trace ("a size or branch depends on tensor values"). The trace
    # skips the checks (a real step makes them), and puts the default back.
    import torch
    from torch.distributions import Distribution

    from tests.fixtures import distributions

    validating = Distribution._validate_args  # private: ``fake_routing.unchecked_distributions``
    traced = trace_step(WorkloadSpec(model=f"tests.fixtures.distributions:{name}"), 16)
    assert Distribution._validate_args is validating
    model = getattr(distributions, name)()
    real = real_step_peak(model, torch.stack(distributions.autotune_dataset[:16]))
    assert real - 4 <= traced.total_bytes <= real  # the real step's own loss squared: 4 bytes
