"""Gradient clipping (``max_grad_norm``): the user's training semantics, applied before every
optimizer step of a trial, a user loop (``apply.prepare``) and every configuration a search
runs."""

from __future__ import annotations

import pytest
import torch

from autotune.apply import prepare
from autotune.config import TrainConfig
from autotune.result import TrialResult
from tests.fixtures.models import Pairs, Small
from tests.search.fakes import FakeExecutor, make_tuner, ok


def _update_norm(config: TrainConfig) -> float:
    """The norm of one step's change to the parameters, by SGD at learning rate 1: the norm of
    the gradients the step took."""
    torch.manual_seed(0)
    model = Small()
    before = [p.detach().clone() for p in model.parameters()]

    def sgd(params: object) -> torch.optim.Optimizer:
        return torch.optim.SGD(params, lr=1.0)  # type: ignore[arg-type]

    training = prepare(config, model, Pairs(), optimizer=sgd)
    training.step(training.batches())
    training.close()
    after = [
        p.detach().full_tensor() if hasattr(p, "full_tensor") else p.detach()
        for p in model.parameters()
    ]
    return float(
        torch.linalg.vector_norm(
            torch.cat([(a - b).flatten() for a, b in zip(after, before, strict=True)])
        )
    )


@pytest.mark.usefixtures("one_rank_group")
@pytest.mark.parametrize(
    "values",
    [
        {},
        {"amp": "fp16"},  # the scaler's gradients unscaled before the norm is taken
        {"parallel": "ddp"},
        {"parallel": "fsdp"},  # DTensor shards: the norm over all of them
        {"grad_accum_steps": 2},
    ],
)
def test_the_step_clips_the_gradients_to_the_norm_given(values: dict[str, object]) -> None:
    base = {"global_batch_size": 8, "device": "cpu", **values}
    free = _update_norm(TrainConfig(**base))  # type: ignore[arg-type]
    clipped = _update_norm(TrainConfig(**base, max_grad_norm=free / 10))  # type: ignore[arg-type]
    assert clipped == pytest.approx(free / 10, rel=1e-3)
    assert _update_norm(TrainConfig(**base, max_grad_norm=free * 10)) == pytest.approx(free)  # type: ignore[arg-type]


def test_every_configuration_a_search_runs_clips_as_told() -> None:
    seen: list[TrainConfig] = []

    def outcome(config: TrainConfig, before: int) -> TrialResult:
        seen.append(config)
        return ok(config, 1000.0, 100)

    space = {"parallel": ["single", "ddp"], "world_size": [1, 2], "grad_accum_steps": [1, 2]}
    tuner = make_tuner(FakeExecutor(outcome), space, trials=4, race_rounds=2, max_grad_norm=1.0)
    recommendation = tuner.run([], "s.db", "s")
    assert seen and all(c.max_grad_norm == 1.0 for c in seen)  # baseline, recipe, race
    assert recommendation.config.max_grad_norm == 1.0
    assert "clip=1" in recommendation.config.summary()
