"""What a device holds beyond the traced tensors: a first guess before any trial (``prior_for``:
on CPU a rank of the workload measured without its tensors, on CUDA the caching allocator's
reserve), fitted to the trials that ran (``fit``), and how far a prediction may lie above the
truth (``Calibration.margin``). ``autotune.search.memory_model`` adds it to the tensors.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from autotune.runner.workload import WorkloadSpec

MIN_MARGIN = 0.10
"""The least share a prediction may lie above the truth before the search trusts it to skip a
trial. Only predicting high can skip a configuration that fits: one predicted low runs and
shows its peak."""
PRIOR_MARGIN = (0.50, 0.40)
"""The margin while too few trials have measured the prediction's error, by trials (0, 1).
After one trial: above the largest over-prediction after one trial that the CPU grids of
``scripts/bench_memory_prediction.py`` measured (31.7% over 260 configurations of 18 models;
37.2% with a prior scale of 1.0)."""
CPU_HEAP_SHARE = 0.1
"""What a CPU rank holds beyond its tensors, as a share of them: freed activations' heap pages
stay resident (glibc). The prior's scale on CPU is 1 + this, before any trial and as what a fit
is pulled towards. Chosen on the first 13 CPU grids of ``scripts/bench_memory_prediction.py``
(217 configurations: the first guess within +-10% in 96 against 87 without it) and held on the
5 grids run after (61: 32 against 22); never more than 4% over the measured peak on those 278.
After one trial, over the 278, it holds 219 within +-10% against 214 with a prior of 1.0, its
largest over-prediction 31.7% against 37.2%."""
CPU_FORKED_SHARE = 1.1
"""Of the tensors a CPU rank holds when it forks its DataLoader workers (``MemoryModel.forked``),
the share the workers keep old copies of, as the heap keeps them (``CPU_HEAP_SHARE``): the
prior's, until trials with workers measure it. Measured with one worker, one rank in fp32, a
worker's own 10 MiB aside: 0.76 (``gpt_small``, ``mlp_small``), 0.81 (``gpt_tiny``) and 1.47
(``resnet_small``) of the traced tensors (``scripts/bench_memory_prediction.py --grid workers``,
``results/memory_prediction_workers.json``, which also scores it)."""
CUDA_RESERVE_SHARE = 0.1
"""What the CUDA caching allocator reserves beyond the tensors, as a share of them: the prior's
scale on CUDA is 1 + this, before any trial and as what a fit is pulled towards. Measured: on an
H200 the reserved peak lay 11.6-40.6% over the traced tensors in all 12 configurations of
``gpt2_124m``'s bf16 grid (``results/gpu/h200_memory_prediction_gpt2_124m_bf16_rescored.json``;
the large ones 11.6-13.4%), and on an H100 GPT-2 small's fp32 baseline reserved 69.6 GiB over
62.7 allocated (11.0%). With the tensors alone that baseline, which ran and did not fit a 64.1
GiB limit, would be predicted to fit it; at x1.1 it is predicted not to, and the baseline starts
from an accumulation that fits. Never over the reserved peak measured so far, so it skips
nothing that fits."""
CUDA_PRIOR_MARGIN = (0.50, 0.50)
"""On CUDA one grid has measured it (an H200, ``gpt2_124m`` in bf16, 12 configurations,
``results/gpu/h200_memory_prediction_gpt2_124m_bf16_rescored.json``): the tensors alone lay
10-26% under the reserved peak (never over), and after one trial the prediction lay at most 3%
over it. One model in one precision is too little to narrow the margin on: it stays wide until
more grids have run (the trace runs on CPU kernels; cuBLAS workspaces and the allocator differ,
and fused attention is put in only where a model calls ``F.scaled_dot_product_attention``)."""


EPOCH_COPY_SAID = 16 * 2**20
"""The least a worker copies over an epoch that the recommendation's caveat says."""


