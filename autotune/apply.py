"""Use a configuration in your own training loop, under ``torchrun`` or in one process.

    import autotune.apply as apply

    config = autotune.load_config("best.yaml")
    training = apply.prepare(config, model, dataset,
                             optimizer=lambda params: torch.optim.AdamW(params, lr=3e-4))
    batches = training.batches()
    for step in range(num_steps):
        stats = training.step(batches)   # grad_accum_steps micro-batches, one optimizer step
    state = training.state_dict()        # every rank; rank 0's is your model's own, full
    training.close()                     # leave the process group before the process exits

This module re-exports the trial runner's own session code (``autotune.runner.session``) and
loss rules: a user loop runs exactly the code the trials measured.
"""

from __future__ import annotations

from autotune.runner.loss import default_loss
from autotune.runner.session import (
    OptimizerFactory,
    Training,
    device_for,
    init_distributed,
    make_loader,
    prepare,
)
from autotune.runner.training import StepStats

__all__ = [
    "OptimizerFactory",
    "StepStats",
    "Training",
    "default_loss",
    "device_for",
    "init_distributed",
    "make_loader",
    "prepare",
]
