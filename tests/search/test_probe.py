from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from autotune.api import run_trial
from autotune.config import TrainConfig
from autotune.errors import ConfigError
from autotune.records import Exclusion, exclusion_lines
from autotune.runner.platform import detect_platform
from autotune.runner.workload import WorkloadSpec
from autotune.search.model_facts import repeated_blocks
from autotune.search.probe import restrict_space
from autotune.search.refusals import fsdp_refusal, model_refusals
from autotune.search.space import load_space

SPECTRAL = "tests.fixtures.spectral:Spectral"
ONE_DDP_PAIR = {"global_batch_size": 4, "device": "cpu", "parallel": "ddp", "world_size": 2}


def test_cpu_platform_drops_what_cannot_work_and_says_why() -> None:
    platform = detect_platform("cpu")
    space, dropped = restrict_space(
        load_space("default"), platform, devices=2, repeated_blocks=4, run_checks=False
    )
    reasons = {(e.knob, e.value): e.reason for e in dropped}
    assert reasons[("parallel", "dp")] == "DataParallel needs CUDA GPUs"
    assert "needs CUDA and NCCL" in reasons[("comm_hook", "bf16")]
    assert reasons[("world_size", 4)] == "only 2 device(s) considered"
    assert reasons[("checkpoint_segments", 8)] == "the model has 4 repeated blocks"
    assert ("pin_memory", True) in reasons
    assert space.params["world_size"].choices == (2,)
    assert "dp" not in space.params["parallel"].choices
    assert max(space.params["checkpoint_segments"].choices) <= 4  # type: ignore[type-var]
    _, named = restrict_space(
        load_space("default"), platform, 2, 4, run_checks=False, block_class="Block"
    )
    reasons = {(e.knob, e.value): e.reason for e in named}  # as plan says it
    assert reasons[("checkpoint_segments", 8)] == "the model has 4 repeated Block blocks"


def test_one_device_leaves_only_single_device_training() -> None:
    space, dropped = restrict_space(
        load_space("quick"),
        detect_platform("cpu"),
        devices=1,
        repeated_blocks=None,
        run_checks=False,
    )
    assert space.params["parallel"].choices == ("single",)
    assert {e.value for e in dropped if e.knob == "parallel"} == {"ddp", "fsdp"}


def test_a_space_without_world_size_says_to_add_it_where_there_are_devices(
    tmp_path: Path,
) -> None:
    # `parallel: [ddp, fsdp]` alone left one device per trial: both were dropped as "needs
    # more than one device; 2 considered", which two devices contradicted.
    from autotune.search.space import load_space as load

    path = tmp_path / "space.yaml"
    path.write_text('parallel: [ddp, fsdp]\namp: ["off"]\n')
    _, dropped = restrict_space(load(str(path)), detect_platform("cpu"), 2, None, False)
    assert {(e.knob, e.value): e.reason for e in dropped}[("parallel", "ddp")] == (
        "the space has no world_size knob, so every trial runs on one device; add "
        "`world_size: [2]` to it"
    )


def test_fsdp_is_dropped_for_a_model_it_cannot_shard_with_why() -> None:
    # Trials of both failed in their first step: FSDP's reduce-scatter takes no sparse
    # gradient, and it flattens each unit's parameters into one tensor of one dtype.
    sparse = fsdp_refusal("tests.fixtures.sparse:Lookups")
    assert sparse == (
        "FSDP cannot shard sparse gradients (sparse=True in bag, table; DDP reduces them)"
    )
    mixed = fsdp_refusal("tests.fixtures.spectral:Spectral")
    assert mixed == (
        "FSDP shards a unit's parameters as one, of one dtype, and layers.0 holds complex64 "
        "and float32 ones"
    )
    assert fsdp_refusal("tests.fixtures.traced:Stack") is None
    refusals = model_refusals("tests.fixtures.sparse:Lookups")
    space, dropped = restrict_space(
        load_space("quick"), detect_platform("cpu"), 2, None, False, refusals=refusals
    )
    assert "fsdp" not in space.params["parallel"].choices
    assert {(e.knob, e.value): e.reason for e in dropped}[("parallel", "fsdp")] == sparse


