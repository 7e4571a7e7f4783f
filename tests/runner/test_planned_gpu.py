"""What GPU code asks of its GPU, answered in a trace for CUDA as the GPU a plan is for
(``planned_gpu``) where this machine has none; torch's own questions answered as it has."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from autotune.cli import main
from autotune.runner.fake_device import cuda_stand_ins
from autotune.runner.fake_memory import TensorPeak, TraceError, trace_step
from autotune.runner.planned_gpu import (
    AVAILABLE,
    GPUS,
    PLANNED,
    TOLD_UNAVAILABLE,
    assumed,
    planning,
)
from autotune.runner.workload import WorkloadSpec
from tests.fixtures.gpu_data import ON_GPU_BYTES

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="a machine with a CUDA device")


def _traced(model: str) -> TensorPeak:
    return trace_step(WorkloadSpec(model=f"tests.fixtures.asks_gpu:{model}"), 8, device_type="cuda")


@pytest.mark.parametrize(
    ("model", "asked"),
    [
        ("AsksCapability", ("get_device_capability",)),
        ("AsksForFlash", ("torch.backends.cuda.is_flash_attention_available",)),
        ("AsksProperties", ("get_device_name", "get_device_properties", "is_bf16_supported")),
    ],
)
def test_code_asking_which_gpu_it_runs_on_is_traced_for_the_planned_gpu(
    model: str, asked: tuple[str, ...]
) -> None:
    # before: "could not be built: Torch not compiled with CUDA enabled" (no CUDA plan at all)
    peak = _traced(model)
    assert peak.cuda_asked == asked
    fused, written_out = _traced("Attends"), _traced("written_out")
    assert replace(peak, cuda_asked=()) == fused  # flash, as on an H100
    assert fused.total_bytes < written_out.total_bytes  # the branch it took is seen


def test_a_dataset_put_on_the_gpu_where_one_is_there_is_counted_on_it() -> None:
    # before: is_available() answered False, the dataset planned in host memory
    data = "tests.fixtures.gpu_data:where_available"
    spec = WorkloadSpec(model="tests.fixtures.gpu_data:Net", data=data)
    peak = trace_step(spec, 32, device_type="cuda")
    assert peak.dataset_on_device_bytes == ON_GPU_BYTES
    assert peak.cuda_asked == (AVAILABLE,)
    said = assumed(peak.cuda_asked)
    assert said is not None and "torch.cuda.is_available()" in said
    assert trace_step(spec, 32).dataset_on_device_bytes == 0  # a CPU trace: as this machine


def test_an_optimizer_factory_asking_for_a_gpu_is_traced_as_it_builds_on_one() -> None:
    # before: its factory ran outside the stand-ins, told False: foreach's temporaries counted
    # (at micro-batch 1, where the optimizer's step is the peak)
    optimizer = "tests.fixtures.asks_gpu:fused_where_available"
    factory = WorkloadSpec(model="tests.fixtures.asks_gpu:Attends", optimizer=optimizer)
    peak = trace_step(factory, 1, device_type="cuda")
    assert peak.cuda_asked == (AVAILABLE,)
    spec = WorkloadSpec(model="tests.fixtures.asks_gpu:Attends")
    fused = trace_step(spec, 1, optimizer_impl="fused", device_type="cuda")
    assert replace(peak, cuda_asked=()) == fused
    assert fused.total_bytes < trace_step(spec, 1, device_type="cuda").total_bytes  # foreach


def test_code_reaching_for_a_cuda_only_extension_is_traced_on_its_path_without_a_gpu() -> None:
    peak = _traced("FusedWhereAvailable")
    assert peak.cuda_asked == (TOLD_UNAVAILABLE,)
    assert replace(peak, cuda_asked=()) == _traced("Attends")
    said = assumed(peak.cuda_asked)
    assert said is not None and "traced told False" in said


def test_torchs_own_questions_are_answered_as_this_machine_has() -> None:
    own = {"__name__": "torch.somewhere", "torch": torch}
    exec("def asks():\n    return torch.cuda.is_available()\n", own)
    users = {"__name__": "users_model", "torch": torch}
    exec("def asks():\n    return torch.cuda.is_available()\n", users)
    asked: set[str] = set()
    with cuda_stand_ins(asked=asked):
        assert own["asks"]() is False
        assert users["asks"]() is True
        assert torch.cuda.get_device_capability() == (PLANNED.major, PLANNED.minor)
    assert asked == {AVAILABLE, "get_device_capability"}
    assert torch.cuda.is_available() is False  # restored
    with pytest.raises((RuntimeError, AssertionError)):
        torch.cuda.get_device_capability()


def test_what_was_asked_is_said_with_the_gpu_it_was_answered_as() -> None:
    said = assumed(("get_device_capability", AVAILABLE))
    assert said is not None
    assert "torch.cuda.get_device_capability(), torch.cuda.is_available()" in said
    assert PLANNED.name in said and "capability 9.0" in said
    assert assumed(()) is None


def test_a_cpu_trace_asks_nothing_of_a_gpu() -> None:
    spec = WorkloadSpec(model="tests.fixtures.asks_gpu:AsksCapability")
    with pytest.raises(TraceError, match="could not be built"):  # as a CPU trial would
        trace_step(spec, 8)


def test_a_cuda_plan_says_which_gpu_the_code_was_told(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "one.yaml"
    config.write_text(json.dumps({"global_batch_size": 8, "device": "cuda"}))
    code = main(
        [
            "plan", "--model", "tests.fixtures.asks_gpu:AsksCapability", "--devices", "1",
            "--device-memory", "80GiB", "--config", str(config), "--json", "--quiet",
        ]
    )  # fmt: skip
    assert code == 0
    plan = json.loads(capsys.readouterr().out)
    assert PLANNED.name in plan["assumption"]
    assert plan["predicted_peak_bytes"] > 0


def test_a_device_chosen_as_the_module_is_imported_is_the_planned_gpu(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # before: the plan's checks imported the module told False, DEVICE stayed the CPU for the
    # process: its dataset planned in host memory, its workers not refused
    import sys

    sys.modules.pop("tests.fixtures.device_at_import", None)  # this plan imports it first
    config = tmp_path / "one.yaml"
    config.write_text(json.dumps({"global_batch_size": 32, "device": "cuda"}))
    model = "tests.fixtures.device_at_import:Model"
    common = ["--model", model, "--devices", "1", "--device-memory", "80GiB", "--quiet"]
    assert main(["plan", *common, "--config", str(config), "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["predicted_parts_bytes"]["dataset"] == ON_GPU_BYTES
    assert "torch.cuda.is_available()" in plan["assumption"]
    config.write_text(json.dumps({"global_batch_size": 32, "device": "cuda", "num_workers": 2}))
    assert main(["plan", *common, "--config", str(config)]) != 0
    assert "num_workers=2: the dataset keeps" in capsys.readouterr().err


def test_a_meta_build_answers_as_the_planned_gpu_only_within_a_plan_for_cuda() -> None:
    # the same build serves a CPU search's questions, whose trials run on this machine
    from autotune.runner.planned_gpu import importing
    from autotune.search.meta_build import forget, meta_model

    model = "tests.fixtures.asks_gpu:AsksCapability"
    forget()
    assert meta_model(model) is None  # as its CPU trial: "Torch not compiled with CUDA enabled"
    forget()
    with importing(WorkloadSpec(model=model)):
        built = meta_model(model)
    assert built is not None and built[1].fused  # flash, as on the planned GPU
    forget()


def _planned_json(capsys: pytest.CaptureFixture[str], config: Path, *flags: str) -> dict:
    model = "tests.fixtures.asks_gpu:AsksCapability"
    plan_flags = ["--devices", "1", "--config", str(config), "--json", "--quiet"]
    assert main(["plan", "--model", model, *plan_flags, *flags]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_plan_for_a_gpu_it_names_is_traced_as_that_gpu_answers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "one.yaml"
    config.write_text(json.dumps({"global_batch_size": 8, "device": "cuda"}))
    h100 = _planned_json(capsys, config, "--device-memory", "80GiB")
    v100 = _planned_json(capsys, config, "--gpu", "V100")  # capability 7.0: no flash
    assert v100["gpu"]["name"] == GPUS["v100"].name and v100["gpu"]["capability"] == "7.0"
    assert h100["gpu"]["name"] == PLANNED.name
    assert GPUS["v100"].name in v100["assumption"]
    assert v100["limit_bytes"] == int(16 * 2**30 * 0.9)  # its memory, the margin kept
    assert "as NVIDIA lists it" in v100["gpu"]["said"]
    # the branch the code takes on a V100: its scores written out, more than flash holds
    assert v100["predicted_peak_bytes"] > h100["predicted_peak_bytes"]
    with planning(GPUS["v100"]):
        assert _traced("AsksCapability").total_bytes == _traced("written_out").total_bytes


def test_a_gpu_not_listed_is_planned_by_its_capability_and_memory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "one.yaml"
    config.write_text(json.dumps({"global_batch_size": 8, "device": "cuda"}))
    given = _planned_json(capsys, config, "--gpu", "7.5:16GiB")  # a T4 by its numbers
    t4 = _planned_json(capsys, config, "--gpu", "t4")
    assert given["predicted_peak_bytes"] == t4["predicted_peak_bytes"]  # not flash: written out
    assert given["gpu"]["name"] == "CUDA GPU" and given["gpu"]["capability"] == "7.5"
    assert given["limit_bytes"] == t4["limit_bytes"]
    memory = _planned_json(capsys, config, "--gpu", "8.9", "--device-memory", "48GiB")
    assert memory["gpu"]["total_memory_bytes"] == 48 * 2**30
    # traces kept per GPU, not per name: this one's flash, as an H100's
    assert memory["predicted_peak_bytes"] < given["predicted_peak_bytes"]


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--gpu", "b200"], "--gpu 'b200': use one of h100, h200"),
        (["--gpu", "8.9"], "--gpu '8.9': give its memory (8.9:48GiB) or --device-memory"),
        (["--gpu", "t4", "--device", "cpu"], "--gpu t4: names a CUDA GPU, and the plan is for cpu"),
        ([], "--device-memory: give one device's memory (80GiB), or --gpu NAME"),
    ],
)
def test_a_gpu_the_plan_cannot_take_is_one_line(
    flags: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    model = "tests.fixtures.asks_gpu:Attends"
    assert main(["plan", "--model", model, "--devices", "1", "--quiet", *flags]) == 2
    err = capsys.readouterr().err
    assert said in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