@dataclass(frozen=True)
class Calibration:
    """``measured per device = scale * tensors + offset + workers * per_worker
    + forked_scale * forked + build_scale * unsharded + compiled * compile_bytes`` (bytes), where
    ``forked`` is what a CPU rank forks its DataLoader workers from (``MemoryModel.forked``),
    ``unsharded`` is, for FSDP on CPU, the whole model a rank builds before sharding it: freed,
    but its heap pages still held (``MemoryModel.unsharded``; a CUDA device never holds it
    whole), and ``compiled``
    is 1 for a ``torch.compile`` run: the trace is eager, and a compiled rank holds more (on CPU,
    Inductor's modules and caches: 145 MiB a rank in a search of a Hugging Face Mamba) or, its
    kernels fused, fewer intermediates; learnt from compiled trials, until one ran 0 on CUDA and
    on CPU what compiling a model too small to count added to a rank, measured (``prior_for``).
    On CPU the prior's scale holds the heap's share (``CPU_HEAP_SHARE``)."""

    scale: float = 1.0
    offset_bytes: int = 0
    per_worker_bytes: int = 0
    build_scale: float = 1.0
    trials: int = 0
    errors: tuple[float, ...] = ()  # leave-one-out relative errors over those trials
    prior_margin: tuple[float, float] = PRIOR_MARGIN  # before any trial, after one
    compile_bytes: int = 0
    compiled_trials: int = 0  # how many of the trials compiled: 0, and compile_bytes is a prior
    forked_scale: float = 0.0  # of the tensors forked DataLoader workers are left (forked_bytes)
    epoch_copy_bytes: int = 0
    """What a DataLoader worker copies of the dataset over an epoch (``runner.memory.
    epoch_copy_bytes``), measured beside the bare rank: never fitted, since a trial's few
    batches do not show it; the recommendation's caveat says it (``MemoryModel.caveats``)."""
    epoch_copy_whole: bool = True  # False: the walk stopped early, a lower bound

    @property
    def epoch_copy(self) -> str | None:
        """``epoch_copy_bytes`` in words ("about 72 MiB", "at least ..."); None where it is
        below what is worth saying (``EPOCH_COPY_SAID``)."""
        if self.epoch_copy_bytes < EPOCH_COPY_SAID:
            return None
        about = "about" if self.epoch_copy_whole else "at least"
        return f"{about} {self.epoch_copy_bytes / 2**20:,.0f} MiB"

    @property
    def margin(self) -> float:
        """How far above what a trial measures a prediction may lie: measured (leave one out)
        on the trials, a prior while they are too few to measure it."""
        if self.trials < len(self.prior_margin):
            return self.prior_margin[self.trials]
        return max(MIN_MARGIN, *(-e for e in self.errors))

    def describe(self) -> str:
        if not self.trials:
            if not self.offset_bytes:
                if self.scale == 1.0:
                    return "uncalibrated: the tensors alone until a trial measures the rest"
                return (
                    f"uncalibrated: x{self.scale:.2f} the tensors (the device allocator's "
                    "reserve) until a trial measures the rest"
                )
            compiled = (
                f" (+ {self.compile_bytes / 2**20:,.0f} MiB compiled, measured on a small model)"
                if self.compile_bytes
                else ""
            )
            worker = (
                f" + {self.per_worker_bytes / 2**20:,.0f} MiB per DataLoader worker, measured "
                f"beside it, and x{self.forked_scale:.2f} the tensors its workers are forked "
                "from"
                if self.per_worker_bytes
                else ""
            )
            return (
                f"uncalibrated: x{self.scale:.2f} the tensors + "
                f"{self.offset_bytes / 2**20:,.0f} MiB, a rank measured without them"
                f"{worker}{compiled}"
            )
        error = (
            f"error up to {max(abs(e) for e in self.errors):.0%}, at most {self.margin:.0%} high"
            if self.errors
            else f"error not measured yet (taken as up to {self.margin:.0%} high)"
        )
        compiled = (
            f" + {self.compile_bytes / 2**20:,.0f} MiB compiled" if self.compiled_trials else ""
        )
        return (
            f"calibrated on {self.trials} trial(s): x{self.scale:.2f} + "
            f"{self.offset_bytes / 2**20:,.0f} MiB + {self.per_worker_bytes / 2**20:,.0f} MiB "
            f"per DataLoader worker + x{self.forked_scale:.2f} the tensors workers are forked "
            f"from + x{self.build_scale:.1f} FSDP's unsharded build{compiled}, "
            f"{error}"
        )

    def apply(
        self,
        tensors_bytes: int,
        workers: int,
        unsharded_bytes: int = 0,
        compiled: bool = False,
        forked_bytes: int = 0,
    ) -> int:
        return int(
            self.scale * tensors_bytes
            + self.offset_bytes
            + self.workers_bytes(workers, forked_bytes)
            + self.build_scale * unsharded_bytes
            + (self.compile_bytes if compiled else 0)
        )

    def workers_bytes(self, workers: int, forked_bytes: int) -> int:
        """What ``workers`` DataLoader workers add: each its own pages, and together the old
        copies of the pages the rank writes after forking them (``MemoryModel.forked``)."""
        return int(workers * self.per_worker_bytes + self.forked_scale * forked_bytes)


