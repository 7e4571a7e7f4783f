"""A dataset GPU code keeps on the GPU (``fake_device.CudaMade``): traced for CUDA, it builds on
this CPU, and what it keeps there is counted beside the step, once per device."""

from __future__ import annotations

import json
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
    from dataclasses import replace

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
