"""Every knob of ``TrainConfig`` reaches every consumer: a new field fails here until the
summary line, every export (or its notes), the README's table and the memory rules know it."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.config import TrainConfig
from autotune.export import notes_for, render
from autotune.search.memory_model import MEMORY_FIELDS, MEMORY_NEUTRAL_FIELDS

NOT_KNOBS = {"global_batch_size", "device"}
"""Training semantics and the machine: never turned by the search."""

BASE = {"global_batch_size": 16, "device": "cuda", "parallel": "ddp", "world_size": 2}
VARIANTS: dict[str, tuple[dict[str, object], dict[str, object]]] = {
    # field: (prerequisites on both sides, the moved value)
    "parallel": ({}, {"parallel": "fsdp"}),
    "world_size": ({}, {"world_size": 4}),
    "comm_hook": ({}, {"comm_hook": "fp16"}),
    "powersgd_rank": ({"comm_hook": "powersgd"}, {"powersgd_rank": 4}),
    "powersgd_start_iter": ({"comm_hook": "powersgd"}, {"powersgd_start_iter": 4}),
    "static_graph": ({}, {"static_graph": True}),
    "find_unused_parameters": ({}, {"find_unused_parameters": True}),
    "reshard_after_forward": ({"parallel": "fsdp"}, {"reshard_after_forward": False}),
    "fsdp_mixed_precision": ({"parallel": "fsdp"}, {"fsdp_mixed_precision": "bf16"}),
    "fsdp_cpu_offload": ({"parallel": "fsdp"}, {"fsdp_cpu_offload": True}),
    "bucket_cap_mb": ({}, {"bucket_cap_mb": 100}),
    "gradient_as_bucket_view": ({}, {"gradient_as_bucket_view": True}),
    "amp": ({}, {"amp": "bf16"}),
    "optimizer_impl": ({}, {"optimizer_impl": "fused"}),
    "optimizer_in_backward": (
        {"parallel": "single", "world_size": 1},
        {"optimizer_in_backward": True},
    ),
    "matmul_precision": ({}, {"matmul_precision": "high"}),
    "checkpoint_segments": ({}, {"checkpoint_segments": 2}),
    "checkpoint_policy": ({"checkpoint_segments": 2}, {"checkpoint_policy": "selective"}),
    "grad_accum_steps": ({}, {"grad_accum_steps": 2}),
    "max_grad_norm": ({}, {"max_grad_norm": 1.0}),
    "compile": ({}, {"compile": "default"}),
    "channels_last": ({}, {"channels_last": True}),
    "expandable_segments": ({}, {"expandable_segments": True}),
    "num_workers": ({}, {"num_workers": 2}),
    "prefetch_factor": ({"num_workers": 2}, {"prefetch_factor": 4}),
    "pin_memory": ({}, {"pin_memory": True}),
    "persistent_workers": ({"num_workers": 2}, {"persistent_workers": True}),
}
KNOBS = [name for name in TrainConfig.model_fields if name not in NOT_KNOBS]


def _pair(field: str) -> tuple[TrainConfig, TrainConfig]:
    assert field in VARIANTS, (
        f"TrainConfig.{field} is new: add it to VARIANTS here, and to the summary, every export "
        "(or a note), the README's table and the memory rules"
    )
    prerequisites, moved = VARIANTS[field]
    before = TrainConfig(**{**BASE, **prerequisites})  # type: ignore[arg-type]
    after = TrainConfig(**{**BASE, **prerequisites, **moved})  # type: ignore[arg-type]
    return before, after


@pytest.mark.parametrize("field", KNOBS)
def test_the_summary_line_shows_the_knob(field: str) -> None:
    before, after = _pair(field)
    assert before.summary() != after.summary()


@pytest.mark.parametrize("fmt", ["hf", "lightning", "accelerate", "torchrun", "yaml"])
@pytest.mark.parametrize("field", KNOBS)
def test_every_export_sets_the_knob_or_says_how(field: str, fmt: str) -> None:
    before, after = _pair(field)
    # A torchrun export is its command and the YAML config file the command names.
    files = ("torchrun", "yaml") if fmt == "torchrun" else (fmt,)
    shown = [
        "".join(render(c, f) for f in files) + "\n".join(notes_for(c, fmt)) for c in (before, after)
    ]
    assert shown[0] != shown[1], f"the {fmt} export does not show {field}"


@pytest.mark.parametrize("field", KNOBS)
def test_the_readme_table_lists_the_knob(field: str) -> None:
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert f"| `{field}`" in readme or f"`{field}`, `" in readme or f", `{field}` |" in readme


def test_the_memory_rules_say_of_every_knob_whether_it_moves_memory() -> None:
    assert set(MEMORY_FIELDS) | set(MEMORY_NEUTRAL_FIELDS) == set(KNOBS) | {"device"}
    assert not set(MEMORY_FIELDS) & set(MEMORY_NEUTRAL_FIELDS)