def test_ddp_is_dropped_on_a_cpu_for_a_model_of_several_sparse_lookups() -> None:
    from autotune.search.refusals import GLOO_SPARSE

    refusals = model_refusals("tests.fixtures.sparse:Lookups")
    ddp = {(r.knob, r.value): r for r in refusals}[("parallel", "ddp")]
    assert ddp.reason == GLOO_SPARSE.format(lookups="bag, table")
    assert ddp.holds("cpu") and not ddp.holds("cuda")  # NCCL reduces them otherwise
    space, dropped = restrict_space(
        load_space("quick"), detect_platform("cpu"), 2, None, False, refusals=refusals
    )
    assert space.params["parallel"].choices == ("single",)
    assert {(e.knob, e.value): e.reason for e in dropped}[("parallel", "ddp")] == ddp.reason
    one = model_refusals("tests.fixtures.sparse:OneLookup")
    assert ("parallel", "ddp") not in {(r.knob, r.value) for r in one}


def test_powersgd_and_fused_optimizers_are_ruled_out_for_complex_parameters() -> None:
    # A Fourier neural operator (complex64 spectral weights): its DDP trial with PowerSGD hung
    # until the trial's timeout (300 s, both ranks waiting in the hook), and a fused AdamW
    # failed its first step; the search proposed both.
    refusals = model_refusals(SPECTRAL)
    assert [(r.knob, r.value) for r in refusals] == [
        ("parallel", "fsdp"),
        ("comm_hook", "powersgd"),
        ("optimizer_impl", "fused"),
    ]
    assert model_refusals("tests.fixtures.traced:Stack") == ()
    space, dropped = restrict_space(
        load_space("default"), detect_platform("cpu"), 2, 2, False, refusals=refusals
    )
    assert "powersgd" not in space.params["comm_hook"].choices
    assert space.params["optimizer_impl"].choices == ("default", "foreach")
    reasons = {(e.knob, e.value): e.reason for e in dropped}
    assert reasons[("optimizer_impl", "fused")] == (
        "a fused optimizer takes real floating-point parameters only, and the model trains "
        "complex64 ones"
    )
    with pytest.raises(ConfigError, match=r"^comm_hook=powersgd: PowerSGD's hook never returns"):
        run_trial(SPECTRAL, {**ONE_DDP_PAIR, "comm_hook": "powersgd"})
    with pytest.raises(ConfigError, match=r"complex64 ones; use foreach or default$"):
        run_trial(SPECTRAL, {**ONE_DDP_PAIR, "optimizer_impl": "fused"})


def test_torchscript_modules_rule_out_fsdp_and_a_scripted_model_compiling() -> None:
    # A model holding torch.jit.script-ed blocks failed every FSDP trial ("not supported on
    # ScriptModules"), and one scripted whole failed every compiled trial; both were proposed.
    blocks = model_refusals("tests.fixtures.scripted:ScriptedBlocks")
    assert [(r.knob, r.value) for r in blocks] == [("parallel", "fsdp")]
    assert "(blocks.0, blocks.1, blocks.2)" in blocks[0].reason
    whole = model_refusals("tests.fixtures.scripted:scripted_stack")
    assert [(r.knob, r.value) for r in whole] == [("parallel", "fsdp")] + [
        ("compile", mode)
        for mode in ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
    ]
    assert "TorchScript module (the model)" in whole[0].reason
    with pytest.raises(ConfigError, match=r"^compile=default: torch.compile does not compile"):
        run_trial("tests.fixtures.scripted:scripted_stack", {"global_batch_size": 8,
                  "device": "cpu", "compile": "default"})  # fmt: skip


def test_torch_compile_refuses_a_scripted_model_in_this_torch() -> None:
    # What ``model_refusals`` foresees, pinned: should torch.compile compile a TorchScript
    # model, this fails and the refusal can go. torch 2.13 raises; 2.11 takes it and compiles
    # nothing (no frame reaches dynamo): a compiled configuration would train eagerly there.
    from torch._dynamo.utils import counters

    from tests.fixtures.scripted import Samples, scripted_stack

    batch = torch.stack([Samples()[i][0] for i in range(4)])
    counters.clear()
    try:
        torch.compile(scripted_stack())(batch)
    except RuntimeError as error:
        assert "does not support compiling torch.jit.script" in str(error)
    else:
        assert not counters["stats"].get("unique_graphs"), "a TorchScript model was compiled"


