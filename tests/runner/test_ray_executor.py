"""The Ray executor beyond the shared contract: what it says when Ray was started by its caller."""

from __future__ import annotations

import pytest

from autotune.runner.platform import detect_platform

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("ray_cluster")]


def test_an_address_or_cpu_count_an_existing_ray_instance_overrides_is_reported() -> None:
    from autotune.runner.ray_executor import RayExecutor

    platform = detect_platform("cpu")
    joined = RayExecutor(platform, address="10.0.0.7:6379")
    assert any("'10.0.0.7:6379' is not used" in note for note in joined.notes)
    wider = RayExecutor(platform, num_cpus=64)  # the session's instance has 8 CPUs
    assert any("with 8 CPUs; the search asked for 64" in note for note in wider.notes)
    fitting = RayExecutor(platform, num_cpus=4)
    assert fitting.notes == []
    for executor in (joined, wider, fitting):
        executor.shutdown()
