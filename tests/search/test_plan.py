"""``autotune plan``: predicted memory for devices this machine does not have."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from autotune.cli import main
from autotune.config import TrainConfig, save_config
from autotune.search.calibration import CUDA_RESERVE_SHARE

MODEL = "tests.fixtures.traced:Stack"


def _space(tmp_path: Path) -> str:
    path = tmp_path / "space.yaml"
    path.write_text(
        "parallel: [single, ddp, fsdp]\n"
        "world_size: {choices: [2, 8], when_not: {parallel: [single]}}\n"
        "amp: ['off', bf16]\n"
        "checkpoint_segments: [0, 4]\n"
        "grad_accum_steps: [1, 2]\n"
        "num_workers: [0, 2]\n"  # not a memory knob on CUDA: not enumerated
    )
    return str(path)


def test_a_plan_for_64_devices_lists_them_predicts_and_says_what_fits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["plan", "--model", MODEL, "--devices", "64", "--device-memory", "300MiB"]
    argv += ["--space", _space(tmp_path), "--global-batch-size", "8192", "--json"]
    assert main(argv) == 0
    shown = capsys.readouterr()
    plan = json.loads(shown.out)
    assert plan["predicted"] is True and plan["devices"] == 64
    # progress on stderr: 14 s of silence before gpt2_124m's table at 64 devices
    said = shown.err.splitlines()
    assert said[0].endswith(f"] reading {MODEL} and its data: imports, a build on the meta device")
    assert re.fullmatch(
        rf"\[ +\d+s\] predicting {len(plan['configurations'])} configuration\(s\): .+", said[1]
    )
    assert all("tracing a step under fake tensors: micro-batch" in line for line in said[2:])
    assert main([*argv, "--quiet"]) == 0 and capsys.readouterr().err == ""
    rows = {row["summary"]: row for row in plan["configurations"]}
    sizes = {row["config"]["world_size"] for row in plan["configurations"]}
    assert sizes == {1, 2, 8, 64}  # the space's sizes up to 64, and 64 itself
    assert all(row["config"]["num_workers"] == 0 for row in plan["configurations"])
    fsdp = [r for r in plan["configurations"] if r["config"]["parallel"] == "fsdp"]
    by_size = {r["config"]["world_size"]: r["predicted_peak_bytes"] for r in fsdp
               if r["config"]["amp"] == "off" and r["config"]["checkpoint_segments"] == 0
               and r["config"]["grad_accum_steps"] == 1}  # fmt: skip
    assert by_size[64] < by_size[8] < by_size[2]  # more shards, smaller micro-batch
    single = rows["singlex1 amp=off accum=1 mbs=8192 workers=0"]
    assert single["fits"] is False and single["predicted_peak_bytes"] > 300 * 2**20 * 0.9
    assert plan["largest_micro_batch"]  # something fits
    assert "fsdpx64 amp=bf16" in plan["largest_micro_batch"]


def test_one_config_as_json_carries_the_predicted_peak_and_its_parts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = TrainConfig(global_batch_size=4096, parallel="ddp", world_size=16, device="cuda")
    save_config(config, tmp_path / "c.yaml")
    argv = ["plan", "--model", MODEL, "--devices", "16", "--device-memory", "80GiB"]
    assert main([*argv, "--config", str(tmp_path / "c.yaml"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    parts = out["predicted_parts_bytes"]
    assert out["predicted_peak_bytes"] == sum(parts.values())
    assert out["predicted_peak_covers"] == out["predicted_parts_cover"] == "one device"
    assert parts["ddp buckets"] == 4 * (256 * 1024 + 1024 + 1024 * 256 + 256) * 4
    assert out["fits"] is True and out["source"].startswith("fake-tensor trace")
    assert out["calibration"].startswith("the tensors x1.10 for the caching allocator's reserve")


def test_one_config_is_planned_on_its_own_device_and_a_conflicting_flag_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A user planned a config file saying device: cpu; the plan predicted it as CUDA (the
    # flag's default) and said the caching allocator's reserve.
    config = TrainConfig(global_batch_size=64, parallel="ddp", world_size=2, device="cpu")
    save_config(config, tmp_path / "c.yaml")
    argv = [
        "plan",
        "--model",
        MODEL,
        "--device-memory",
        "8GiB",
        "--config",
        str(tmp_path / "c.yaml"),
    ]
    assert main([*argv, "--devices", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (
        "caching allocator" not in out["calibration"] and "process" in out["predicted_parts_bytes"]
    )
    # on CPU the peak is both ranks' (as a CPU budget is), the parts one rank's: the JSON said
    # neither, and its parts summed to half its peak
    assert out["predicted_peak_covers"] == "all 2 rank(s) of the host together"
    assert out["predicted_parts_cover"] == "one rank"
    assert out["predicted_peak_bytes"] == pytest.approx(
        2 * sum(out["predicted_parts_bytes"].values()), rel=0.01
    )
    assert main([*argv, "--devices", "2", "--device", "cuda"]) == 2
    err = capsys.readouterr().err
    assert "--device cuda: the configuration's device is cpu; drop --device" in err
    assert main([*argv, "--devices", "1"]) == 2
    assert "--devices 1: the configuration uses world_size=2" in capsys.readouterr().err


@pytest.mark.slow  # a plan's assumption: the default run checks LayerDrop's, and routing in process
def test_a_mixture_of_experts_plan_says_it_took_routing_as_uniform(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["plan", "--model", "tests.fixtures.traced:Routed", "--devices", "8"]
    argv += ["--device-memory", "80GiB", "--global-batch-size", "64"]
    assert main([*argv, "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert "routing traced as uniform" in plan["assumption"]
    assert all("routing taken as uniform" in r["source"] for r in plan["configurations"])
    assert main(argv) == 0
    assert "assumed: a mixture of experts' routing" in capsys.readouterr().out
    dense = ["plan", "--model", MODEL, "--devices", "8", "--device-memory", "80GiB", "--json"]
    assert main(dense) == 0
    assert json.loads(capsys.readouterr().out)["assumption"] is None


def test_a_plan_that_took_a_random_draws_branch_says_so_and_not_routing(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["plan", "--model", "tests.fixtures.traced:Dropped", "--devices", "2"]
    assert main([*argv, "--device-memory", "80GiB", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert "LayerDrop" in plan["assumption"] and "routing" not in plan["assumption"]
    assert not any("routing" in r["source"] for r in plan["configurations"])
    assert plan["needs_find_unused_parameters"]  # a dropped layer's parameters get no gradient
    assert main([*argv, "--device-memory", "80GiB"]) == 0
    assert "DDP needs find_unused_parameters=True" in capsys.readouterr().out
    dense = ["plan", "--model", MODEL, "--devices", "2", "--device-memory", "80GiB", "--json"]
    assert main(dense) == 0
    assert json.loads(capsys.readouterr().out)["needs_find_unused_parameters"] is False


def test_nothing_fitting_says_what_needs_least(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["plan", "--model", MODEL, "--devices", "2", "--device-memory", "1MiB"]
    assert main([*argv, "--space", _space(tmp_path), "--global-batch-size", "8192"]) == 0
    out = capsys.readouterr().out
    assert "every number below is a prediction" in out
    assert "nothing fits: the least memory is fsdpx2 amp=bf16 ckpt=4 accum=2" in out


def _offload_plan(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], memory: str, global_batch: int
) -> dict[str, Any]:
    """``plan --json`` of FSDP over 2 devices with and without CPU offload."""
    space = tmp_path / "space.yaml"
    space.write_text(
        "parallel: [fsdp]\nworld_size: [2]\n"
        "fsdp_cpu_offload: {choices: [false, true], when: {parallel: [fsdp]}}\n"
    )
    argv = ["plan", "--model", MODEL, "--devices", "2", "--device-memory", memory, "--json"]
    assert main([*argv, "--space", str(space), "--global-batch-size", str(global_batch)]) == 0
    plan: dict[str, Any] = json.loads(capsys.readouterr().out)
    return plan


def test_offloading_fsdp_shards_is_planned_as_a_way_to_fit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = _offload_plan(tmp_path, capsys, "1MiB", 8192)["configurations"]
    peaks = {r["config"]["fsdp_cpu_offload"]: r["predicted_peak_bytes"] for r in rows}
    state = 3 * 4 * (256 * 1024 + 1024 + 1024 * 256 + 256) * 4 // 2  # params, grads, 2 moments
    reserve = 1 + CUDA_RESERVE_SHARE  # the allocator's share over the tensors, before any trial
    assert peaks[False] - peaks[True] == pytest.approx(state * reserve, rel=0.01)


def test_the_largest_micro_batch_that_fits_is_shown_without_offload_where_that_fits_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = _offload_plan(tmp_path, capsys, "80GiB", 64)
    assert all(r["fits"] for r in plan["configurations"])  # offloaded or not: both fit
    (best,) = plan["largest_micro_batch"].values()
    assert best["config"]["fsdp_cpu_offload"] is False  # offloading costs time, saves none here


def test_the_largest_micro_batch_takes_checkpointing_before_offload(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # On a device where the unchecked, unoffloaded step does not fit, checkpointing every block
    # and offloading the shards both do. Moving shards, gradients and the optimizer step over
    # the host link every step costs more than recomputing activations: checkpointing is shown.
    space = tmp_path / "space.yaml"
    space.write_text(
        "parallel: [fsdp]\nworld_size: [2]\nfsdp_cpu_offload: [false, true]\n"
        "checkpoint_segments: [0, 4]\n"
    )
    argv = ["plan", "--model", MODEL, "--devices", "2", "--space", str(space), "--json"]
    argv += ["--global-batch-size", "1024"]
    assert main([*argv, "--device-memory", "80GiB"]) == 0
    peaks = {
        (r["config"]["fsdp_cpu_offload"], r["config"]["checkpoint_segments"]): r[
            "predicted_peak_bytes"
        ]
        for r in json.loads(capsys.readouterr().out)["configurations"]
    }
    either = max(peaks[(False, 4)], peaks[(True, 0)])
    assert either < peaks[(False, 0)]
    limit = (either + peaks[(False, 0)]) / 2
    assert main([*argv, "--device-memory", f"{limit / 0.9 / 2**30:.9f}GiB"]) == 0
    (best,) = json.loads(capsys.readouterr().out)["largest_micro_batch"].values()
    assert (best["config"]["fsdp_cpu_offload"], best["config"]["checkpoint_segments"]) == (False, 4)


def test_world_sizes_the_global_batch_cannot_split_are_said_not_dropped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["plan", "--model", MODEL, "--devices", "64", "--device-memory", "80GiB"]
    argv += ["--space", _space(tmp_path), "--global-batch-size", "32"]
    assert main([*argv, "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert {r["config"]["world_size"] for r in plan["configurations"]} == {1, 2, 8}
    assert plan["left_out"] == [
        "world_size 64: global batch 32 cannot be split evenly over that many ranks "
        "(--global-batch-size 64, or another multiple of 64, plans them)"
    ]
    assert main(argv) == 0
    assert "left out: world_size 64: global batch 32" in capsys.readouterr().out


def _plan_argv(tmp_path: Path, space_text: str, model: str = MODEL, devices: int = 1) -> list[str]:
    """``plan`` of ``model`` (Stack) on ``devices`` (one) 8 GiB devices over a space of
    ``space_text``."""
    space = tmp_path / "space.yaml"
    space.write_text(space_text)
    return ["plan", "--model", model, "--devices", str(devices), "--device-memory", "8GiB",
            "--space", str(space)]  # fmt: skip


def _alone(
    tmp_path: Path, argv: list[str], capsys: pytest.CaptureFixture[str], **values: Any
) -> str:
    """What ``plan`` with ``argv`` says of one configuration of ``values`` the model rules out
    (a one-line error, exit 2): its stderr."""
    config = tmp_path / "c.yaml"
    save_config(TrainConfig(global_batch_size=32, **values), config)
    assert main([*argv, "--config", str(config)]) == 2  # alone: a one-line error
    return capsys.readouterr().err


def test_checkpointing_more_blocks_than_the_model_repeats_is_left_out_not_fatal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The default space checkpoints up to 12 blocks; Stack repeats 4. Those choices are left
    # out, said once, and the rest is planned (before, the first such trace failed the plan).
    argv = _plan_argv(tmp_path, "parallel: [single]\ncheckpoint_segments: [0, 2, 8, 12]\n")
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "left out: checkpoint_segments 8, 12: the model has 4 repeated Sequential blocks" in out
    assert "ckpt=2" in out and "ckpt=8" not in out and "could not be traced" not in out
    assert main([*argv, "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert {r["config"]["checkpoint_segments"] for r in plan["configurations"]} == {0, 2}
    assert plan["left_out"] == [
        "checkpoint_segments 8, 12: the model has 4 repeated Sequential blocks"
    ]
    err = _alone(tmp_path, argv, capsys, checkpoint_segments=8)
    # in the words a trial's rank and `autotune trial` use
    assert "checkpoint_segments=8 exceeds the 4 repeated Sequential blocks of Stack" in err
    assert "use 0..4" in err and "Traceback" not in err


def test_fsdp_is_left_out_for_a_model_whose_lookups_have_sparse_gradients(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # FSDP's reduce-scatter takes no sparse gradient: its trials failed in their first step.
    space = "parallel: [single, ddp, fsdp]\nworld_size: [1, 2]\n"
    argv = _plan_argv(tmp_path, space, "tests.fixtures.sparse:Lookups", devices=2)
    assert main([*argv, "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert {r["config"]["parallel"] for r in plan["configurations"]} == {"single", "ddp"}
    reason = "FSDP cannot shard sparse gradients (sparse=True in bag, table; DDP reduces them)"
    assert plan["left_out"] == [f"parallel fsdp: {reason}"]
    err = _alone(tmp_path, argv, capsys, parallel="fsdp", world_size=2)
    assert f"parallel=fsdp: {reason}; use ddp or single" in err and "Traceback" not in err


def test_fsdps_bf16_parameters_are_left_out_where_a_forward_so_held_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A VQ codebook kept as a float32 buffer meets the bf16 features in a matrix product: the
    # meta device cannot show it, a forward of two samples built here does
    space = "parallel: [fsdp]\nworld_size: [2]\nfsdp_mixed_precision: [off, bf16]\n"
    argv = _plan_argv(tmp_path, space, "tests.fixtures.bf16_units:Codebook", devices=2)
    assert main([*argv, "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert {r["config"]["fsdp_mixed_precision"] for r in plan["configurations"]} == {"off"}
    [line] = plan["left_out"]
    assert line.startswith("fsdp_mixed_precision bf16: a forward of two samples held as FSDP's")
    assert "expected m1 and m2 to have the same dtype" in line
    err = _alone(tmp_path, argv, capsys, parallel="fsdp", world_size=2, fsdp_mixed_precision="bf16")
    assert "fsdp_mixed_precision=bf16: a forward of two samples" in err
    assert "use amp=bf16" in err and "Traceback" not in err


def test_a_plan_of_samples_the_dataloader_cannot_batch_is_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["plan", "--model", "tests.fixtures.padded:Tagger", "--devices", "2",
            "--device-memory", "8GiB"]  # fmt: skip
    assert main([*argv, "--collate", "torch.utils.data:default_collate"]) == 2
    err = capsys.readouterr().err
    assert "cannot make a batch of the dataset's first samples" in err and "--collate" in err
    assert "Traceback" not in err
    assert main([*argv, "--json"]) == 0  # its module's collate function pads them


def test_a_cpu_plan_counts_its_workers_before_a_trial(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Each worker's own pages, measured beside the bare rank, and the old copies of the pages
    # the rank writes after forking them: before, a plan predicted two workers at 0 MiB.
    argv = _plan_argv(tmp_path, "parallel: [single]\nnum_workers: [0, 2]\n")
    assert main([*argv, "--device", "cpu", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["calibration"].startswith("a rank of this workload measured here without its")
    assert (
        "the tensors x1.10 for the heap's kept pages; each DataLoader worker"
        in (plan["calibration"])
    )
    assert "together x1.10 the tensors their rank forks them from" in plan["calibration"]
    peaks = {r["config"]["num_workers"]: r["predicted_peak_bytes"] for r in plan["configurations"]}
    assert peaks[2] > peaks[0]
    assert "over an epoch" not in plan["calibration"]  # its dataset is one tensor's
    assert main([*argv, "--device", "cpu"]) == 0  # the limit covers the host's ranks together
    assert "GiB for all ranks together (one host): every number" in capsys.readouterr().out
    assert main(argv) == 0
    assert "GiB per device: every number" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--devices", "0", "--device-memory", "8GiB"], "--devices 0: must be at least 1"),
        (["--devices", "2", "--device-memory", "lots"], "--device-memory: 'lots' is not a size"),
        (["--devices", "2", "--device-memory", "8GiB", "--calibrate"], "no cuda device"),
    ],
)
def test_bad_plan_input_is_one_line(
    flags: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plan", "--model", MODEL, *flags]) == 2
    err = capsys.readouterr().err
    assert expected in err and "Traceback" not in err


def test_a_plan_names_the_optimizer_whose_state_it_counted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.fixtures.optimizers import PARAMETER_BYTES

    config = TrainConfig(global_batch_size=8, device="cuda")
    save_config(config, tmp_path / "c.yaml")
    argv = ["plan", "--model", "tests.fixtures.optimizers:Wide", "--devices", "1"]
    argv += ["--device-memory", "80GiB", "--config", str(tmp_path / "c.yaml"), "--json"]
    assert main(argv) == 0
    sgd = json.loads(capsys.readouterr().out)
    assert sgd["optimizer"] == "tests.fixtures.optimizers:autotune_optimizer"
    assert main([*argv, "--optimizer", "tests.fixtures.optimizers:adamw"]) == 0
    adamw = json.loads(capsys.readouterr().out)
    assert adamw["optimizer"] == "--optimizer tests.fixtures.optimizers:adamw"
    state = adamw["predicted_parts_bytes"]["optimizer state"]
    assert state >= 2 * PARAMETER_BYTES and sgd["predicted_parts_bytes"]["optimizer state"] == 0
    assert main(argv[:-3]) == 0  # the table says it too, and how to give another
    assert "optimizer whose state is counted: tests.fixtures.optimizers:autotune_optimizer" in (
        capsys.readouterr().out
    )
    assert main(["plan", "--model", MODEL, "--devices", "1", "--device-memory", "80GiB"]) == 0
    default = capsys.readouterr().out
    assert "default AdamW" in default and "--optimizer module:attr" in default


def test_a_spaces_all_choice_plans_checkpointing_every_block(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The default space checkpointed at most 12 blocks: a 32-layer model was never planned
    # with the full checkpointing a model that barely fits needs. Its 'all' is every block.
    argv = _plan_argv(tmp_path, "parallel: [single]\ncheckpoint_segments: [0, 2, all]\n")
    argv += ["--global-batch-size", "4096"]  # activations, which checkpointing drops, dominate
    assert main([*argv, "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["added"] == [
        "checkpoint_segments=4: every one of the model's 4 repeated Sequential blocks "
        "(the space's 'all')"
    ]
    peaks = {
        r["config"]["checkpoint_segments"]: r["predicted_peak_bytes"]
        for r in plan["configurations"]
    }
    assert sorted(peaks) == [0, 2, 4] and peaks[4] < peaks[2] < peaks[0]
    assert main(argv) == 0
    assert "added: checkpoint_segments=4: every one" in capsys.readouterr().out


def test_a_plan_for_one_device_leaves_out_the_modes_that_need_more() -> None:
    from autotune.api import plan

    table = plan(MODEL, devices=1, device="cpu", device_memory="4GiB", space="quick")
    # was: "ddpx1" and "fsdpx1" rows, which no search runs on one device
    assert {row.config.parallel for row in table.rows} == {"single"}
    assert "parallel ddp, fsdp: needs more than one device; 1 planned" in table.left_out


@pytest.mark.slow  # one model's rule through a whole plan
def test_a_plan_leaves_out_checkpointing_of_blocks_that_keep_nothing_for_backward(
    tmp_path: Path,
) -> None:
    # As the search's probe drops them (model_facts.idle_blocks): the plan tabulated k=4 of a model
    # whose lower two of four blocks are frozen, the same peak as k=2.
    from autotune.api import plan

    space = tmp_path / "space.yaml"
    space.write_text("parallel: [single]\ncheckpoint_segments: [0, 1, 2, 4, 8, 12]\n")
    table = plan(
        "tests.fixtures.models:FrozenBottom", devices=1, device="cpu", device_memory="4GiB",
        space=str(space),
    )  # fmt: skip
    assert {row.config.checkpoint_segments for row in table.rows} == {0, 1, 2}
    assert (
        "checkpoint_segments 4: 2 of the model's 4 repeated Sequential blocks keep nothing for "
        "backward (frozen, with no gradient flowing through them): checkpointing them saves "
        "nothing"
    ) in table.left_out
    assert "checkpoint_segments 8, 12: the model has 4 repeated Sequential blocks" in (
        table.left_out
    )


def test_a_plan_of_a_model_that_keeps_state_between_steps_says_its_peak_may_lie_above(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # a Transformer-XL's memory of past steps: a search's first prediction was 31% low, the
    # trace starting from an empty memory, and nothing said the prediction could be
    argv = ["plan", "--model", "tests.fixtures.stateful:Remembering", "--devices", "1"]
    argv += ["--device-memory", "80GiB", "--space", "quick"]
    assert main([*argv, "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert (
        "keeps tensors on its modules from one step to the next (Remembering.memory)"
        in (plan["assumption"])
    )
    assert main(argv) == 0
    assert "a long run's peak may lie above the prediction" in capsys.readouterr().out
    dense = ["plan", "--model", MODEL, "--devices", "1", "--device-memory", "80GiB", "--json"]
    assert main(dense) == 0
    assert json.loads(capsys.readouterr().out)["assumption"] is None


@pytest.mark.slow  # ~18 s of CUDA traces of one model family
def test_a_cuda_plan_of_a_recurrent_model_says_its_layers_were_traced_as_the_cpu_runs_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # On CPU a GRU runs step by step (about 22,000 ops a step for 2 bidirectional layers over
    # 120 frames) and an LSTM keeps oneDNN's workspace; cuDNN runs either as one fused kernel
    # with a reserve space, which nothing has measured against the trace: a plan for CUDA
    # devices said nothing of it.
    argv = ["plan", "--model", "tests.fixtures.packed:packed_gru", "--devices", "1"]
    config = tmp_path / "one.yaml"
    config.write_text("global_batch_size: 8\n")  # one step traced: a GRU's take seconds
    argv += ["--device-memory", "80GiB", "--config", str(config), "--json"]
    assert main(argv) == 0
    plan = json.loads(capsys.readouterr().out)
    assert "recurrent layers (GRU) traced as this machine's CPU runs them" in plan["assumption"]
    assert "cuDNN" in plan["assumption"]
    assert main([*argv, "--device", "cpu"]) == 0  # the trials run what was traced
    assert "recurrent" not in (json.loads(capsys.readouterr().out)["assumption"] or "")


def test_a_cpu_plan_says_what_its_workers_copy_of_a_dataset_of_objects_over_an_epoch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from autotune.runner import memory

    monkeypatch.setattr(memory, "epoch_copy", lambda *args: (40 * 2**20, False))
    argv = _plan_argv(tmp_path, "parallel: [single]\nnum_workers: [0, 2]\n")
    assert main([*argv, "--device", "cpu", "--json"]) == 0
    said = json.loads(capsys.readouterr().out)["calibration"]
    assert said.endswith(
        "over an epoch each DataLoader worker also copies at least 40 MiB of the dataset's "
        "Python objects as it reads them, beyond these figures"
    )
    argv = _plan_argv(tmp_path, "parallel: [single]\nnum_workers: [0]\n")
    assert main([*argv, "--device", "cpu", "--json"]) == 0
    assert "over an epoch" not in json.loads(capsys.readouterr().out)["calibration"]


def test_nothing_fitting_in_a_narrow_space_says_what_its_blocks_and_micro_batch_1_would_take(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # plan of a Llama-3-8B shape over the quick space (at most 2 of its 32 blocks checkpointed)
    # said nothing fits and to buy more devices, where checkpointing every block fits.
    space = tmp_path / "narrow.yaml"
    space.write_text("parallel: [single]\namp: ['off']\ncheckpoint_segments: [0]\n")
    argv = ["plan", "--model", "workloads.gpt:gpt_tiny", "--devices", "1", "--space", str(space)]
    argv += ["--global-batch-size", "64", "--device-memory"]
    assert main([*argv, "100MiB"]) == 0
    out = capsys.readouterr().out
    assert "nothing fits: the least memory is singlex1 amp=off accum=1 mbs=64" in out
    assert (
        "beyond the space: singlex1 amp=off ckpt=4 accum=64 mbs=1 workers=0 (its blocks "
        "checkpointed, micro-batch 1) predicted ~"
    ) in out
    assert "fits (give a space that offers it: --space FILE)" in out
    assert main([*argv, "100MiB", "--json"]) == 0
    beyond = json.loads(capsys.readouterr().out)["beyond_space"]
    assert beyond["fits"] and beyond["config"]["checkpoint_segments"] == 4
    assert main([*argv, "1MiB"]) == 0  # too little even so: said, never as fitting
    assert "over the limit too" in capsys.readouterr().out
    assert main([*argv, "1GiB", "--json"]) == 0  # something fits: nothing beyond
    assert json.loads(capsys.readouterr().out)["beyond_space"] is None


def test_a_cuda_plan_of_a_flex_attention_model_predicts_it_as_cuda_runs_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # FlexAttention refuses to train on a CPU: a plan for CUDA said "could not be traced" and
    # predicted nothing. CUDA runs it dense without torch.compile, fused where the trial or
    # the model's own code compiles it: predicted as eager, a compiled trial's scores counted
    # would be skipped as over the limit where it fits.
    def planned(model: str, **values: object) -> dict[str, object]:
        config = tmp_path / "one.yaml"
        config.write_text(json.dumps({"global_batch_size": 8, **values}))
        argv = ["plan", "--model", f"tests.fixtures.flex:{model}", "--devices", "1"]
        assert main([*argv, "--device-memory", "80GiB", "--config", str(config), "--json"]) == 0
        return json.loads(capsys.readouterr().out)  # type: ignore[no-any-return]

    eager = planned("FlexBlocks")
    assert "FlexAttention traced as CUDA runs it: without torch.compile" in eager["assumption"]
    compiled = planned("FlexBlocks", compile="default")
    own = planned("CompiledFlexBlocks")  # compiled by its own code, the trial's eager
    assert "FlexAttention compiled by the model's own code" in own["assumption"]
    assert compiled["predicted_peak_bytes"] == own["predicted_peak_bytes"]
    assert compiled["predicted_peak_bytes"] < eager["predicted_peak_bytes"]
    assert "FlexAttention as its fused kernel holds it" in compiled["source"]
    assert "FlexAttention" not in eager["source"]


def test_a_cuda_plan_keeps_what_save_on_cpu_offloads_off_the_device(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Traced with torch's own hooks, a plan for CUDA counted every offloaded activation on the
    # device, and a pinned copy beside it: above the same model without offloading.
    def planned(model: str, device: str) -> dict[str, object]:
        config = tmp_path / "one.yaml"
        config.write_text(json.dumps({"global_batch_size": 1024, "device": device}))
        argv = ["plan", "--model", f"tests.fixtures.traced:{model}", "--devices", "1"]
        assert main([*argv, "--device-memory", "80GiB", "--config", str(config), "--json"]) == 0
        return json.loads(capsys.readouterr().out)  # type: ignore[no-any-return]

    offloaded, plain = planned("Offloaded", "cuda"), planned("Stack", "cuda")
    said = "activations offloaded by torch's save_on_cpu traced in host memory, not on the "
    assert said + "device (43.0 MiB a process at most)" in str(offloaded["assumption"])
    assert offloaded["predicted_peak_bytes"] < plain["predicted_peak_bytes"]  # type: ignore[operator]


@pytest.mark.parametrize(
    "model",
    [
        pytest.param("NamesCuda", marks=pytest.mark.slow),  # the same build stand-ins as
        "NamesCudaByIndex",
        pytest.param("moved_by_cuda", marks=pytest.mark.slow),  # an index's and the factory's
    ],
)
def test_a_cuda_plan_of_gpu_only_code_knows_its_blocks_from_its_build(model: str) -> None:
    # Built on the meta device for the plan's questions, code naming CUDA in its constructor or
    # factory failed there: its repeated blocks unknown, the quick space's checkpointed
    # configurations were traced, and their refusal ("has no repeated blocks") ended the plan.
    from autotune.api import plan

    reference = f"tests.fixtures.named_cuda:{model}"
    table = plan(reference, devices=2, device="cuda", device_memory="16GiB", space="quick")
    assert table.trace_error is None
    assert "checkpoint_segments 2: the model has no repeated blocks" in table.left_out
    assert table.rows and all(row.config.checkpoint_segments == 0 for row in table.rows)


def test_a_kind_of_step_that_fails_is_left_out_and_the_rest_planned(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Attention whose code enables CUDA's flash kernel alone fails in float32 on CUDA: before,
    # that one failure ended the plan ("could not be traced") for its bf16 steps too.
    argv = _plan_argv(tmp_path, "amp: ['off', bf16]\n", "tests.fixtures.traced:AttendsFlashOnly")
    assert main([*argv, "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["trace_error"] is None
    assert {r["config"]["amp"] for r in plan["configurations"]} == {"bf16"}
    [line] = [line for line in plan["left_out"] if line.startswith("amp off")]
    assert line.startswith("amp off: the step fails under fake tensors: RuntimeError: ")
    assert "no kernel CUDA has enabled takes these inputs" in line


def test_a_model_whose_every_step_fails_is_still_said_not_to_trace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # each kind of step tried alone fails too: the plan says so, as before (exit status 1)
    argv = _plan_argv(tmp_path, "amp: ['off', bf16]\n", "tests.fixtures.traced:Mismatched")
    assert main([*argv, "--json"]) == 1
    plan = json.loads(capsys.readouterr().out)
    assert plan["configurations"] == [] and "must have same reduction dim" in plan["trace_error"]
    assert not any(line.startswith("amp") for line in plan["left_out"])


def test_the_kinds_a_failure_leaves_out_are_said_in_the_words_of_their_knobs() -> None:
    from autotune.search.plan import _kinds_phrase

    plain = {("fp32", "full"), ("fp32", ""), ("16-bit", "full")}
    assert _kinds_phrase([("fp32", "full")], plain) == "amp off with checkpoint_segments above 0"
    both = {("fp32", "full"), ("fp32", "selective"), ("fp32", "")}
    # beside selective configurations, "above 0" alone would take them in too
    assert _kinds_phrase([("fp32", "full")], both) == (
        "checkpoint_segments above 0, checkpoint_policy full"
    )
    assert _kinds_phrase([("fp32", "selective")], both) == "checkpoint_policy selective"
