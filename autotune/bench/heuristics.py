"""Today's rules of thumb, implemented from their documented behaviour, over autotune's knobs.

Both take ``measure(config) -> Measured`` so they run the same live (real trials) and on a
recorded landscape. With the global batch fixed, a micro-batch size is a choice of
accumulation steps: micro-batch = global batch / (devices x accumulation).

* ``batch_size_finder``: Lightning's ``Tuner.scale_batch_size`` (mode "power") and Accelerate's
  ``find_executable_batch_size``: the largest micro-batch that fits, found by doubling from the
  smallest until one does not fit; AMP on where the hardware has it, DDP across the devices,
  everything else at its default. It never compares speeds.
* ``deepspeed_rule``: DeepSpeed's autotuner (fast mode): sharding stages tried in order from
  none to full (stage 0 -> DDP, stage 3 -> FSDP here, which has no stage 1/2), per stage the
  largest micro-batch that fits by binary search, then the throughput of the largest few
  micro-batches measured; the next stage is kept only if it gains at least 5%, else the
  search stops. AMP as the user's config has it, taken to be on where available.
* ``standard_recipe``: the configuration a skilled engineer writes by hand
  (``autotune.search.recipe``): bf16 (else fp16) autocast, compile, DDP over every device, the
  optimizer's fused form, workers ``min(4, cores per rank)``; by hand, the largest micro-batch
  that fits is found by trying from the largest down (FSDP when DDP fits at none). It never
  compares speeds either.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from autotune.bench.landscape import Measure, Measured
from autotune.config import TrainConfig
from autotune.records import Value
from autotune.runner.platform import AUTOCASTS
from autotune.search.recipe import recipe_amp, recipe_candidates, recipe_values
from autotune.search.space import SearchSpace

STAGE_GAIN = 0.05  # DeepSpeed moves on to the next stage only for at least this gain
TUNED_MICRO_BATCHES = 3  # micro-batch sizes DeepSpeed measures per stage, largest first


def amp_where_available(amp_choices: Sequence[Value]) -> str:
    """bf16 where the platform has it (the space keeps it only then), else fp16, else off:
    the batch-size finders' rule, which does not ask whether the device emulates it."""
    return recipe_amp(amp_choices, AUTOCASTS)


class _Memo:
    """Measure each configuration once; later asks get the same measurement."""

    def __init__(self, measure: Measure) -> None:
        self.measure = measure
        self.seen: dict[str, Measured] = {}
        self.trials: list[Measured] = []

    def __call__(self, config: TrainConfig) -> Measured:
        key = config.key()
        if key not in self.seen:
            self.seen[key] = self.measure(config)
            self.trials.append(self.seen[key])
        return self.seen[key]


def _configs(
    base: dict[str, Any], parallel: str, accum_choices: Sequence[int]
) -> list[TrainConfig]:
    """Valid configs of ``parallel``, by micro-batch from the smallest up."""
    out = []
    for accum in sorted(accum_choices, reverse=True):
        try:
            out.append(TrainConfig(**base, parallel=parallel, grad_accum_steps=accum))
        except ValueError:
            continue
    return out


def batch_size_finder(
    measure: Measure, base: dict[str, Any], accum_choices: Sequence[int], amp: str
) -> tuple[Measured | None, list[Measured]]:
    """(the pick, every measurement) of the largest-micro-batch-that-fits rule."""
    memo = _Memo(measure)
    picked = None
    parallel = "ddp" if base.get("world_size", 1) > 1 else "single"
    for config in _configs({**base, "amp": amp}, parallel, accum_choices):
        run = memo(config)
        if not run.fits:
            break  # power scaling stops at the first size that fails
        picked = run
    return picked, memo.trials


def deepspeed_rule(
    measure: Measure,
    base: dict[str, Any],
    accum_choices: Sequence[int],
    amp: str,
    stages: Sequence[str] = ("ddp", "fsdp"),
) -> tuple[Measured | None, list[Measured]]:
    """(the pick, every measurement) of DeepSpeed's stage-by-stage autotuning rule."""
    memo = _Memo(measure)
    best: Measured | None = None
    if base.get("world_size", 1) == 1:
        stages = ("single",)
    for stage in stages:
        configs = _configs({**base, "amp": amp}, stage, accum_choices)
        low, high, largest = 0, len(configs) - 1, -1  # configs[0]: smallest micro-batch
        while low <= high:  # binary search for the largest micro-batch that fits
            middle = (low + high) // 2
            if memo(configs[middle]).fits:
                largest, low = middle, middle + 1
            else:
                high = middle - 1
        if largest < 0:
            continue  # nothing fits at this stage: try the next one
        tuned = [memo(c) for c in configs[max(0, largest - TUNED_MICRO_BATCHES + 1) : largest + 1]]
        stage_best = max((m for m in tuned if m.fits), key=lambda m: m.samples_per_s or 0.0)
        floor = (best.samples_per_s or 0.0) * (1 + STAGE_GAIN) if best else 0.0
        if (stage_best.samples_per_s or 0.0) >= floor:
            best = stage_best
        else:
            break  # the next stage did not pay: stop, as the autotuner's fast mode does
    return best, memo.trials


def standard_recipe(
    measure: Measure,
    base: dict[str, Any],
    space: SearchSpace,
    cores_per_rank: int,
    native_amp: Sequence[str] = AUTOCASTS,
) -> tuple[Measured | None, list[Measured]]:
    """(the pick, every measurement) of the standard recipe over the knobs ``space`` offers,
    autocast only where ``native_amp`` has it: its micro-batches tried from the largest down
    until one fits."""
    memo = _Memo(measure)
    devices = int(base.get("world_size", 1))
    choices = space.choices()
    device = str(base.get("device", "cpu"))
    values = recipe_values(choices, device, devices, cores_per_rank, native_amp)
    fixed = {k: v for k, v in base.items() if k != "world_size"}
    for config in recipe_candidates(values, space, lambda v: {**v, **fixed}):
        run = memo(config)
        if run.fits:
            return run, memo.trials
    return None, memo.trials
