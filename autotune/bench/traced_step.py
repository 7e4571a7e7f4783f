"""A traced step against a real one: the tensors' peak of a real training step, the truth the
fake-tensor traces (``autotune.runner.fake_memory.trace_step``) are held to, by the tests and
by ``scripts/bench_trace_families.py``."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from autotune.runner.planned_gpu import GPUS, planning
from autotune.runner.workload import WorkloadSpec, load_dataset, load_model, put_on_path


def output_loss(output: Any) -> Any:
    """The loss a benchmark's step backpropagates from a model's output: its "loss" (a dict's
    entry, or an attribute), else the mean square of the output."""
    if isinstance(output, dict):
        return output["loss"]
    return output.loss if hasattr(output, "loss") else output.square().mean()


def real_step_peak(
    model: object,
    *args: object,
    optimizer: str = "AdamW",
    amp: str = "off",
    above: Callable[[], AbstractContextManager[object]] = contextlib.nullcontext,
    in_backward: bool = False,
    **kwargs: object,
) -> int:
    """The tensors' peak of a real second training step (AdamW, or ``optimizer``: a class of
    ``torch.optim``; ``amp``: "off" or "bf16" autocast; ``in_backward``: stepped in backward,
    ``runner.in_backward``) on the model's device, as MemTracker counts it: what a traced step
    is checked against. ``above`` makes a context entered inside the tracker for each step: a
    dispatch mode whose ops the tracker sees (FlexAttention's dense kernels,
    ``fake_flex.CudaFlexAttention``)."""
    import torch

    from autotune.runner.fake_bias import causal_biases  # imports torch
    from autotune.runner.fake_memory import _peak_tracker  # imports torch
    from autotune.runner.in_backward import InBackward  # imports torch

    assert isinstance(model, torch.nn.Module)
    device = next(model.parameters()).device
    stepper = getattr(torch.optim, optimizer)(model.parameters(), lr=0.01)
    stepped = InBackward(stepper) if in_backward else None

    def step() -> None:
        # the loss under autocast too, as a trial computes it (CUDA's runs pow in float32)
        with torch.autocast(device.type, torch.bfloat16, enabled=amp == "bf16"):
            out = model(*args, **kwargs)
            loss = output_loss(out)
        loss.backward()  # the output held through it, as a trial's step holds it
        if stepped is None:
            stepper.step()
            stepper.zero_grad(set_to_none=True)

    with above():
        step()  # the optimizer's state exists from here on
    tracker = _peak_tracker()  # MemTracker, which refuses a frozen parameter (Whisper's)
    tracker.track_external(model, *(stepped.optimizers() if stepped else [stepper]))
    with tracker, above(), causal_biases():  # built beneath the tracker, as outside it
        step()
    peaks = tracker.get_tracker_snapshot("peak")
    return int(max(p["Total"] for d, p in peaks.items() if d.type == device.type))


def built_batch(spec: WorkloadSpec, micro_batch: int) -> tuple[Any, Any]:
    """``spec``'s model, built again (every layer run: LayerDrop off, as the trace takes it),
    and the batch of its dataset's first ``micro_batch`` samples, collated by torch's default."""
    from torch.utils.data import default_collate

    put_on_path(spec)
    module, model = load_model(spec.model)
    config = getattr(model, "config", None)
    if getattr(config, "layerdrop", 0.0):
        config.layerdrop = 0.0  # type: ignore[union-attr]
    dataset = load_dataset(spec, module, model)[0]  # --data, else the module's
    return model, default_collate([dataset[i] for i in range(micro_batch)])


def batch_peak(model: Any, batch: Any, optimizer: str = "AdamW", in_backward: bool = False) -> int:
    """``real_step_peak`` of ``model`` in training mode on ``batch``, passed as keyword
    arguments (a dict batch) or in order."""
    model.train()
    if isinstance(batch, dict):
        return real_step_peak(model, **batch, optimizer=optimizer, in_backward=in_backward)
    return real_step_peak(model, *batch, optimizer=optimizer, in_backward=in_backward)


def checkpoint_all(model: Any, batch: Any, policy: str) -> int:
    """Checkpoint every checkpointing unit of ``model`` under ``policy``, its loops counted on
    ``batch`` as a rank counts them; return how many there are (0: none to checkpoint)."""
    from autotune.runner.checkpointing import (  # imports torch
        apply_checkpointing,
        checkpoint_units,
    )
    from autotune.runner.training import loop_calls  # imports torch

    calls = loop_calls(model, batch)
    units = checkpoint_units(model, calls).count
    apply_checkpointing(model, units, calls, policy)
    return units


def real_batch_peak(
    spec: WorkloadSpec, micro_batch: int, optimizer: str = "AdamW", checkpoint: str | None = None
) -> int:
    """``batch_peak`` of ``spec``'s model with ``optimizer`` on its batch (``built_batch``);
    ``checkpoint`` ("full", "selective"): every checkpointing unit checkpointed under that
    policy first (``checkpoint_all``)."""
    model, batch = built_batch(spec, micro_batch)
    if checkpoint is not None:
        checkpoint_all(model, batch, checkpoint)
    return batch_peak(model, batch, optimizer)


@dataclass(frozen=True)
class Checked:
    """One model's traced step beside a real one, or why it could not be traced."""

    model: str
    traced_bytes: int | None
    real_bytes: int | None
    seconds: float
    stop: str = ""  # the trace's one line, where it stopped
    cuda: int | None = None  # the same step traced for a CUDA device (its fused attention)

    @property
    def error(self) -> float | None:
        if self.traced_bytes is None or not self.real_bytes:
            return None
        return (self.traced_bytes - self.real_bytes) / self.real_bytes