def test_quantization_aware_training_rules_out_16_bit_arithmetic_on_a_cpu() -> None:
    # torch's eager QAT recipe failed every autocast and every FSDP-bf16 trial on a CPU
    # ("expected scalar type Float but found BFloat16"), each proposed by the search. On CUDA
    # the fused op was given bf16 (pytorch/pytorch#162620): not refused there, where only
    # trials can tell.
    model = "tests.fixtures.qat:prepared"
    refusals = model_refusals(model)
    assert [(r.knob, r.value, r.device) for r in refusals] == [
        ("amp", "fp16", "cpu"),
        ("amp", "bf16", "cpu"),
        ("fsdp_mixed_precision", "bf16", "cpu"),
        ("fsdp_mixed_precision", "bf16-reduce-fp32", "cpu"),
    ]
    assert "(FusedMovingAvgObsFakeQuantize) takes float32 only on a CPU" in refusals[0].reason
    cpu = detect_platform("cpu")
    space, _ = restrict_space(load_space("default"), cpu, 2, 4, False, refusals=refusals)
    assert space.params["amp"].choices == ("off",)
    cuda = cpu.model_copy(update={"device_type": "cuda"})
    kept, _ = restrict_space(load_space("default"), cuda, 2, 4, False, refusals=refusals)
    assert "fp16" in kept.params["amp"].choices
    with pytest.raises(ConfigError, match=r"^amp=bf16: quantization-aware training's"):
        run_trial(model, {"global_batch_size": 8, "device": "cpu", "amp": "bf16"})


def test_fake_quantization_fails_under_cpu_autocast_in_this_torch() -> None:
    # What ``model_refusals`` foresees, pinned: should the fused fake quantization take 16-bit
    # activations on a CPU, this fails and the refusal can go.
    from tests.fixtures.qat import FEATURES, prepared

    model = prepared()
    failing = pytest.raises(RuntimeError, match="expected scalar type Float but found BFloat16")
    with torch.autocast("cpu", dtype=torch.bfloat16), failing:
        model(torch.randn(4, FEATURES))


def test_a_fused_optimizer_refuses_complex_parameters_in_this_torch() -> None:
    # What ``model_refusals`` foresees, pinned: should a fused AdamW learn complex parameters,
    # this fails and the refusal can go.
    weight = torch.nn.Parameter(torch.ones(2, dtype=torch.cfloat))
    optimizer = torch.optim.AdamW([weight], fused=True)
    weight.grad = torch.ones_like(weight)
    with pytest.raises(RuntimeError, match="requires all the params to be floating point"):
        optimizer.step()


def test_sparse_gradients_rule_out_fused_optimizers_powersgd_and_the_fp16_hook_on_a_cpu() -> None:
    # A recommender's lookup with sparse=True, DDP x2 on this CPU: a fused SGD failed its first
    # step ("`_fused_sgd` does not support sparse gradients"), PowerSGD hung until the
    # trial's timeout, and the fp16 hook failed ("cadd_sparse" not implemented for 'Half');
    # the search proposed all three.
    model = "tests.fixtures.sparse:OneLookup"
    refusals = model_refusals(model)
    assert [(r.knob, r.value, r.device) for r in refusals] == [
        ("parallel", "fsdp", None),
        ("optimizer_impl", "fused", None),
        ("comm_hook", "powersgd", None),
        ("comm_hook", "fp16", "cpu"),
    ]
    assert "the lookups bag give sparse gradients (sparse=True)" in refusals[1].reason
    cpu = detect_platform("cpu")
    space, dropped = restrict_space(load_space("default"), cpu, 2, None, False, refusals=refusals)
    assert space.params["comm_hook"].choices == ("none",)  # bf16 needs NCCL
    assert space.params["optimizer_impl"].choices == ("default", "foreach")
    reasons = {(e.knob, e.value): e.reason for e in dropped}
    assert reasons[("comm_hook", "powersgd")] == refusals[2].reason
    cuda = cpu.model_copy(update={"device_type": "cuda"})
    kept, _ = restrict_space(load_space("default"), cuda, 2, None, False, refusals=refusals)
    assert kept.params["comm_hook"].choices == ("none", "fp16", "bf16")  # NCCL: trials tell
    several = model_refusals("tests.fixtures.sparse:Lookups")
    assert ("comm_hook", "powersgd") in {(r.knob, r.value) for r in several}
    assert "the lookups bag, table give" in several[-1].reason
    for asked, said in [
        ({"comm_hook": "fp16"}, r"^comm_hook=fp16: gloo sums sparse gradients without"),
        ({"comm_hook": "powersgd"}, r"^comm_hook=powersgd: PowerSGD's hook compresses dense"),
        ({"optimizer_impl": "fused"}, r"^optimizer_impl=fused: a fused optimizer takes no"),
    ]:
        with pytest.raises(ConfigError, match=said):
            run_trial(model, {**ONE_DDP_PAIR, **asked})


