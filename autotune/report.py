"""Readable summaries of results for the terminal."""

from __future__ import annotations

from autotune.result import TrialResult
from autotune.units import format_bytes


def format_trial(result: TrialResult) -> str:
    """A few aligned lines describing one trial; the JSON record holds everything else."""
    config = result.config
    lines = [f"trial {result.status}  {config.summary()}"]
    if not result.ok:
        lines.append(f"  reason        {result.message}")
    else:
        assert result.samples_per_s is not None and result.step_time_median_s is not None
        assert result.step_time_p10_s is not None and result.step_time_p90_s is not None
        lines += [
            f"  throughput    {result.samples_per_s:,.1f} samples/s "
            f"(global batch {config.global_batch_size}, micro-batch {config.micro_batch_size})",
            f"  step time     median {result.step_time_median_s * 1e3:.1f} ms, "
            f"p10-p90 {result.step_time_p10_s * 1e3:.1f}-{result.step_time_p90_s * 1e3:.1f} ms "
            f"(spread {result.step_time_spread:.0%}) over {result.measured_steps} steps",
            f"  data wait     {result.data_wait_share:.1%} of measured time",
            f"  peak memory   {format_bytes(result.peak_memory_bytes or 0)} per rank "
            f"(largest of {len(result.ranks)}; {_memory_kind(result)})",
            f"  loss          {'finite' if result.loss_finite else 'NOT FINITE'} "
            f"({_loss_trend(result)})",
        ]
    lines.append(
        f"  time          {result.total_s:.1f} s: overhead {result.overhead_s:.1f} s (launch "
        f"{result.launch_s:.1f}, start-up {result.startup_s:.1f}, build {result.build_s:.1f}), "
        f"warm-up {result.warmup_s:.2f} s, measured {result.measured_s:.2f} s"
    )
    if result.platform is not None:
        p = result.platform
        lines.append(
            f"  platform      {p.device_name} ({p.device_type}), torch {p.torch_version}, "
            f"{p.backend}"
        )
    return "\n".join(lines)


def _memory_kind(result: TrialResult) -> str:
    if result.platform is not None and result.platform.device_type == "cuda":
        return "CUDA allocator peak"
    return "resident high-water mark incl. DataLoader workers"


def _loss_trend(result: TrialResult) -> str:
    losses = result.ranks[0].losses if result.ranks else []
    if not losses:
        return "no steps"
    return f"first {losses[0]:.4g}, last {losses[-1]:.4g}"
