"""What a real kernel checks and a fake one skips, checked in the memory trace
(``fake_checks``)."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from autotune.runner.fake_checks import SameDtypes
from autotune.runner.fake_memory import TraceError, trace_step
from autotune.runner.workload import WorkloadSpec


def test_torchs_fake_matmul_takes_inputs_its_real_kernel_refuses() -> None:
    # why the check exists: the day this fails, torch checks it itself
    x, w = torch.randn(2, 4), torch.randn(4, 4, dtype=torch.float16)
    with pytest.raises(RuntimeError, match="same dtype"):
        x @ w
    with FakeTensorMode() as mode:
        assert (mode.from_tensor(x) @ mode.from_tensor(w)).dtype == torch.float32


@pytest.mark.parametrize(
    "op",
    [
        lambda x, w: x @ w,
        lambda x, w: torch.nn.functional.linear(x, w),
        lambda x, w: torch.bmm(x[None], w[None]),
        lambda x, w: torch.nn.functional.conv1d(x[None], w[:, :, None]),
    ],
)
def test_inputs_of_different_dtypes_are_refused_as_a_real_kernel_refuses_them(op: object) -> None:
    with FakeTensorMode() as mode, SameDtypes():
        x, w = mode.from_tensor(torch.randn(4, 4)), mode.from_tensor(torch.randn(4, 4))
        op(x, w)  # type: ignore[operator]  # one dtype: as before
        with pytest.raises(RuntimeError, match=r"of different dtypes \(float16 and float32\)"):
            op(x, w.half())  # type: ignore[operator]


def test_a_step_no_real_kernel_runs_is_not_traced_as_if_it_ran() -> None:
    spec = WorkloadSpec(model="tests.fixtures.double:CastsItsInput")
    with pytest.raises(TraceError, match=r"bfloat16 and float32\), which its real kernel refuses"):
        trace_step(spec, 8)
    with pytest.raises(TraceError, match="which its real kernel refuses"):
        trace_step(spec, 8, device_type="cuda")
