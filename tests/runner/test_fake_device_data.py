"""A dataset GPU code keeps on the GPU (``fake_device.CudaMade``): traced for CUDA, it builds on
this CPU, and what it keeps there is counted beside the step, once per device."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from autotune.cli import main
from autotune.runner.fake_memory import TraceError, trace_step
from autotune.runner.workload import WorkloadSpec
from tests.fixtures.gpu_data import ON_GPU_BYTES

MODEL = "tests.fixtures.gpu_data:Net"


def _spec(data: str) -> WorkloadSpec:
    return WorkloadSpec(model=MODEL, data=f"tests.fixtures.gpu_data:{data}")


def test_a_dataset_kept_on_the_gpu_is_counted_beside_the_step_it_feeds() -> None:
    # before: "dataset ... could not be built: Torch not compiled with CUDA enabled"
    kept = trace_step(_spec("on_gpu"), 32, device_type="cuda")
    host = trace_step(_spec("on_host"), 32, device_type="cuda")
    assert kept.dataset_on_device_bytes == ON_GPU_BYTES  # the normalised features, the labels
    assert host.dataset_on_device_bytes == 0
    assert replace(kept, dataset_on_device_bytes=0) == host  # the step itself: the same


def test_what_the_dataset_copies_back_to_the_host_is_not_counted() -> None:
    assert trace_step(_spec("staged_on_gpu"), 32, device_type="cuda").dataset_on_device_bytes == 0


def test_a_cpu_trace_of_it_stops_as_a_cpu_trial_does() -> None:
    with pytest.raises(TraceError, match="could not be built"):
        trace_step(_spec("on_gpu"), 32)


def test_a_cuda_plan_shows_it_as_a_part_of_each_devices_peak(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "ddp.yaml"
    config.write_text(
        json.dumps({"global_batch_size": 64, "device": "cuda", "parallel": "ddp", "world_size": 2})
    )

    def planned(data: str) -> dict[str, int]:
        argv = ["plan", "--model", MODEL, "--data", f"tests.fixtures.gpu_data:{data}"]
        argv += ["--devices", "2", "--device-memory", "16GiB", "--config", str(config), "--json"]
        assert main(argv) == 0
        return json.loads(capsys.readouterr().out)["predicted_parts_bytes"]  # type: ignore[no-any-return]

    kept, host = planned("on_gpu"), planned("on_host")
    assert kept["dataset"] == ON_GPU_BYTES and "dataset" not in host  # each rank's own copy
    assert {k: v for k, v in kept.items() if k not in ("dataset", "process")} == {
        k: v for k, v in host.items() if k != "process"
    }


def test_on_cuda_a_dataset_kept_on_the_gpu_rules_out_workers_and_pinning_its_samples() -> None:
    # A DataLoader worker is a forked process, which cannot use CUDA; only host tensors pin:
    # on a GPU each such trial would fail its first step.
    from autotune.runner.platform import detect_platform
    from autotune.search.probe import restrict_space
    from autotune.search.refusals import dataset_refusals
    from autotune.search.space import load_space

    refusals = dataset_refusals(_spec("on_gpu"), "cuda", [0, 1, 2, 4, 8], True)
    assert [(r.knob, r.value, r.device) for r in refusals] == [
        *(("num_workers", count, "cuda") for count in (1, 2, 4, 8)),
        ("pin_memory", True, "cuda"),
    ]
    assert refusals[0].reason.startswith("the dataset keeps 264.0 KiB of tensors on the GPU, and a")
    cuda = detect_platform("cpu").model_copy(update={"device_type": "cuda"})
    space, _ = restrict_space(load_space("default"), cuda, 2, None, False, refusals=refusals)
    assert space.params["num_workers"].choices == (0,)
    assert True not in space.params["pin_memory"].choices
    # read to the host sample by sample: pinned, but still no worker; kept nothing: no refusal
    read = dataset_refusals(_spec("on_gpu_read_to_host"), "cuda", [0, 2], True)
    assert [(r.knob, r.value) for r in read] == [("num_workers", 2)]
    made = dataset_refusals(
        _spec("made_on_read"), "cuda", [0, 2], True
    )  # nothing kept, samples CUDA's
    assert [(r.knob, r.value) for r in made] == [("num_workers", 2), ("pin_memory", True)]
    assert made[0].reason.startswith("the dataset makes its samples on the GPU, and a")
    assert trace_step(_spec("made_on_read"), 32, device_type="cuda").dataset_on_device_bytes == 0
    assert dataset_refusals(_spec("staged_on_gpu"), "cuda", [0, 2], True) == ()
    assert dataset_refusals(_spec("on_host"), "cuda", [0, 2], True) == ()
    # neither asked for, or on a CPU: nothing to rule out, and the dataset is not built
    assert dataset_refusals(_spec("on_gpu"), "cuda", [0], False) == ()
    assert dataset_refusals(_spec("on_gpu"), "cpu", [0, 2], True) == ()
    assert dataset_refusals(_spec("made_on_read"), "cuda", [0], True)[0].knob == "pin_memory"


def test_a_cuda_configuration_with_workers_for_it_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "workers.yaml"
    config.write_text(json.dumps({"global_batch_size": 64, "device": "cuda", "num_workers": 2}))
    argv = ["plan", "--model", MODEL, "--data", "tests.fixtures.gpu_data:on_gpu"]
    argv += ["--devices", "1", "--device-memory", "16GiB", "--config", str(config)]
    assert main(argv) != 0
    err = capsys.readouterr().err
    assert "num_workers=2: the dataset keeps 264.0 KiB of tensors on the GPU" in err
    assert "use num_workers=0" in err and "Traceback" not in err
