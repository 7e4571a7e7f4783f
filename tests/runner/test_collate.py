"""The user's collate function makes the trials' batches (samples of different lengths)."""

from __future__ import annotations

from autotune.api import run_trial
from autotune.report import format_trial

PADDED = "tests.fixtures.padded"
TAGGER = f"{PADDED}:Tagger"
HINT = "give a collate function that pads them (--collate module:attr"
FEW = {"warmup_steps": 1, "measured_steps": 2, "target_interval": 0}


def test_ranks_and_their_dataloader_workers_batch_with_the_modules_collate_function() -> None:
    config = {
        "global_batch_size": 8, "parallel": "ddp", "world_size": 2, "device": "cpu",
        "num_workers": 1,
    }  # fmt: skip
    result = run_trial(TAGGER, config, **FEW)
    assert result.status == "ok", result.message
    assert result.workload is not None and result.workload["collate"] is None  # the module's
    assert result.collate == "tests.fixtures.padded:autotune_collate"
    assert "  collate       tests.fixtures.padded:autotune_collate" in format_trial(result)
    assert result.data == "tests.fixtures.padded:autotune_dataset"  # where the samples came from
    assert result.loss_rule == ""  # the module's autotune_loss: no rule of the default's
    assert "  samples       tests.fixtures.padded:autotune_dataset" in format_trial(result)


def test_samples_torch_cannot_stack_fail_with_how_to_pad_them() -> None:
    config = {"global_batch_size": 8, "device": "cpu"}
    result = run_trial(TAGGER, config, collate="torch.utils.data:default_collate", **FEW)
    assert result.status == "error"
    assert "stack expects each tensor to be equal size" in result.message
    assert HINT not in result.message  # a collate function was given: no hint to give one
    bare = run_trial("tests.fixtures.models:Small", config, data=f"{PADDED}:Sentences", **FEW)
    assert "stack expects each tensor" in bare.message and HINT in bare.message


def test_keys_the_forward_does_not_take_are_left_out_and_said() -> None:
    config = {"global_batch_size": 8, "parallel": "ddp", "world_size": 2, "device": "cpu"}
    result = run_trial("tests.fixtures.unused_keys:Tagger", config, **FEW)
    assert result.status == "ok", result.message
    assert result.data.endswith("left out of the forward's call, which does not take them: labels")
    assert "(the batch's 'labels')" in result.loss_rule