def test_clipping_sparse_gradients_is_refused_before_any_trial() -> None:
    # --max-grad-norm 1 on the same model: every trial failed its first step in
    # clip_grad_norm_ ("Could not run 'aten::linalg_vector_norm' with arguments from the
    # 'SparseCPU' backend"), said as if the optimizer's step had.
    from autotune.search.refusals import check_clipping

    config = {"global_batch_size": 8, "device": "cpu", "max_grad_norm": 1.0}
    with pytest.raises(ConfigError) as refused:
        run_trial("tests.fixtures.sparse:OneLookup", config)
    assert str(refused.value) == (
        "max_grad_norm=1: torch's clip_grad_norm_ takes no sparse gradients (no norm kernel "
        "for them), and the lookups bag give sparse gradients (sparse=True); leave "
        "--max-grad-norm (max_grad_norm) unset"
    )
    check_clipping(None, "tests.fixtures.sparse:OneLookup")
    check_clipping(1.0, "tests.fixtures.traced:Stack")


def test_sparse_gradients_fail_fused_steps_clipping_and_half_sums_in_this_torch() -> None:
    # What ``sparse_refusals`` and ``check_clipping`` foresee, pinned: should torch lift any,
    # its part fails here and the refusal can go.
    bag = torch.nn.EmbeddingBag(10, 4, sparse=True)
    bag(torch.tensor([[1, 2]])).sum().backward()
    with pytest.raises(RuntimeError, match="does not support sparse gradients"):
        torch.optim.SGD(bag.parameters(), lr=0.1, fused=True).step()
    with pytest.raises(NotImplementedError, match="linalg_vector_norm"):
        torch.nn.utils.clip_grad_norm_(bag.parameters(), 1.0)
    half = bag.weight.grad.half()  # what the fp16 hook gives gloo's sparse sum on a CPU
    with pytest.raises(NotImplementedError, match="\"cadd_sparse\" not implemented for 'Half'"):
        half + half


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_powersgd_fails_two_gloo_ranks_of_a_sparse_lookup_in_this_torch() -> None:
    # The PowerSGD refusal pinned in plain PyTorch (a trial of it hung until its timeout): once
    # the hook compresses, the ranks of a lookup and a dense head mostly do not get through
    # their step: a gloo timeout, or waiting on each other for good (a run of the pin left its
    # ranks so, and the pytest that spawned them never exited); now and then both train
    # (scripts/bench_gloo_sparse.py --variants head+powersgd). Failing in one of three runs
    # pins it; should three train, this fails and the refusal can go.
    from autotune.bench.gloo_sparse import run

    outcomes: list[str] = []
    while len(outcomes) < 3 and set(outcomes) <= {"ok"}:
        outcomes.append(run(1, 8, timeout_s=60, variant="head+powersgd"))
    assert set(outcomes) != {"ok"}, outcomes


def test_repeated_blocks_are_counted_without_building_real_weights() -> None:
    assert repeated_blocks(WorkloadSpec(model="workloads.gpt:gpt2_124m")) == (12, "Block")
    assert repeated_blocks(WorkloadSpec(model="tests.fixtures.models:NeedsArguments")) is None