def check(
    spec: WorkloadSpec,
    micro_batch: int = 4,
    checkpoint: str | None = None,
    in_backward: bool = False,
) -> Checked:
    """``spec``'s step traced and run for real at ``micro_batch``; ``checkpoint`` ("full",
    "selective"): with every checkpointing unit checkpointed under that policy; ``in_backward``:
    the optimizer stepped in backward (``optimizer_in_backward``)."""
    from autotune.runner.fake_memory import TraceError, trace_step  # imports torch

    started = time.perf_counter()
    built = built_batch(spec, micro_batch) if checkpoint else None  # its units, before the trace
    segments = checkpoint_all(*built, checkpoint) if built and checkpoint else 0
    if checkpoint and not segments:
        return Checked(spec.model, None, None, time.perf_counter() - started, NO_UNITS)
    options: dict[str, Any] = {
        "checkpoint_policy": checkpoint or "full",
        "optimizer_in_backward": in_backward,
    }
    try:
        traced = trace_step(spec, micro_batch, "off", segments, **options)
    except TraceError as error:
        return Checked(spec.model, None, None, time.perf_counter() - started, str(error))
    real = batch_peak(*(built or built_batch(spec, micro_batch)), in_backward=in_backward)
    cuda = trace_step(spec, micro_batch, "off", segments, device_type="cuda", **options)
    seconds = time.perf_counter() - started
    return Checked(spec.model, traced.total_bytes, real, seconds, cuda=cuda.total_bytes)


NO_UNITS = "no block or looped layer to checkpoint"


def traced_for_gpus(
    spec: WorkloadSpec, micro_batch: int, amp: str, gpus: Sequence[str]
) -> dict[str, int | str]:
    """``spec``'s step traced for CUDA in ``amp`` as each of ``gpus`` (``planned_gpu.GPUS``'s
    names) would run it, its attention kernels and its answers to the model's code: the peak in
    bytes, or the one line a trace that stopped says."""
    from autotune.runner.fake_memory import TraceError, trace_step  # imports torch

    peaks: dict[str, int | str] = {}
    for gpu in gpus:
        with planning(GPUS[gpu]):
            try:
                peaks[gpu] = trace_step(spec, micro_batch, amp, device_type="cuda").total_bytes
            except TraceError as error:
                peaks[gpu] = str(error)
    return peaks


def as_row(checked: Checked) -> dict[str, Any]:
    return {
        "model": checked.model,
        "traced_bytes": checked.traced_bytes,
        "real_bytes": checked.real_bytes,
        "error": checked.error,
        "seconds": round(checked.seconds, 2),
        "stop": checked.stop,
        "traced_for_cuda_bytes": checked.cuda,
    }