@dataclass(frozen=True)
class Point:
    """One trial that ran: its tensors as traced, its workers, FSDP's unsharded build, and what
    one device measured."""

    tensors_bytes: int
    workers: int
    measured_bytes: int
    unsharded_bytes: int = 0
    compiled: bool = False
    forked_bytes: int = 0  # what forking its workers may leave to them (MemoryModel.forked)


def fit(points: Sequence[Point], prior: Calibration) -> Calibration:
    """The calibration that best explains ``points``, ridge-pulled towards ``prior`` where the
    points cannot tell its parts apart (one point, no worker variety, no FSDP trial), each
    coefficient kept within what is physical."""
    if not points:
        return prior
    errors: list[float] = []
    if len(points) >= 2:
        for i, left_out in enumerate(points):
            held = _solve([p for j, p in enumerate(points) if j != i], prior)
            predicted = held.apply(
                left_out.tensors_bytes,
                left_out.workers,
                left_out.unsharded_bytes,
                left_out.compiled,
                left_out.forked_bytes,
            )
            errors.append((left_out.measured_bytes - predicted) / left_out.measured_bytes)
    solved = _solve(points, prior)
    return replace(
        solved,
        trials=len(points),
        errors=tuple(errors),
        prior_margin=prior.prior_margin,
        compiled_trials=sum(p.compiled for p in points),
    )


_GIB = float(2**30)
_RIDGE = (2e-3, 1e-2, 2e-3, 1e-5, 1e-4, 1e-4)
"""Pull towards the prior of (scale, per-worker GiB, build scale, offset GiB, compiled GiB,
forked scale): weak enough that a few trials of different kinds decide, strong enough to settle
what they cannot (no compiled trial: the compiled part stays the prior's). A worker's own pages
are held closer to what was measured beside the bare rank: one trial with a worker cannot tell
them from what its rank forked it from, and pulled as weakly, they took all of it (a second
worker then predicted as costly as the first)."""
_BOUNDS = ((0.8, 3.0), (0.0, 8.0), (0.0, 8.0), (-8.0, 64.0), (-64.0, 64.0), (0.0, 2.0))
"""Physical ranges of those coefficients (per-worker, offset and compiled in GiB)."""


