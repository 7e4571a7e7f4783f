from __future__ import annotations

import copy
from typing import ClassVar

import pytest
import torch
import torch.nn as nn

from autotune.errors import ConfigError
from autotune.runner.blocks import block_classes, find_repeated_blocks, may_loop
from autotune.runner.checkpointing import (
    apply_checkpointing,
    checkpoint_order,
    checkpoint_units,
    checkpoints_itself,
    count_calls,
    looped_modules,
)
from tests.fixtures.conv_units import ConvNeXt, GoogLeNet, MobileNet
from workloads.convnet import BasicBlock, resnet_tiny
from workloads.gpt import Block, gpt_tiny


def test_finds_blocks_in_a_module_list() -> None:
    model = gpt_tiny()
    blocks = find_repeated_blocks(model)
    assert blocks == list(model.blocks)
    assert all(isinstance(b, Block) for b in blocks)


def test_finds_blocks_across_stages_and_in_torch_builtins() -> None:
    assert all(isinstance(b, BasicBlock) for b in find_repeated_blocks(resnet_tiny()))
    layer = nn.TransformerEncoderLayer(16, 2, 32, batch_first=True)
    encoder = nn.TransformerEncoder(layer, num_layers=3, enable_nested_tensor=False)
    found = find_repeated_blocks(encoder)
    assert len(found) == 3 and all(isinstance(b, nn.TransformerEncoderLayer) for b in found)
    assert find_repeated_blocks(nn.Linear(3, 3)) == []


class _MixtureLayer(nn.Module):
    """A decoder layer whose feed-forward is four experts: eight expert instances in two layers
    outnumber the layers, yet the layer is the block (checkpointed and sharded whole)."""

    def __init__(self) -> None:
        super().__init__()
        self.attention = nn.MultiheadAttention(8, 2, batch_first=True)
        self.experts = nn.ModuleList(
            nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8)) for _ in range(4)
        )


def test_a_mixture_of_experts_block_is_its_layer_not_its_experts() -> None:
    model = nn.Sequential(_MixtureLayer(), _MixtureLayer())
    assert find_repeated_blocks(model) == list(model)


