"""The optimizer stepped after backward and in backward (``optimizer_in_backward``) side by side
on one model, with nothing or every block checkpointed: the tensors' peak of a real step, the
same step traced under fake tensors (what a plan predicts), and the step's time in interleaved
rounds, paired round by round so that the machine's drift falls on both alike. On a CUDA
machine (``device="cuda"``) the steps run there under ``amp``'s autocast, timed between
synchronisations, and the trace is for this GPU."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from autotune.bench.checkpoint_policies import (
    RealAndTraced,
    built,
    interleaved_times,
    round_ratios,
)
from autotune.bench.traced_step import output_loss, real_step_peak
from autotune.runner.workload import WorkloadSpec


@dataclass(frozen=True)
class StepRow(RealAndTraced):
    """One model's step with its optimizer stepped after backward or in it."""

    model: str
    in_backward: bool
    segments: int
    micro_batch: int
    real_bytes: int
    traced_bytes: int
    step_s: float
    """The median over rounds of a round's mean step (forward, backward, AdamW's step)."""
    rounds_s: tuple[float, ...]
    device: str = "cpu"
    amp: str = "off"


def measure(
    spec: WorkloadSpec,
    micro_batch: int,
    checkpoint: bool,
    rounds: int = 5,
    steps: int = 3,
    device: str = "cpu",
    amp: str = "off",
) -> list[StepRow]:
    """``spec``'s model at ``micro_batch`` (every block checkpointed in full where
    ``checkpoint``), AdamW stepped after backward and in it, on ``device`` under ``amp`` ("off"
    or "bf16"): peaks, and time over ``rounds`` interleaved rounds of ``steps`` steps after one
    warm step."""
    import torch

    from autotune.runner.fake_memory import trace_step  # imports torch
    from autotune.runner.in_backward import InBackward  # imports torch

    policy = "full" if checkpoint else "none"
    made = {flag: built(spec, micro_batch, policy, device) for flag in (False, True)}
    optimizers = {f: torch.optim.AdamW(m.parameters(), lr=1e-4) for f, (m, _, _) in made.items()}
    in_backward = InBackward(optimizers[True])

    def step(flag: bool) -> None:
        model, batch, _ = made[flag]
        with torch.autocast(device, torch.bfloat16, enabled=amp == "bf16"):
            loss = output_loss(model(**batch))
        loss.backward()
        if not flag:  # else each parameter stepped as backward reached it
            optimizers[flag].step()
            optimizers[flag].zero_grad(set_to_none=True)

    times = interleaved_times(step, list(made), rounds, steps, device == "cuda")
    in_backward.remove()  # real_step_peak steps its own
    rows = []
    for flag, (model, batch, blocks) in made.items():
        segments = blocks if checkpoint else 0
        real = real_step_peak(model, **batch, amp=amp, in_backward=flag)
        traced = trace_step(
            spec, micro_batch, amp, segments, device_type=device, optimizer_in_backward=flag
        )
        rows.append(
            StepRow(
                spec.model,
                flag,
                segments,
                micro_batch,
                real,
                traced.total_bytes,
                statistics.median(times[flag]),
                tuple(round(t, 4) for t in times[flag]),
                device,
                amp,
            )
        )
    return rows


def paired_ratio(rows: list[StepRow]) -> tuple[float, float, float]:
    """(median, least, most) over rounds of the step time in backward over after it, each
    round's against the same round's."""
    by = {r.in_backward: r.rounds_s for r in rows}
    return round_ratios(by[True], by[False])