def test_a_hook_check_runs_a_few_steps_not_the_adaptive_window(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # With the adaptive window a check ran for seconds (hundreds of steps) and one transient
    # gloo error then excluded the hook for good on that machine.
    from autotune.result import TrialResult
    from autotune.search import probe

    seen = []

    def fake_run_trial(config: Any, workload: Any, options: Any) -> TrialResult:
        seen.append(options)
        return TrialResult(config=config, status="ok")

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(probe, "run_trial", fake_run_trial)
    assert probe._runtime_checks(detect_platform("cpu"), ["fp16"]) == {}
    (options,) = seen
    assert options.target_interval == 0 and options.measured_steps == 3


def test_compile_modes_that_cannot_work_here_are_dropped_with_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from autotune.result import TrialResult
    from autotune.search import probe

    platform = detect_platform("cpu")
    space = load_space("default")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    checked = []

    def failing_compile(config: Any, workload: Any, options: Any) -> TrialResult:
        checked.append(config)
        return TrialResult(config=config, status="error", message="rank 0: InductorError: boom")

    monkeypatch.setattr(probe, "run_trial", failing_compile)
    restricted, dropped = restrict_space(space, platform, 2, 4, run_checks=True)
    reasons = {e.value: e.reason for e in dropped if e.knob == "compile"}
    assert "CUDA graphs need CUDA" in reasons["reduce-overhead"]
    assert "failed a probe trial: error: rank 0: InductorError: boom" in reasons["default"]
    assert restricted.params["compile"].choices == ("off",)
    tried = [c for c in checked if c.compile != "off"]  # an error is tried twice
    assert len(tried) == 2
    assert all(c.compile == "default" and c.world_size == 1 for c in tried)
    # no C++ compiler: dropped without a trial
    monkeypatch.setattr(probe, "_cxx_compiler", lambda: None)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "fresh"))
    checked.clear()
    _, dropped = restrict_space(space, platform, 2, 4, run_checks=True)
    reasons = {e.value: e.reason for e in dropped if e.knob == "compile"}
    assert "needs a C++ compiler" in reasons["default"]
    assert all(c.compile == "off" for c in checked)


def test_a_check_that_fails_once_is_tried_again_before_it_is_cached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from autotune.result import TrialResult
    from autotune.search import probe

    outcomes = ["crashed", "ok", "timed_out"]

    def flaky(config: Any, workload: Any, options: Any) -> TrialResult:
        return TrialResult(config=config, status=outcomes.pop(0), message="rank 1: reset")

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(probe, "run_trial", flaky)
    platform = detect_platform("cpu")
    assert probe._runtime_checks(platform, ["fp16"]) == {}  # crashed, then ok: it works
    failures = probe._runtime_checks(platform, ["powersgd"])  # a hang is not run twice
    assert failures == {"powersgd": "timed_out: rank 1: reset"} and outcomes == []


def test_exclusions_for_one_reason_are_said_in_one_line() -> None:
    blocks = "the model has no repeated blocks"
    exclusions = [Exclusion(knob="checkpoint_segments", value=v, reason=blocks) for v in (1, 2, 4)]
    exclusions.insert(
        1, Exclusion(knob="world_size", value=4, reason="only 2 device(s) considered")
    )
    assert exclusion_lines(exclusions) == [
        "checkpoint_segments=1, 2, 4: the model has no repeated blocks",
        "world_size=4: only 2 device(s) considered",
    ]


@pytest.mark.parametrize(
    ("choices", "blocks", "kept", "added"),
    [
        ([0, 1, 4, "all"], 8, (0, 1, 4, 8), True),  # 'all' is the model's 8 blocks: added
        ([0, 8, "all"], 8, (0, 8), False),  # listed already: 'all' adds nothing
        (["all"], 8, (8,), True),
        ([0, 4], 8, (0, 4), False),  # no 'all': the space as written
        ([0, 4, "all"], None, (0, 4), False),  # no repeated blocks found: nothing to count
    ],
)
def test_the_all_choice_of_checkpointing_is_every_block_of_the_model(
    choices: list[object], blocks: int | None, kept: tuple[int, ...], added: bool
) -> None:
    from autotune.search.probe import every_block
    from autotune.search.space import parse_space

    space = parse_space({"checkpoint_segments": choices}, "'test'")
    widened, line = every_block(space, blocks, "Layer")
    assert widened.params["checkpoint_segments"].choices == kept
    if added:
        assert line == (
            "checkpoint_segments=8: every one of the model's 8 repeated Layer blocks "
            "(the space's 'all')"
        )
    else:
        assert line is None