def test_a_hugging_face_model_names_its_blocks() -> None:
    """T5's encoder and decoder are one class, each a stack of layers: the model's own
    ``_no_split_modules`` names the layers, and without it the stacks' layers are found too
    (not the two stacks, whose every layer lies inside one)."""

    class Layer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.feed_forward = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 4))

    class Stack(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleList(Layer() for _ in range(3))

    class Pretrained(nn.Module):
        _no_split_modules: ClassVar[list[str]] = ["Layer", "Embedding"]  # one embedding: no block

        def __init__(self) -> None:
            super().__init__()
            self.embedding = nn.Embedding(8, 4)
            self.encoder, self.decoder = Stack(), Stack()

    model = Pretrained()
    layers = [*model.encoder.layers, *model.decoder.layers]
    assert find_repeated_blocks(model) == layers
    Pretrained._no_split_modules = []
    assert find_repeated_blocks(model) == layers


def test_an_encoder_decoder_checkpoints_and_names_both_stacks() -> None:
    """torch's own ``nn.Transformer``: three encoder and three decoder layers, two classes. The
    rule once took the larger class alone, so no encoder layer was ever checkpointed or
    sharded as a unit."""
    model = nn.Transformer(16, 2, 3, 3, dim_feedforward=32, batch_first=True)
    blocks = find_repeated_blocks(model)
    assert blocks == [*model.encoder.layers, *model.decoder.layers]
    assert block_classes(blocks) == "TransformerEncoderLayer,TransformerDecoderLayer"
    with pytest.raises(ConfigError, match="6 repeated TransformerEncoderLayer, Transformer"):
        apply_checkpointing(model, 7)


def test_a_stage_of_blocks_is_not_a_block_nor_a_module_inside_one() -> None:
    stage = lambda: nn.Sequential(BasicBlock(8, 8, 1), BasicBlock(8, 8, 1))  # noqa: E731
    model = nn.Sequential(nn.Conv2d(3, 8, 3), stage(), stage(), stage())
    blocks = find_repeated_blocks(model)
    assert len(blocks) == 6 and all(isinstance(b, BasicBlock) for b in blocks)


def test_a_layer_built_of_units_is_the_block_not_its_units() -> None:
    """MobileNet's inverted residuals hold convolution-norm-activation units stacked in a
    Sequential: the units were taken for the blocks and the layers for stages holding them
    (torchvision's MobileNets, EfficientNets, Faster R-CNN's backbone). One layer's two units
    are a Sequential of the same classes as SSD's extra layers: no stage either."""
    model = MobileNet()
    blocks = find_repeated_blocks(model)
    assert blocks == [*model.features[1:5], *model.extras]


def test_a_stage_classs_blocks_are_the_blocks() -> None:
    """timm's stage classes hold their blocks in a Sequential: the blocks, every one inside a
    stage, were taken for a stage's parts (as a mixture's experts are), and the four stages of
    a ConvNeXt for its blocks."""
    model = ConvNeXt()
    blocks = find_repeated_blocks(model)
    assert blocks == [*model.stages[0].blocks, *model.stages[1].blocks]
    assert block_classes(blocks) == "Block"


def test_units_stacked_only_inside_repeated_modules_leave_those_modules_the_blocks() -> None:
    model = GoogLeNet()  # the units side by side are an inception branch's
    blocks = find_repeated_blocks(model)
    assert blocks == [model.inception3a, model.inception3b, model.inception4a]
    checkpointed = GoogLeNet()
    checkpointed.load_state_dict(model.state_dict())
    apply_checkpointing(checkpointed, 3)
    x = torch.randn(2, 3, 8, 8)
    model(x).sum().backward()
    checkpointed(x).sum().backward()
    for a, b in zip(model.parameters(), checkpointed.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad)


class _Counting(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.calls = 0

    def forward(self, x: torch.Tensor, *, scale: float = 1.0) -> torch.Tensor:
        self.calls += 1
        return torch.tanh(self.linear(x)) * scale


class _Stack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(_Counting() for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x, scale=0.5)
        return x.sum()


def test_first_k_blocks_are_recomputed_in_backward_with_kwargs() -> None:
    model = _Stack()
    reference = _Stack()
    reference.load_state_dict(model.state_dict())
    assert len(apply_checkpointing(model, 2)) == 2
    x = torch.randn(2, 4)
    model(x).backward()
    reference(x).backward()
    assert [layer.calls for layer in model.layers] == [2, 2, 1]  # forward + recompute
    for a, b in zip(model.parameters(), reference.parameters(), strict=True):
        assert torch.allclose(a.grad, b.grad)  # same gradients as without checkpointing


def test_blocks_that_train_are_checkpointed_before_frozen_ones() -> None:
    # a frozen lower block keeps nothing for backward: checkpointed first, k=1 did nothing
    model = _Stack()
    model.layers[0].requires_grad_(False)
    assert apply_checkpointing(model, 2) == [model.layers[1], model.layers[2]]
    model(torch.randn(2, 4)).backward()
    assert [layer.calls for layer in model.layers] == [1, 2, 2]
    everything = _Stack()  # nothing frozen: forward order
    assert apply_checkpointing(everything, 2) == list(everything.layers[:2])
    # frozen ones from the last back: one above a trainable block passes gradients back
    mixed = _Stack()
    mixed.layers[0].requires_grad_(False)
    mixed.layers[2].requires_grad_(False)
    assert checkpoint_order(list(mixed.layers)) == [
        mixed.layers[1],
        mixed.layers[2],
        mixed.layers[0],
    ]


def test_checkpointing_one_block_of_a_model_with_frozen_lower_blocks_lowers_its_peak() -> None:
    from autotune.runner.fake_memory import trace_step
    from autotune.runner.workload import WorkloadSpec

    spec = WorkloadSpec(model="tests.fixtures.models:FrozenBottom")
    peaks = [trace_step(spec, 64, checkpoint_segments=k).total_bytes for k in (0, 1)]
    assert peaks[1] < peaks[0]


def test_a_model_that_checkpoints_itself_is_turned_off_so_that_zero_is_off() -> None:
    from autotune.runner.fake_memory import trace_step
    from autotune.runner.workload import WorkloadSpec
    from autotune.search.model_facts import own_checkpointing
    from tests.fixtures import self_checkpointed

    model = self_checkpointed.make()
    assert checkpoints_itself(model)
    assert apply_checkpointing(model, 0) == [] and not checkpoints_itself(model)
    # traced at k=0 as the same model never checkpointed: nothing recomputed, nothing freed
    own = WorkloadSpec(model="tests.fixtures.self_checkpointed:make")
    plain = WorkloadSpec(model="tests.fixtures.hf_zoo:gpt2", data="tests.fixtures.hf_zoo:data_gpt2")
    assert trace_step(own, 8).total_bytes == trace_step(plain, 8).total_bytes
    assert trace_step(own, 8, checkpoint_segments=2).total_bytes < trace_step(own, 8).total_bytes
    assert "turns on its own (gradient_checkpointing)" in str(own_checkpointing(own.model))
    assert own_checkpointing(plain.model) is None


def test_too_many_segments_or_no_blocks_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="exceeds the 3 repeated _Counting blocks"):
        apply_checkpointing(_Stack(), 4)
    with pytest.raises(ConfigError, match="has no repeated blocks"):
        apply_checkpointing(nn.Linear(2, 2), 1)
    assert apply_checkpointing(_Stack(), 0) == []


def test_torchscript_modules_are_no_blocks() -> None:
    # Scripted blocks were found as blocks, and a checkpointed one failed in TorchScript's
    # interpreter; a model scripted whole had "3 repeated RecursiveScriptModule blocks".
    from tests.fixtures.scripted import ScriptedBlocks, Stack, scripted_stack

    assert len(find_repeated_blocks(Stack())) == 3
    assert find_repeated_blocks(ScriptedBlocks()) == []
    assert find_repeated_blocks(scripted_stack()) == []
    with pytest.raises(ConfigError, match=r"checkpoint \(TorchScript modules are not checkpoin"):
        apply_checkpointing(ScriptedBlocks(), 1)


def test_layers_held_as_lists_of_their_parts_are_found_by_their_parts() -> None:
    # x-transformers' layers are ModuleLists of [norm, block, residual]: the lists were taken
    # for the blocks, and a ModuleList has no forward, so checkpointing patched a forward
    # nobody called (accepted and ignored) and FSDP refused them ("fully_shard does not support
    # containers that do not implement forward").
    from autotune.runner.fake_memory import trace_step
    from autotune.runner.workload import WorkloadSpec
    from tests.fixtures.part_lists import Attention, Decoder, FeedForward

    blocks = find_repeated_blocks(Decoder())
    assert [type(b) for b in blocks] == [Attention, FeedForward] * 3  # not the norms: parts
    spec = WorkloadSpec(model="tests.fixtures.part_lists:Decoder")
    plain, checkpointed = trace_step(spec, 8), trace_step(spec, 8, checkpoint_segments=6)
    assert checkpointed.total_bytes < plain.total_bytes


def test_a_small_stack_of_its_own_stays_a_stack_beside_a_heavy_one() -> None:
    # Only a layer's parts (held in a list with the layer) are weighed against the heaviest
    # stack: a small vision tower's layers beside a language model's stay blocks.
    class Layer(nn.Module):
        def __init__(self, width: int) -> None:
            super().__init__()
            self.linear = nn.Linear(width, width)

    class VisionLayer(Layer):
        pass

    class TwoTowers(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.vision = nn.ModuleList(VisionLayer(4) for _ in range(2))
            self.language = nn.ModuleList(Layer(256) for _ in range(4))

    blocks = find_repeated_blocks(TwoTowers())
    assert [type(b) for b in blocks] == [VisionLayer] * 2 + [Layer] * 4


def test_a_hugging_face_decoder_with_its_cache_on_is_checkpointed_without_it() -> None:
    """T5's decoder fills its key/value cache in forward (``use_cache`` is on by default), and
    fills it again when a checkpointed block is recomputed: backward failed with "A different
    number of tensors was saved". Checkpointing turns the cache off, as Hugging Face's own
    gradient checkpointing does; training never reads it."""
    transformers = pytest.importorskip("transformers")
    config = transformers.T5Config(
        vocab_size=64, d_model=16, d_ff=32, num_layers=2, num_heads=2, d_kv=8,
        decoder_start_token_id=0, pad_token_id=0,
    )  # fmt: skip
    model = transformers.T5ForConditionalGeneration(config)
    assert len(apply_checkpointing(model, 4)) == 4  # both stacks' T5Blocks
    assert model.config.use_cache is False
    ids = torch.randint(0, 64, (2, 8))
    model(input_ids=ids, labels=ids[:, :4].contiguous()).loss.backward()
    assert all(p.grad is not None for p in model.decoder.block.parameters())


class _Stateful(nn.Module):
    """A block whose forward updates its buffers: BatchNorm's running statistics and spectral
    normalisation's power iteration."""

    def __init__(self) -> None:
        super().__init__()
        conv = nn.Conv2d(4, 4, 3, padding=1)
        self.conv = torch.nn.utils.parametrizations.spectral_norm(conv)
        self.norm = nn.BatchNorm2d(4)
        self.register_buffer("mask", torch.ones(4, 1, 1), persistent=False)  # a constant

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.relu(self.norm(self.conv(x))) * self.mask


def _trained(checkpointed: int, steps: int = 2, policy: str = "full") -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(_Stateful(), _Stateful(), _Stateful())
    apply_checkpointing(model, checkpointed, policy=policy)
    for step in range(steps):
        model(
            torch.randn(2, 4, 6, 6, generator=torch.Generator().manual_seed(step))
        ).sum().backward()
    return model


@pytest.mark.parametrize("policy", ["full", "selective"])
def test_recomputing_a_block_changes_no_buffer_and_no_gradient(policy: str) -> None:
    # torch's checkpoint runs the block's forward again in backward: its running statistics
    # and power iteration would be updated twice a step, the second time from the updated state.
    # Selective: the buffers' copies made inside its recomputation failed it ("aten.clone.default
    # encountered during backward but not found in storage").
    plain, checkpointed = _trained(0), _trained(3, policy=policy)
    for (name, expected), (_, got) in zip(
        plain.named_buffers(), checkpointed.named_buffers(), strict=True
    ):
        assert torch.equal(expected, got), name
    for (name, expected), (_, got) in zip(
        plain.named_parameters(), checkpointed.named_parameters(), strict=True
    ):
        assert expected.grad is not None and got.grad is not None
        assert torch.equal(expected.grad, got.grad), name


def test_a_quantization_aware_model_trains_checkpointed_as_it_does_plainly() -> None:
    # The observers' per-channel statistics start empty and take their channels in the first
    # forward: putting the forward's starting buffers back failed ("The size of tensor a (32)
    # must match the size of tensor b (0)").
    from tests.fixtures.qat import FEATURES, prepared

    def trained(checkpointed: int) -> nn.Module:
        torch.manual_seed(0)
        model = prepared()
        apply_checkpointing(model, checkpointed)
        for step in range(2):
            x = torch.randn(4, FEATURES, generator=torch.Generator().manual_seed(step))
            model(x).sum().backward()
        return model

    plain, checkpointed = trained(0), trained(3)
    for (name, expected), (_, got) in zip(
        plain.state_dict().items(), checkpointed.state_dict().items(), strict=True
    ):
        assert torch.equal(expected, got), name
    for (name, expected), (_, got) in zip(
        plain.named_parameters(), checkpointed.named_parameters(), strict=True
    ):
        assert expected.grad is not None and got.grad is not None
        assert torch.equal(expected.grad, got.grad), name


def test_torchs_own_checkpoint_still_updates_a_blocks_buffers_twice() -> None:
    # Pins why the recomputation is guarded: when torch stops doing this (pytorch#96136), the
    # guard's copies can go.
    from torch.utils.checkpoint import checkpoint

    block = _Stateful()
    checkpoint(
        block, torch.randn(2, 4, 6, 6, requires_grad=True), use_reentrant=False
    ).sum().backward()
    assert int(block.norm.num_batches_tracked) == 2


def _looped(norm: bool = False) -> tuple[nn.Module, torch.Tensor, dict[int, int]]:
    """A ``Looped`` model, a batch, and its calls as a rank counts them (two samples)."""
    from tests.fixtures.looped import Looped, LoopedNorm

    torch.manual_seed(0)
    model = LoopedNorm() if norm else Looped()
    batch = torch.randn(6, 8)
    return model, batch, count_calls(model, lambda: model(batch[:2]))


def test_a_layer_the_forward_loops_over_is_checkpointed_call_by_call() -> None:
    """ALBERT's shared group, a Perceiver's tower: one module, no stack, called four times a
    forward. Before, no block was found (checkpointing refused); now each of the first k calls
    is a checkpoint segment, recomputed in backward, and the step trains as an unchecked one."""
    from tests.fixtures.looped import REPEATS

    model, batch, calls = _looped()
    assert model.training  # counted in eval mode, and given back as it was
    assert find_repeated_blocks(model) == [] and may_loop(model)
    units = checkpoint_units(model, calls)
    assert units.loops == ((model.tower, REPEATS),) and units.count == REPEATS
    assert units.names == "looped Tower"
    reference = copy.deepcopy(model)
    assert apply_checkpointing(model, 3, calls) == [model.tower] * 3
    ran = []
    model.tower.ff.register_forward_pre_hook(lambda *_: ran.append(1))
    for _ in range(2):  # each forward counts its calls again
        ran.clear()
        model(batch).square().mean().backward()
        assert len(ran) == REPEATS + 3  # the forward's calls, and 3 recomputed
    reference(batch).square().mean().backward()
    reference(batch).square().mean().backward()
    for ours, theirs in zip(model.parameters(), reference.parameters(), strict=True):
        assert ours.grad is not None and torch.equal(ours.grad, theirs.grad)


def test_a_looped_layers_batch_norm_moves_once_a_call() -> None:
    model, batch, calls = _looped(norm=True)
    reference = copy.deepcopy(model)
    apply_checkpointing(model, 4, calls)
    model(batch).sum().backward()
    reference(batch).sum().backward()
    assert torch.equal(model.tower.norm.running_mean, reference.tower.norm.running_mean)
    assert model.tower.norm.num_batches_tracked.item() == 4


def test_more_segments_than_a_looped_layers_calls_is_one_line() -> None:
    model, _, calls = _looped()
    with pytest.raises(ConfigError) as raised:
        apply_checkpointing(model, 5, calls)
    assert str(raised.value) == (
        "checkpoint_segments=5 exceeds the 4 calls of Looped's looped Tower in a forward; use 0..4"
    )
    # called as the exports' notes call it, without the calls: told how to give them
    with pytest.raises(ConfigError, match=r"loop_calls\(model, batch\)"):
        apply_checkpointing(model, 2)


def test_stacks_come_before_loops_and_small_or_failing_forwards_find_none() -> None:
    stacked = gpt_tiny()
    tokens = torch.randint(0, 64, (2, 8))
    assert not may_loop(stacked)
    calls = count_calls(stacked, lambda: stacked(tokens))
    assert checkpoint_units(stacked, calls).blocks == tuple(stacked.blocks)

    # a norm reused at every call holds too little to be a layer; a reused activation nothing
    class Pre(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm = nn.LayerNorm(4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.norm(x)

    class Reuses(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.pre = Pre()
            self.body = nn.Sequential(nn.Linear(4, 512), nn.Linear(512, 4))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.pre(self.body(self.pre(x)))

    reuses = Reuses()
    assert looped_modules(reuses, count_calls(reuses, lambda: reuses(torch.randn(2, 4)))) == []
    model, _, _ = _looped()
    assert count_calls(model, lambda: model(torch.randn(2, 3))) == {}  # wrong width: fails
    assert model.training and checkpoint_units(model, {}).count == 0


def test_a_backbone_shared_by_two_inputs_is_checkpointed_call_by_call() -> None:
    # DINO runs its backbone once for each crop size, a Siamese network once for each input:
    # a plain nn.Sequential, called twice, is the layer (before, "no repeated blocks")
    from tests.fixtures.looped import SharedBackbone

    model = SharedBackbone()
    calls = count_calls(model, lambda: model(torch.randn(2, 8)))
    assert checkpoint_units(model, calls).loops == ((model.backbone, 2),)
    assert apply_checkpointing(model, 1, calls) == [model.backbone]
    # scripted whole, it takes no hook: nothing counted, no loop (the count itself raised)
    scripted = torch.jit.script(SharedBackbone())
    assert count_calls(scripted, lambda: scripted(torch.randn(2, 8))) == {}


def _held(policy: str, segments: int) -> tuple[int, list[torch.Tensor]]:
    """The tensors' peak of a real second step of ``gpt_tiny`` with ``segments`` blocks
    checkpointed under ``policy``, and its first step's gradients."""
    from autotune.bench.traced_step import real_step_peak
    from workloads.gpt import autotune_dataset

    torch.manual_seed(0)
    model = gpt_tiny()
    batch = torch.utils.data.default_collate([autotune_dataset(model)[i] for i in range(8)])
    apply_checkpointing(model, segments, policy=policy)
    model(**batch).loss.backward()
    grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    model.zero_grad(set_to_none=True)
    return real_step_peak(model, **batch), grads


def test_selective_checkpointing_holds_between_none_and_full_and_trains_alike() -> None:
    """The outputs of its matrix multiplications kept, the rest recomputed: less than nothing
    checkpointed, more than every op recomputed, and the same gradients to the bit."""
    blocks = len(find_repeated_blocks(gpt_tiny()))
    off, full, selective = _held("full", 0), _held("full", blocks), _held("selective", blocks)
    assert full[0] < selective[0] < off[0]
    for ours, plain in zip(selective[1], off[1], strict=True):
        assert torch.equal(ours, plain)


def test_selective_keeps_the_costly_ops_and_recomputes_the_rest() -> None:
    from autotune.runner.selective_checkpoint import SAVED

    aten = torch.ops.aten
    assert {aten.mm.default, aten.addmm.default, aten.convolution.default} <= SAVED
    assert aten._scaled_dot_product_flash_attention_for_cpu.default in SAVED
    assert not {aten.bmm.default, aten.gelu.default, aten.native_layer_norm.default} & SAVED
    for segments in (0, 1):  # refused even where nothing is checkpointed
        with pytest.raises(ConfigError, match="checkpoint_policy='some' is not one of full, sel"):
            apply_checkpointing(_Stack(), segments, policy="some")


def test_a_selectively_checkpointed_step_is_traced_as_it_runs() -> None:
    from autotune.bench.traced_step import real_step_peak
    from autotune.runner.fake_memory import trace_step
    from autotune.runner.workload import WorkloadSpec
    from workloads.gpt import autotune_dataset

    spec = WorkloadSpec(model="workloads.gpt:gpt_tiny")
    blocks = len(find_repeated_blocks(gpt_tiny()))
    traced = {
        policy: trace_step(spec, 8, checkpoint_segments=blocks, checkpoint_policy=policy)
        for policy in ("full", "selective")
    }
    assert traced["full"].total_bytes < traced["selective"].total_bytes
    model = gpt_tiny()
    batch = torch.utils.data.default_collate([autotune_dataset(model)[i] for i in range(8)])
    apply_checkpointing(model, blocks, policy="selective")
    real = real_step_peak(model, **batch)
    assert traced["selective"].total_bytes == pytest.approx(real, rel=0.01)


def test_an_in_place_activation_after_a_kept_convolution_runs_out_of_place() -> None:
    # nn.ReLU(inplace=True) wrote into the convolution's kept output: "Tensor cached during
    # selective activation checkpoint has been mutated" in backward (VGG, AlexNet)
    from tests.fixtures.in_place import ConvReLU

    def trained(segments: int) -> nn.Module:
        torch.manual_seed(0)
        model = nn.Sequential(ConvReLU(), ConvReLU(), ConvReLU())
        apply_checkpointing(model, segments, policy="selective")
        model(torch.randn(2, 4, 6, 6, generator=torch.Generator().manual_seed(1))).sum().backward()
        return model

    plain, selective = trained(0), trained(3)
    assert plain[0].act.inplace and not selective[0].act.inplace
    for ours, theirs in zip(selective.parameters(), plain.parameters(), strict=True):
        assert ours.grad is not None and torch.equal(ours.grad, theirs.grad)


def test_a_write_into_a_kept_output_stops_the_step_naming_the_op() -> None:
    from autotune.errors import MutatedKeptOutput
    from tests.fixtures.in_place import ResidualNet

    model = ResidualNet()
    apply_checkpointing(model, 3, policy="selective")
    message = r"aten\.add_\.Tensor writes in place into the output of aten\.addmm\.default.*use "
    with pytest.raises(MutatedKeptOutput, match=message + "checkpoint_policy=full"):
        model(torch.randn(4, 8))

    class Last(nn.Module):  # the write is its block's last op: seen as the forward ends
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(x).mul_(2)

    last = nn.Sequential(Last(), Last())
    apply_checkpointing(last, 2, policy="selective")
    with pytest.raises(MutatedKeptOutput, match=r"aten\.mul_\.Tensor writes in place"):
        last(torch.randn(4, 8))
    apply_checkpointing(full := ResidualNet(), 3)  # full checkpointing keeps no such output
    full(torch.randn(4, 8)).sum().backward()


def test_a_compiled_selective_block_keeps_between_none_and_full_and_trains_alike() -> None:
    # torch.compile takes only torch's own two dispatch modes as a context_fn's pair: wrapped
    # in _Kept's watch, every compiled trial failed ("must generate a tuple of two
    # `TorchDispatchMode`s"). Its graph makes the write in place into a kept output functional.
    class Scaled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.up, self.down = nn.Linear(8, 32), nn.Linear(32, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.up(x)
            y.mul_(2)  # into the kept output: stops an eager step (MutatedKeptOutput)
            return x + self.down(nn.functional.gelu(y))

    def compiled(segments: int, policy: str) -> tuple[int, list[torch.Tensor]]:
        torch.manual_seed(0)
        model = nn.Sequential(Scaled(), Scaled(), Scaled(), nn.Linear(8, 3))
        apply_checkpointing(model, segments, policy=policy)
        held = [0]

        def pack(t: torch.Tensor) -> torch.Tensor:
            held[0] += t.numel() * t.element_size()
            return t

        x = torch.randn(64, 8, generator=torch.Generator().manual_seed(1))
        torch._dynamo.reset()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = torch.compile(model, backend="aot_eager")(x).square().sum()
        loss.backward()
        return held[0], [p.grad for p in model.parameters() if p.grad is not None]

    off, full, selective = compiled(0, "full"), compiled(3, "full"), compiled(3, "selective")
    assert full[0] < selective[0] < off[0]
    for ours, plain in zip(selective[1], off[1], strict=True):
        assert torch.allclose(ours, plain, rtol=1e-6, atol=1e-7)


def test_the_policy_is_told_each_ops_output() -> None:
    # what _Kept watches for writes in place; a torch without it leaves them to its own check
    from torch.utils.checkpoint import SelectiveCheckpointContext

    seen = torch.ones(1)
    assert SelectiveCheckpointContext(is_recompute=False, op_output=seen).op_output is seen
