"""The trace reads values of the tensors a model makes itself (``fake_shadows``): exactly, as
a real step reads them, and never after a write it could not follow."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from autotune.bench.traced_step import real_batch_peak
from autotune.runner.fake_memory import TraceError, trace_step
from autotune.runner.workload import WorkloadSpec
from tests.fixtures import shadowed


def test_a_branch_and_a_selection_on_a_mask_the_model_builds_are_a_real_steps() -> None:
    spec = WorkloadSpec(model="tests.fixtures.shadowed:GlobalTokens")
    traced = trace_step(spec, 8)
    assert traced.total_bytes == real_batch_peak(spec, 8, optimizer="SGD")
    assert traced.unused_parameters == 0  # the branch was taken: the wide layer has gradients
    # and sized by the 8 global positions: one more row each would be another 4 KiB apiece
    wide_rows = 8 * 64 * shadowed.WIDTH * 4
    assert wide_rows < traced.activations_bytes < 2 * wide_rows + 2**16
    assert traced.sampled_selections == traced.routed_sizes == traced.drawn_branches == 0


def test_a_mask_written_from_values_the_trace_lacks_is_no_longer_known() -> None:
    spec = WorkloadSpec(model="tests.fixtures.shadowed:OverwritesItsMask")
    with pytest.raises(TraceError, match="depends on tensor values"):
        trace_step(spec, 4)


def test_the_batchs_mask_written_from_values_the_trace_lacks_is_no_longer_known() -> None:
    # The first samples' mask was kept beside its shadow and read again once the shadow was
    # forgotten: a selection sized by values the model had overwritten.
    spec = WorkloadSpec(model="tests.fixtures.shadowed:OverwritesTheBatchsMask")
    with pytest.raises(TraceError, match="depends on tensor values"):
        trace_step(spec, 4)


def test_the_batchs_mask_merged_with_one_the_model_builds_is_read_as_sampled() -> None:
    spec = WorkloadSpec(model="tests.fixtures.shadowed:MergedMask")
    traced = trace_step(spec, 8)
    assert traced.sampled_selections == 1  # the batch's values sized it: said as assumed
    assert traced.total_bytes == real_batch_peak(spec, 8, optimizer="SGD")


def test_a_pointer_buffer_of_a_model_that_copies_a_module_as_it_is_built_is_read() -> None:
    # MoCo's momentum encoder is a deep copy of a module with a buffer, which failed under fake
    # tensors: built on the meta device instead, its queue pointer had no value to read
    spec = WorkloadSpec(model="tests.fixtures.shadowed:MomentumQueue")
    for micro_batch in (8, 16):  # the second writes past the queue's end: a smaller slice
        assert trace_step(spec, micro_batch).total_bytes == real_batch_peak(
            spec, micro_batch, optimizer="SGD"
        )


def test_a_deep_copy_of_a_fake_tensor_is_a_fake_clone() -> None:
    import copy

    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    from autotune.runner.fake_shadows import FakeDeepcopies

    # torch's own copy fails ("Attempted to set the storage of a tensor on device "meta""), and
    # is not run here: what it leaves behind corrupted the heap at this process's exit
    with FakeTensorMode():
        norm = nn.BatchNorm1d(4)
        with FakeDeepcopies():
            copied = copy.deepcopy(norm)
    assert isinstance(copied.running_mean, FakeTensor)
    assert copied.running_mean is not norm.running_mean
    assert copied.weight.requires_grad and copied.weight is not norm.weight


def test_the_private_mode_stack_escape_runs_real_ops_beneath_a_fake_mode() -> None:
    """What ``Shadows.run`` relies on: inside a dispatch mode entered within
    ``FakeTensorMode``, ``_disable_current_modes`` runs an op on real tensors and returns a
    real tensor (pinned: a torch release that changes it shows here)."""
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
    from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

    seen: list[torch.Tensor] = []

    class Mirror(TorchDispatchMode):  # type: ignore[no-untyped-call]
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            if func is torch.ops.aten.add.Tensor:
                with _disable_current_modes():
                    seen.append(func(torch.ones(2), torch.ones(2)))
            return func(*args, **(kwargs or {}))

    with FakeTensorMode(), Mirror():
        fake = torch.zeros(2) + 1
    assert isinstance(fake, FakeTensor)
    assert type(seen[0]) is torch.Tensor and seen[0].tolist() == [2.0, 2.0]
    assert torch.Tag.dynamic_output_shape in torch.ops.aten.nonzero.default.tags
    assert torch.Tag.data_dependent_output in torch.ops.aten._local_scalar_dense.default.tags
    assert torch.Tag.nondeterministic_seeded in torch.ops.aten.rand.default.tags