def _solve(points: Sequence[Point], prior: Calibration) -> Calibration:
    """Ridge least squares; a coefficient that leaves its range is fixed at the bound and the
    others solved again (so a fit that wanted a negative scale does not keep the offset that
    went with it)."""
    import numpy as np

    x = np.array(
        [
            [
                p.tensors_bytes / _GIB,
                p.workers,
                p.unsharded_bytes / _GIB,
                1.0,
                float(p.compiled),
                p.forked_bytes / _GIB,
            ]
            for p in points
        ]
    )
    y = np.array([p.measured_bytes / _GIB for p in points])
    theta0 = np.array(
        [
            prior.scale,
            prior.per_worker_bytes / _GIB,
            prior.build_scale,
            prior.offset_bytes / _GIB,
            prior.compile_bytes / _GIB,
            prior.forked_scale,
        ]
    )
    fixed: dict[int, float] = {}
    for _ in range(len(_BOUNDS)):
        free = [i for i in range(len(_BOUNDS)) if i not in fixed]
        rest = y - sum((x[:, i] * v for i, v in fixed.items()), np.zeros_like(y))
        xf, ridge = x[:, free], np.diag([_RIDGE[i] for i in free])
        solved = np.linalg.solve(xf.T @ xf + ridge, xf.T @ rest + ridge @ theta0[free])
        theta = dict(zip(free, solved.tolist(), strict=True)) | fixed
        outside = {
            i: min(max(v, _BOUNDS[i][0]), _BOUNDS[i][1])
            for i, v in theta.items()
            if i not in fixed and not _BOUNDS[i][0] <= v <= _BOUNDS[i][1]
        }
        if not outside:
            break
        fixed |= outside
    return Calibration(
        scale=theta[0],
        per_worker_bytes=int(theta[1] * _GIB),
        build_scale=theta[2],
        offset_bytes=int(theta[3] * _GIB),
        compile_bytes=int(theta[4] * _GIB),
        forked_scale=theta[5],
    )


def start_prior(
    device_type: str,
    workload: WorkloadSpec | None = None,
    rank_imports: tuple[str, ...] = (),
    compiled: bool = False,
) -> None:
    """Begin what ``prior_for`` measures (on CPU, a rank process: seconds), so that what the
    caller does meanwhile overlaps it."""
    if device_type != "cuda":
        from autotune.runner.memory import start_bare_rank  # imports torch

        spec = workload.model_dump_json() if workload is not None else ""
        start_bare_rank(spec, rank_imports, compiled)


def prior_for(
    device_type: str,
    workload: WorkloadSpec | None = None,
    rank_imports: tuple[str, ...] = (),
    compiled: bool = False,
) -> Calibration:
    """The first guess before any trial: on CUDA the tensors and the caching allocator's reserve
    (``CUDA_RESERVE_SHARE``; trials measure the rest); on CPU the tensors plus a rank process
    without its tensors, measured: with ``workload``'s imports, model on the meta device,
    dataset and loss, and the executor's ``rank_imports`` (``ray`` for a Ray worker), and what
    one DataLoader worker over that dataset holds beside it, and what one copies of that dataset
    over an epoch (a caveat, never fitted). With
    ``compiled`` (configurations to predict compile), on CPU also what ``torch.compile`` adds to
    a rank, measured on a model too small to count (``runner.memory.compile_share_bytes``): the
    compiled part until a compiled trial teaches it. On CUDA compiling can also take tensors
    away (fused kernels): nothing is assumed there."""
    if device_type == "cuda":
        return Calibration(scale=1.0 + CUDA_RESERVE_SHARE, prior_margin=CUDA_PRIOR_MARGIN)
    from autotune.runner.memory import (  # imports torch
        bare_rank_bytes,
        compile_share_bytes,
        epoch_copy,
        worker_share_bytes,
    )

    spec = workload.model_dump_json() if workload is not None else ""
    offset = bare_rank_bytes(spec, rank_imports)
    share = compile_share_bytes(spec, rank_imports) if compiled else 0
    copied, whole = epoch_copy(spec, rank_imports)
    return Calibration(
        scale=1.0 + CPU_HEAP_SHARE,
        offset_bytes=offset,
        per_worker_bytes=worker_share_bytes(spec, rank_imports),
        compile_bytes=share,
        forked_scale=CPU_FORKED_SHARE,
        epoch_copy_bytes=copied,
        epoch_copy_whole=whole,
    )
