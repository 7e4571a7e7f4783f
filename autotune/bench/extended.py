"""Recorded landscapes extended with the knobs a CPU cannot show the effect of: a labelled
simulation of how the search copes with the bigger space.

The knobs of real-scale training (the optimizer's fused form, DDP's bucket size and gradient
views, FSDP's resharding) change nothing measurable on two gloo ranks of a small model, and
recording their grid here would only multiply each point by noise. Instead each recorded point
is copied once per combination of the knobs that exist for it, its samples/s and peak scaled by
a published GPU effect (``SIMULATED``, each with its source). Nothing here was measured with
these knobs: results on these landscapes say how many trials the search needs to find an effect
of that size in a space that large, not that the effect exists on this machine.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from autotune.bench.landscape import Landscape, Point
from autotune.config import TrainConfig
from autotune.records import Value
from autotune.search.space import Param, SearchSpace


@dataclass(frozen=True)
class SimulatedKnob:
    """A knob added to a recorded landscape, with the effect it is given (by value)."""

    name: str
    choices: tuple[Value, ...]
    when: dict[str, tuple[Value, ...]]
    speed: dict[Value, float]
    """samples/s multiplied by this for the value (1.0 where absent)."""
    memory: dict[Value, float]
    """Peak memory multiplied by this for the value (1.0 where absent)."""
    source: str


SIMULATED: tuple[SimulatedKnob, ...] = (
    SimulatedKnob(
        "optimizer_impl",
        ("default", "foreach", "fused"),
        {},
        {"fused": 1.026},
        {},
        "fused AdamW: +2.6% on Llama-8B (torchtitan PR 881)",
    ),
    SimulatedKnob(
        "bucket_cap_mb",
        (25, 10, 100),
        {"parallel": ("ddp",)},
        {10: 0.99, 100: 1.02},
        {100: 1.02},
        "assumed: -1% for 10 MiB buckets, +2% for 100 MiB (fewer all-reduce calls), "
        "pytorch issue 118421 calls 25 MiB very small",
    ),
    SimulatedKnob(
        "gradient_as_bucket_view",
        (False, True),
        {"parallel": ("ddp",)},
        {True: 0.982 / 0.909},
        {True: 0.95},
        "0.982 to 0.909 s per iteration and 1 GB less on RoBERTa-base (pytorch PR 41954)",
    ),
    SimulatedKnob(
        "reshard_after_forward",
        (True, False),
        {"parallel": ("fsdp",)},
        {False: 1.05},
        {False: 1.15},
        "+3.5% to +8% tokens/s for more memory (lightning-thunder PR 1156, torchtune issue "
        "2402); +15% memory assumed",
    ),
)


def _exists(knob: SimulatedKnob, config: TrainConfig) -> bool:
    values = config.model_dump()
    return all(values.get(k) in v for k, v in knob.when.items())


def extend(landscape: Landscape, knobs: tuple[SimulatedKnob, ...] = SIMULATED) -> Landscape:
    """``landscape`` with ``knobs`` added to its space and its points copied per combination."""
    params = dict(landscape.space.params)
    for knob in knobs:
        params[knob.name] = Param(choices=knob.choices, when=knob.when)
    points = []
    for point in landscape.points:
        present = [k for k in knobs if _exists(k, point.config)]
        for combination in itertools.product(*(k.choices for k in present)):
            speed = memory = 1.0
            values = point.config.model_dump()
            for knob, value in zip(present, combination, strict=True):
                values[knob.name] = value
                speed *= knob.speed.get(value, 1.0)
                memory *= knob.memory.get(value, 1.0)
            runs = [
                run.model_copy(
                    update={
                        "samples_per_s": run.samples_per_s * speed
                        if run.samples_per_s is not None
                        else None,
                        "steady_samples_per_s": run.steady_samples_per_s * speed
                        if run.steady_samples_per_s is not None
                        else None,
                        "memory_used_bytes": int(run.memory_used_bytes * memory)
                        if run.memory_used_bytes is not None
                        else None,
                    }
                )
                for run in point.runs
            ]
            points.append(Point(config=TrainConfig(**values), runs=runs))
    # a new landscape, not a copy: a copy would keep the original's cached lookups
    fields = {name: getattr(landscape, name) for name in Landscape.model_fields}
    return Landscape(**{**fields, "space": SearchSpace(params=params), "points": points})
