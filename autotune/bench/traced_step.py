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


def real_step_peak(
    model: object,
    *args: object,
    optimizer: str = "AdamW",
    amp: str = "off",
    above: Callable[[], AbstractContextManager[object]] = contextlib.nullcontext,
    **kwargs: object,
) -> int:
    """The tensors' peak of a real second training step (AdamW, or ``optimizer``: a class of
    ``torch.optim``; ``amp``: "off" or "bf16" autocast) on the model's device, as MemTracker
    counts it: what a traced step is checked against. ``above`` makes a context entered inside
    the tracker for each step: a dispatch mode whose ops the tracker sees (FlexAttention's dense
    kernels, ``fake_flex.CudaFlexAttention``)."""
    import torch

    from autotune.runner.fake_bias import causal_biases  # imports torch
    from autotune.runner.fake_memory import _peak_tracker  # imports torch

    assert isinstance(model, torch.nn.Module)
    device = next(model.parameters()).device
    stepper = getattr(torch.optim, optimizer)(model.parameters(), lr=0.01)

    def step() -> None:
        # the loss under autocast too, as a trial computes it (CUDA's runs pow in float32)
        with torch.autocast(device.type, torch.bfloat16, enabled=amp == "bf16"):
            out = model(*args, **kwargs)
            if isinstance(out, dict):
                loss = out["loss"]
            else:
                loss = out.loss if hasattr(out, "loss") else out.square().mean()
        loss.backward()  # the output held through it, as a trial's step holds it
        stepper.step()
        stepper.zero_grad(set_to_none=True)

    with above():
        step()  # the optimizer's state exists from here on
    tracker = _peak_tracker()  # MemTracker, which refuses a frozen parameter (Whisper's)
    tracker.track_external(model, stepper)
    with tracker, above(), causal_biases():  # built beneath the tracker, as outside it
        step()
    peaks = tracker.get_tracker_snapshot("peak")
    return int(max(p["Total"] for d, p in peaks.items() if d.type == device.type))


def real_batch_peak(
    spec: WorkloadSpec, micro_batch: int, optimizer: str = "AdamW", checkpoint: str | None = None
) -> int:
    """``real_step_peak`` of ``spec``'s model (built again, in training mode, every layer run:
    LayerDrop off, as the trace takes it) with ``optimizer`` on the batch of its dataset's first
    ``micro_batch`` samples, collated by torch's default, passed as keyword arguments (a dict
    batch) or in order; ``checkpoint`` ("full", "selective"): every checkpointing unit
    (``checkpointed_units``) checkpointed under that policy first."""
    from torch.utils.data import default_collate

    from autotune.runner.checkpointing import apply_checkpointing  # imports torch
    from autotune.runner.training import loop_calls  # imports torch

    put_on_path(spec)
    module, model = load_model(spec.model)
    config = getattr(model, "config", None)
    if getattr(config, "layerdrop", 0.0):
        config.layerdrop = 0.0  # type: ignore[union-attr]
    dataset = load_dataset(spec, module, model)[0]  # --data, else the module's
    batch = default_collate([dataset[i] for i in range(micro_batch)])
    if checkpoint is not None:
        calls = loop_calls(model, batch)
        apply_checkpointing(model, _units(model, calls), calls, checkpoint)
    model.train()
    if isinstance(batch, dict):
        return real_step_peak(model, **batch, optimizer=optimizer)
    return real_step_peak(model, *batch, optimizer=optimizer)


def _units(model: Any, calls: Any) -> int:
    from autotune.runner.checkpointing import checkpoint_units  # imports torch

    return checkpoint_units(model, calls).count


def checkpointed_units(spec: WorkloadSpec, micro_batch: int) -> int:
    """How many checkpointing units ``spec``'s model has, its loops counted on its batch of
    ``micro_batch`` samples, as a rank counts them."""
    from torch.utils.data import default_collate

    from autotune.runner.training import loop_calls  # imports torch

    put_on_path(spec)
    module, model = load_model(spec.model)
    dataset = load_dataset(spec, module, model)[0]
    batch = default_collate([dataset[i] for i in range(micro_batch)])
    return _units(model, loop_calls(model, batch))


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


def check(spec: WorkloadSpec, micro_batch: int = 4, checkpoint: str | None = None) -> Checked:
    """``spec``'s step traced and run for real at ``micro_batch``; ``checkpoint`` ("full",
    "selective"): with every checkpointing unit checkpointed under that policy."""
    from autotune.runner.fake_memory import TraceError, trace_step  # imports torch

    started = time.perf_counter()
    segments = checkpointed_units(spec, micro_batch) if checkpoint else 0
    if checkpoint and not segments:
        return Checked(spec.model, None, None, time.perf_counter() - started, NO_UNITS)
    policy = checkpoint or "full"
    try:
        traced = trace_step(spec, micro_batch, "off", segments, checkpoint_policy=policy)
    except TraceError as error:
        return Checked(spec.model, None, None, time.perf_counter() - started, str(error))
    real = real_batch_peak(spec, micro_batch, checkpoint=checkpoint)
    cuda = trace_step(
        spec, micro_batch, "off", segments, device_type="cuda", checkpoint_policy=policy
    ).total_bytes
    return Checked(spec.model, traced.total_bytes, real, time.perf_counter() - started, cuda=cuda)


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