def test_the_default_space_checkpoints_every_block_of_a_deep_model() -> None:
    from autotune.search.probe import every_block

    widened, line = every_block(load_space("default"), 32, "LlamaDecoderLayer")
    assert widened.params["checkpoint_segments"].choices == (0, 1, 2, 4, 8, 12, 32)
    assert line is not None and "32 repeated LlamaDecoderLayer blocks" in line
    shallow, line = every_block(load_space("default"), 4)
    assert shallow.params["checkpoint_segments"].choices == (0, 1, 2, 4, 8, 12) and line is None


def test_checkpointing_that_would_reach_blocks_keeping_nothing_for_backward_is_left_out() -> None:
    from autotune.runner.workload import WorkloadSpec
    from autotune.search.model_facts import idle_blocks
    from autotune.search.space import parse_space

    # the lower two of four blocks are frozen, with nothing trainable below them
    assert idle_blocks(WorkloadSpec(model="tests.fixtures.models:FrozenBottom")) == 2
    assert idle_blocks(WorkloadSpec(model="tests.fixtures.models:Small")) == 0
    space = parse_space({"checkpoint_segments": [0, 1, 2, 4, 8]}, "'test'")
    kept, dropped = restrict_space(space, detect_platform("cpu"), 1, 4, idle_blocks=2)
    assert kept.params["checkpoint_segments"].choices == (0, 1, 2)
    assert [(e.value, e.reason) for e in dropped] == [
        (4, "2 of the model's 4 repeated blocks keep nothing for backward (frozen, with no "
            "gradient flowing through them): checkpointing them saves nothing"),
        (8, "the model has 4 repeated blocks"),
    ]  # fmt: skip


def test_the_bf16_forward_is_tried_only_where_the_space_offers_fsdps_bf16_parameters() -> None:
    # it builds the model for real and runs a forward: not for a space that cannot use it
    from autotune.search.driver import _asks_fsdp_bf16

    default = load_space("default")
    assert _asks_fsdp_bf16(default, 2)
    assert not _asks_fsdp_bf16(default, 1)
    assert not _asks_fsdp_bf16(default.without("parallel", "fsdp"), 2)
    for value in ("bf16", "bf16-reduce-fp32"):
        default = default.without("fsdp_mixed_precision", value)
    assert not _asks_fsdp_bf16(default, 2)


def test_a_looped_layers_calls_are_counted_before_any_trial() -> None:
    # ALBERT's shared group, a Perceiver's tower: the meta device's forward counts the calls a
    # rank checkpoints, so the space's 'all' and its limit are the calls, and a trial asking for
    # more is one line before any rank is launched.
    from autotune.search.model_facts import fsdp_block_classes
    from autotune.search.probe import blocks_phrase

    spec = WorkloadSpec(model="tests.fixtures.looped:Looped")
    assert repeated_blocks(spec) == (4, "looped Tower")
    assert blocks_phrase(4, "looped Tower") == "4 calls of its looped Tower"
    # what the recommendation names for Accelerate's FSDP wrap is a class, never a loop's calls
    assert fsdp_block_classes("tests.fixtures.looped:Looped") is None
    assert fsdp_block_classes("tests.fixtures.looped:LatentTower") == "MultiheadAttention"
    assert fsdp_block_classes("workloads.gpt:gpt2_124m") == "Block"
    config = TrainConfig(global_batch_size=8, device="cpu", checkpoint_segments=5)
    with pytest.raises(ConfigError, match=r"^checkpoint_segments=5 exceeds the 4 calls of"):
        run_trial("tests.fixtures.looped:Looped", config)


def test_clipping_rules_out_the_optimizer_stepped_in_backward_before_any_trial() -> None:
    from autotune.search.refusals import clipping_refusals

    assert clipping_refusals(None) == ()
    space, dropped = restrict_space(
        load_space("default"),
        detect_platform("cpu"),
        2,
        2,
        False,
        refusals=clipping_refusals(1.0),
    )
    assert space.params["optimizer_in_backward"].choices == (False,)
    (reason,) = [e.reason for e in dropped if e.knob == "optimizer_in_backward"]
    assert reason.startswith("max_grad_norm=1 clips by the norm of every gradient together")
