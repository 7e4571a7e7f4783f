"""Recorded landscapes extended with simulated knobs: each point copied per combination of the
knobs that exist for it, scaled by the knob's stated effect."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.bench.extended import SIMULATED, extend
from autotune.bench.landscape import Landscape

LANDSCAPE = Path(__file__).resolve().parent.parent / "data" / "landscape.json"


def test_each_point_is_copied_per_combination_of_the_knobs_that_exist_for_it() -> None:
    recorded = Landscape.load(LANDSCAPE)
    extended = extend(recorded)
    per = {"single": 3, "ddp": 3 * 3 * 2, "fsdp": 3 * 2}  # optimizer x bucket x view / reshard
    expected = sum(per[p.config.parallel] for p in recorded.points)
    assert len(extended.points) == expected
    assert len({p.config.key() for p in extended.points}) == expected  # all distinct
    for knob in SIMULATED:
        assert extended.space.params[knob.name].choices == knob.choices and knob.source


def test_a_simulated_effect_scales_speed_and_memory_and_moves_the_optimum() -> None:
    recorded = Landscape.load(LANDSCAPE)
    extended = extend(recorded)
    best = recorded.optimum()
    fused = best.config.model_copy(update={"optimizer_impl": "fused"})
    point = extended.lookup(fused)
    assert point is not None and point.value == pytest.approx(best.value * 1.026)
    assert extended.optimum().value == pytest.approx(
        max((p.value or 0) for p in extended.points if extended.feasible(p))
    )
    assert extended.optimum().config.optimizer_impl == "fused"
    assert extended.lookup(best.config) is not None  # the recorded point is one of its copies
    assert extended.lookup(best.config).value == pytest.approx(best.value)  # type: ignore[union-attr]
