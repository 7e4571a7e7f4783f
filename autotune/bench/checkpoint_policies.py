"""Activation checkpointing's policies side by side on one model: nothing checkpointed, every
block checkpointed in full, every block checkpointed selectively (``checkpoint_policy``). For
each, the tensors' peak of a real step, the same step traced under fake tensors (what a plan
predicts), the step traced for a CUDA GPU in bf16 (a prediction only: no GPU here), and the
time a real step takes, measured in interleaved rounds so that the machine's drift falls on
every policy alike. On a CUDA machine (``device="cuda"``) the steps run there, under
``amp``'s autocast, timed between synchronisations, and the trace is for this GPU."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

from autotune.bench.traced_step import built_batch, output_loss, real_step_peak
from autotune.runner.planned_gpu import GPUS, planning
from autotune.runner.workload import WorkloadSpec

POLICIES = ("none", "full", "selective")

K = TypeVar("K")


class RealAndTraced:
    """A row's real peak beside its traced one (the fields of a dataclass deriving it)."""

    real_bytes: int
    traced_bytes: int

    @property
    def trace_error(self) -> float:
        return (self.traced_bytes - self.real_bytes) / self.real_bytes

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "trace_error": self.trace_error}  # type: ignore[call-overload]


@dataclass(frozen=True)
class PolicyRow(RealAndTraced):
    """One policy of one model."""

    model: str
    policy: str
    segments: int
    micro_batch: int
    real_bytes: int
    traced_bytes: int
    cuda_bf16_bytes: int | None
    """On a CPU, the step traced for ``gpu`` in bf16 autocast: a prediction (None on CUDA,
    where ``traced_bytes`` is this GPU's)."""
    gpu: str
    device: str
    amp: str
    step_s: float
    """The median over rounds of a round's mean step (forward, backward, AdamW's step)."""
    rounds_s: tuple[float, ...]


def _segments_and_policy(policy: str, blocks: int) -> tuple[int, str]:
    return (0, "full") if policy == "none" else (blocks, policy)


def built(
    spec: WorkloadSpec, micro_batch: int, policy: str, device: str
) -> tuple[Any, dict[str, Any], int]:
    """``spec``'s model checkpointed as ``policy`` says (every block, or none), seeded alike, on
    ``device``, its batch of the dataset's first ``micro_batch`` samples as keyword arguments
    there, and its blocks."""
    import torch

    from autotune.runner.checkpointing import apply_checkpointing, checkpoint_units  # imports torch

    torch.manual_seed(0)
    model, batch = built_batch(spec, micro_batch)
    if isinstance(batch, dict):
        batch = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
    else:
        raise ValueError(f"{spec.model}: this benchmark takes models fed dict batches")
    blocks = checkpoint_units(model).count
    segments, how = _segments_and_policy(policy, blocks)
    apply_checkpointing(model, segments, policy=how)
    model.to(device).train()
    return model, batch, blocks


def measure(
    spec: WorkloadSpec,
    micro_batch: int,
    rounds: int = 5,
    steps: int = 3,
    gpu: str = "h100",
    device: str = "cpu",
    amp: str = "off",
) -> list[PolicyRow]:
    """Every policy of ``POLICIES`` on ``spec``'s model at ``micro_batch`` on ``device`` under
    ``amp`` ("off" or "bf16"): its peaks, and its step's time over ``rounds`` interleaved rounds
    of ``steps`` steps (after one warm step)."""
    import torch

    from autotune.runner.fake_memory import TraceError, trace_step  # imports torch

    made = {policy: built(spec, micro_batch, policy, device) for policy in POLICIES}
    cuda = device == "cuda"
    optimizers = {p: torch.optim.AdamW(m.parameters(), lr=1e-4) for p, (m, _, _) in made.items()}

    def step(policy: str) -> None:
        model, batch, _ = made[policy]
        with torch.autocast(device, torch.bfloat16, enabled=amp == "bf16"):
            loss = output_loss(model(**batch))
        loss.backward()
        optimizers[policy].step()
        optimizers[policy].zero_grad(set_to_none=True)

    times = interleaved_times(step, POLICIES, rounds, steps, cuda)
    rows = []
    for policy in POLICIES:
        model, batch, blocks = made[policy]
        segments, how = _segments_and_policy(policy, blocks)
        real = real_step_peak(model, **batch, amp=amp)
        traced = trace_step(
            spec, micro_batch, amp, segments, device_type=device, checkpoint_policy=how
        )
        planned: int | None = None
        if not cuda:  # a prediction for a GPU this machine lacks
            with planning(GPUS[gpu]):
                try:
                    planned = trace_step(
                        spec,
                        micro_batch,
                        "bf16",
                        segments,
                        device_type="cuda",
                        checkpoint_policy=how,
                    ).total_bytes
                except TraceError:
                    planned = None
        rows.append(
            PolicyRow(
                spec.model,
                policy,
                segments,
                micro_batch,
                real,
                traced.total_bytes,
                planned,
                gpu,
                device,
                amp,
                statistics.median(times[policy]),
                tuple(round(t, 4) for t in times[policy]),
            )
        )
    return rows


def interleaved_times(
    step: Callable[[K], None], keys: Sequence[K], rounds: int, steps: int, cuda: bool
) -> dict[K, list[float]]:
    """Each key's mean ``step`` time in each of ``rounds`` rounds of ``steps`` steps, the keys
    in turn within a round (the machine's drift falls on all alike), after one warm step each
    (the optimizer's state, the allocator's pools); timed between synchronisations on CUDA."""
    import torch

    for key in keys:
        step(key)
    times: dict[K, list[float]] = {key: [] for key in keys}
    for _ in range(rounds):
        for key in keys:
            if cuda:
                torch.cuda.synchronize()
            started = time.perf_counter()
            for _ in range(steps):
                step(key)
            if cuda:
                torch.cuda.synchronize()
            times[key].append((time.perf_counter() - started) / steps)
    return times


def paired_ratio(rows: list[PolicyRow], policy: str, against: str) -> tuple[float, float, float]:
    """(median, least, most) over rounds of ``policy``'s step time over ``against``'s, each
    round's against the same round's: the ratio the drift between rounds does not move."""
    by = {r.policy: r.rounds_s for r in rows}
    return round_ratios(by[policy], by[against])


def round_ratios(ours: tuple[float, ...], theirs: tuple[float, ...]) -> tuple[float, float, float]:
    """(median, least, most) of ``ours`` over ``theirs``, round by round."""
    ratios = [a / b for a, b in zip(ours, theirs, strict=True)]
    return statistics.median(ratios), min(ratios), max(ratios)
