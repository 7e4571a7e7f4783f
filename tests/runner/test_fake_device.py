"""CUDA named by the model's own code in the memory trace (``fake_device``): the trace's CPU,
which stands for the CUDA device, for a trace for CUDA; a CPU trace stops, as its trial does."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from autotune.runner.fake_device import CudaOnCpu, cuda_stand_ins, unmarked_ranges
from autotune.runner.fake_memory import TraceError, trace_step
from autotune.runner.workload import WorkloadSpec

NAMES = WorkloadSpec(model="tests.fixtures.named_cuda:NamesCuda")
ITS_OWN = WorkloadSpec(model="tests.fixtures.named_cuda:OnItsDevice")


def test_every_way_of_naming_cuda_is_the_cpu_while_entered() -> None:
    x = torch.ones(2)
    with CudaOnCpu():
        assert torch.arange(3, device="cuda").device.type == "cpu"
        assert torch.zeros(2, device=torch.device("cuda", 1)).device.type == "cpu"
        assert x.new_ones(3, device="cuda:0").device.type == "cpu"
        assert x.cuda() is x and x.cuda(0, non_blocking=True) is x
        moved = x.to("cuda", torch.float16)
        assert (moved.device.type, moved.dtype) == ("cpu", torch.float16)
        assert x.to(device=torch.device("cuda")).device.type == "cpu"
        assert x.to(torch.float64).dtype == torch.float64  # nothing else changes
        assert x.to("cuda") is x  # where it stands
        meta = torch.empty(2, device="meta")
        assert meta.to("cuda") is meta and meta.cuda() is meta  # a build on the meta device's
    with pytest.raises((RuntimeError, AssertionError)):  # left: this build has no CUDA
        torch.zeros(2).cuda()


@pytest.mark.parametrize("amp", ["off", "bf16"])
def test_a_model_naming_cuda_traces_for_cuda_as_one_using_its_inputs_device(amp: str) -> None:
    # before: "Expected all tensors to be on the same device", or "not linked with support for
    # cuda devices": no plan for CUDA of GPU-only code
    named = trace_step(NAMES, 8, amp, device_type="cuda")
    assert named == trace_step(ITS_OWN, 8, amp, device_type="cuda")


@pytest.mark.parametrize("model", ["BlocksNamingCuda", "BlocksMovingToCuda", "BlocksIndexingCuda"])
def test_checkpointed_blocks_naming_cuda_run_again_on_the_cpu_in_backward(model: str) -> None:
    # a function mode is not active in backward: the recomputation made its tensor on CUDA
    # ("Recomputed values ... have different metadata than during the forward pass"), or, by
    # .cuda() or .to("cuda"), raised "not linked with support for cuda devices", or, by a
    # device index, "Cannot access accelerator device when none is available"
    def traced(model: str) -> object:
        spec = WorkloadSpec(model=f"tests.fixtures.named_cuda:{model}")
        return trace_step(spec, 8, "off", 2, device_type="cuda")

    assert traced(model) == traced("BlocksOnItsDevice")


def test_code_selecting_and_waiting_for_its_gpu_traces_as_its_inputs_device() -> None:
    # before: "PyTorch was compiled without CUDA support" (torch.cuda.device(0)),
    # "Torch not compiled with CUDA enabled" (synchronize)
    waits = WorkloadSpec(model="tests.fixtures.named_cuda:SelectsAndWaits")
    assert trace_step(waits, 8, device_type="cuda") == trace_step(ITS_OWN, 8, device_type="cuda")


def test_copies_staged_in_pinned_memory_trace_as_its_inputs_device() -> None:
    # before: "Cannot access accelerator device when none is available" (pin_memory()),
    # "pin_memory=True requires a CUDA or other accelerator backend"
    pins = WorkloadSpec(model="tests.fixtures.named_cuda:PinsItsCopies")
    assert trace_step(pins, 8, device_type="cuda") == trace_step(ITS_OWN, 8, device_type="cuda")


def test_megatron_style_code_naming_the_current_device_traces_as_its_inputs_device() -> None:
    # before: "Torch not compiled with CUDA enabled" building it, "Cannot access accelerator
    # device when none is available" for device=0
    by_index = WorkloadSpec(model="tests.fixtures.named_cuda:NamesCudaByIndex")
    assert trace_step(by_index, 8, device_type="cuda") == trace_step(ITS_OWN, 8, device_type="cuda")


def test_the_stand_ins_leave_torch_as_it_was() -> None:
    to, cuda, current = torch.Tensor.to, torch.Tensor.cuda, torch.cuda.current_device
    pin, chosen = torch.Tensor.pin_memory, (torch.cuda.set_device, torch.cuda.device)
    factories = (torch.zeros, torch.Tensor.new_zeros)
    x = torch.ones(2)
    with cuda_stand_ins():
        torch.set_default_device("cuda")
        assert torch.ones(1).device.type == "cpu"
        assert x.cuda() is x and x.to("cuda:0") is x and x.to(0) is x and x.pin_memory() is x
        assert x.to(torch.float16, non_blocking=True).dtype == torch.float16
        assert x.to(torch.zeros(1, dtype=torch.float64)).dtype == torch.float64
        if not torch.cuda.is_available():
            assert torch.cuda.current_device() == 0
            torch.cuda.set_device(1), torch.cuda.synchronize()
            with torch.cuda.device(1):
                assert torch.cuda.current_device() == 0  # one device: nothing to select
    assert (torch.Tensor.to, torch.Tensor.cuda, torch.cuda.current_device) == (to, cuda, current)
    assert torch.Tensor.pin_memory is pin
    assert (torch.zeros, torch.Tensor.new_zeros) == factories
    assert (torch.cuda.set_device, torch.cuda.device) == chosen
    assert torch.get_default_device() == torch.device("cpu")  # a factory's CUDA default: kept out
    if not torch.cuda.is_available():
        with pytest.raises((RuntimeError, AssertionError)):
            x.to("cuda")


@pytest.mark.parametrize(
    "factory", ["moved_by_cuda", "moved_by_to", "on_cuda_by_default", "selects_its_device"]
)
def test_a_factory_moving_the_model_to_cuda_traces_as_the_model(factory: str) -> None:
    # a fake module cannot be moved (its parameters are swapped, not set); on the meta device,
    # where the build falls back to, .to("cuda") copied out of a meta tensor
    spec = WorkloadSpec(model=f"tests.fixtures.named_cuda:{factory}")
    assert trace_step(spec, 8, device_type="cuda") == trace_step(ITS_OWN, 8, device_type="cuda")


def test_nvtx_ranges_mark_nothing_in_a_trace_for_cuda_on_a_build_without_them() -> None:
    # "NVTX functions not installed. Are you sure you have a CUDA build?": no plan before
    marked = WorkloadSpec(model="tests.fixtures.named_cuda:MarksRanges")
    assert trace_step(marked, 8, device_type="cuda") == trace_step(ITS_OWN, 8, device_type="cuda")
    stub = getattr(torch.cuda.nvtx, "_NVTXStub", None)  # a build without NVTX: torch's stub,
    if stub is not None and isinstance(torch.cuda.nvtx._nvtx, stub):  # as the trace found it
        with pytest.raises(RuntimeError, match="NVTX functions not installed"):
            torch.cuda.nvtx.range_push("after")
        with unmarked_ranges():
            assert torch.cuda.nvtx.range_push("inside") == 0


def test_a_cpu_trace_of_it_stops_as_a_cpu_trial_does() -> None:
    with pytest.raises(TraceError):
        trace_step(NAMES, 8)


def test_torch_compiles_rules_for_torchs_functions_are_built_with_torchs_own() -> None:
    # torch._dynamo builds its map of torch's functions once, as it is imported: imported
    # first under the stand-ins (a plan's meta build), it held them, and two stand-ins of one
    # object failed its import ("Duplicate torch object"). Fresh process: dynamo not imported.
    import subprocess
    import sys

    code = (
        "import torch\n"
        "from autotune.runner.fake_device import cuda_stand_ins\n"
        "with cuda_stand_ins():\n"
        "    import torch._dynamo\n"
        "from torch._dynamo.trace_rules import get_torch_obj_rule_map\n"
        "rules = get_torch_obj_rule_map()\n"
        "assert torch.cuda.set_device in rules and torch.cuda.synchronize in rules\n"
        "assert torch.cuda.current_device in rules\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


def test_torch_compiles_rules_are_built_again_with_torchs_own_after_a_group_cleared_them() -> None:
    # a process group's start clears dynamo's map (torch's init_process_group); the next compile
    # under the stand-ins built it with them: "Duplicate torch object <function _nothing>", a
    # model compiling its blocks could not be traced after any test that started a group
    from torch._dynamo.trace_rules import clear_lru_cache, get_torch_obj_rule_map

    own = (torch.cuda.set_device, torch.cuda.synchronize, torch.cuda.current_device)
    own += (torch.cuda.current_stream, torch.cuda.get_rng_state)
    clear_lru_cache()  # as init_process_group does
    with cuda_stand_ins():
        rules = get_torch_obj_rule_map()
    assert all(f in rules for f in own)


def test_code_overlapping_timing_and_recomputing_on_its_gpu_traces_as_its_twin() -> None:
    # before: "Tried to instantiate dummy base class Stream", "Cannot get CUDA generator without
    # ATen_cuda library", "Torch not compiled with CUDA enabled" (get_rng_state)
    def traced(model: str) -> object:
        spec = WorkloadSpec(model=f"tests.fixtures.asks_gpu:{model}")
        return replace(trace_step(spec, 8, device_type="cuda"), cuda_asked=())

    assert traced("OverlapsAndTimes") == traced("Attends")


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine with a CUDA device")
def test_what_a_gpu_would_do_is_done_by_nothing_and_then_torchs_own_again() -> None:
    own = (torch.Generator, torch.cuda.Stream, torch.cuda.get_rng_state, torch.Tensor.record_stream)
    with cuda_stand_ins(), CudaOnCpu():
        generator = torch.Generator(device="cuda").manual_seed(0)
        assert isinstance(generator, torch.Generator) and generator.device.type == "cpu"
        assert torch.Generator().device.type == "cpu"
        drawn = torch.randn(3, device="cuda", generator=generator)
        assert drawn.device.type == "cpu"
        state = torch.cuda.get_rng_state()
        assert (state.dtype, state.numel()) == (torch.uint8, 16)  # CUDA's: seed and offset
        torch.cuda.random.set_rng_state(state)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        drawn.record_stream(stream)
        event = stream.record_event()
        assert event.query() and event.elapsed_time(event) == 0.0
    after = (torch.Generator, torch.cuda.Stream, torch.cuda.get_rng_state)
    assert (*after, torch.Tensor.record_stream) == own
    with pytest.raises((RuntimeError, AssertionError)):
        torch.cuda.get_rng_state()


def test_the_wrapped_factories_leave_torchs_device_contexts_their_own() -> None:
    # torch.device's context knows its factories by a set built once (torch.utils._device,
    # private): built while they were wrapped, every later `with torch.device("meta")` made
    # its tensors on the CPU (the meta builds of eight tests failed)
    import torch.utils._device as device_context

    from autotune.runner.fake_device import indexed_devices

    device_context._device_constructors.cache_clear()  # as in a fresh process
    x = torch.ones(2)
    with indexed_devices():
        assert torch.zeros(2, device=0).device.type == "cpu"  # an index: the trace's device
        assert x.new_ones(2, device="cuda").device.type == "cpu"
        with torch.device("meta"):
            assert torch.zeros(2).device.type == "meta"
    with torch.device("meta"):
        assert torch.zeros(2).device.type == "meta"
    assert torch.zeros in device_context._device_constructors()
