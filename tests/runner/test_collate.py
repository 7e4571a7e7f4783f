"""The user's collate function makes the trials' batches (samples of different lengths)."""

from __future__ import annotations

import pytest

from autotune.api import run_trial
from autotune.report import format_trial
from tests.helpers import FEW

PADDED = "tests.fixtures.padded"
TAGGER = f"{PADDED}:Tagger"
HINT = "give a collate function that pads them (--collate module:attr"


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
    # named as the samples and the collate function are (it was not said at all)
    assert result.loss_source == "tests.fixtures.padded:autotune_loss"
    assert ": yours, tests.fixtures.padded:autotune_loss" in format_trial(result)
    assert "  samples       tests.fixtures.padded:autotune_dataset" in format_trial(result)


@pytest.mark.slow  # one message from a trial: the default run keeps default_collate's
def test_samples_torch_cannot_stack_fail_with_how_to_pad_them() -> None:
    config = {"global_batch_size": 8, "device": "cpu"}
    result = run_trial(TAGGER, config, collate="torch.utils.data:default_collate", **FEW)
    assert result.status == "error"
    assert "stack expects each tensor to be equal size" in result.message
    assert HINT not in result.message  # a collate function was given: no hint to give one
    bare = run_trial("tests.fixtures.models:Small", config, data=f"{PADDED}:Sentences", **FEW)
    assert "stack expects each tensor" in bare.message and HINT in bare.message


@pytest.mark.slow  # one batch shape from a trial
def test_keys_the_forward_does_not_take_are_left_out_and_said() -> None:
    config = {"global_batch_size": 8, "parallel": "ddp", "world_size": 2, "device": "cpu"}
    result = run_trial("tests.fixtures.unused_keys:Tagger", config, **FEW)
    assert result.status == "ok", result.message
    assert result.data.endswith("left out of the forward's call, which does not take them: labels")
    assert "(the batch's 'labels')" in result.loss_rule


@pytest.mark.slow  # three batch types, a trial each: the default run moves them in process
def test_named_tuple_batch_encoding_and_packed_batches_train_as_tuples_and_dicts_do() -> None:
    # A named tuple was rebuilt from one generator (every trial failed: "missing 1 required
    # positional argument"), and so was a PackedSequence (a named tuple too); a BatchEncoding (a
    # UserDict) was taken for one input, and would not have been moved to a GPU.
    config = {"global_batch_size": 8, "parallel": "ddp", "world_size": 2, "device": "cpu"}
    models = ("named_samples:Net", "encodings:Classifier", "packed_batches:Tagger")
    for model in (f"tests.fixtures.{m}" for m in models):
        result = run_trial(model, config, **FEW)
        assert result.status == "ok", result.message


def test_a_batch_keeps_its_type_on_its_way_to_the_device() -> None:
    import torch
    from transformers import BatchEncoding

    from autotune.runner.training import move_to, split_batch
    from tests.fixtures.named_samples import Sample

    meta = torch.device("meta")
    named = move_to(Sample(torch.ones(2, 3), torch.zeros(2)), meta, False)
    assert type(named) is Sample and named.features.device == meta
    encoded = move_to(BatchEncoding({"input_ids": torch.ones(2, 3)}), meta, False)
    assert type(encoded) is BatchEncoding and encoded.input_ids.device == meta
    packed = torch.nn.utils.rnn.pack_sequence([torch.ones(3, 2), torch.ones(2, 2)])
    moved = move_to(packed, meta, False)
    assert moved.data.device == meta and moved.batch_sizes.device.type == "cpu"  # as .to keeps it
    args, kwargs, target = split_batch(encoded, frozenset({"input_ids"}))
    assert args == () and list(kwargs) == ["input_ids"] and target is encoded
    assert type(kwargs) is dict  # passed as **kwargs


def test_a_graph_batch_and_a_dataclass_are_moved_through_what_they_hold() -> None:
    # A PyTorch Geometric batch (it maps its tensors by apply) and a dataclass were left as
    # they were: on a GPU the model would have met CPU tensors. Each is moved as a copy.
    import torch

    from autotune.runner.hints import input_hint
    from autotune.runner.training import move_to
    from tests.fixtures.graph_objects import GraphBatch, Nodes

    meta = torch.device("meta")
    batch = GraphBatch(x=torch.ones(3, 2), graph=torch.zeros(3, dtype=torch.long))
    moved = move_to(batch, meta, False)
    assert type(moved) is GraphBatch and moved.x.device == moved.graph.device == meta
    assert batch.x.device.type == "cpu"  # the batch itself is left as it was
    nodes = move_to(Nodes(torch.ones(3, 2), torch.zeros(2, 4), torch.zeros(3)), meta, False)
    assert type(nodes) is Nodes and {t.device for t in vars(nodes).values()} == {meta}
    assert input_hint((batch, nodes), {}) is None  # tensors inside: not "not a tensor"


@pytest.mark.parametrize(
    "collate",  # ~4-5 s a case: the default run keeps the dataclass
    [pytest.param(None, marks=pytest.mark.slow), "tests.fixtures.graph_objects:as_dataclass"],
)
def test_a_graph_batch_object_trains_over_ranks_and_workers(collate: str | None) -> None:
    config = {
        "global_batch_size": 16, "parallel": "ddp", "world_size": 2, "device": "cpu",
        "num_workers": 1,
    }  # fmt: skip
    model = "tests.fixtures.graph_objects:Classifier"
    result = run_trial(model, config, collate=collate, **FEW)
    assert result.status == "ok", result.message


def test_samples_default_collate_cannot_batch_are_said_with_the_fix() -> None:
    # Dataclass samples stopped a search with torch's "default_collate: batch must contain
    # tensors, numpy arrays, numbers, dicts or lists" and nothing else.
    import pytest

    from autotune.errors import WorkloadError
    from autotune.runner.workload import WorkloadSpec
    from autotune.search.meta_build import check_batches

    spec = WorkloadSpec(model="tests.fixtures.dataclass_samples:Net")
    with pytest.raises(WorkloadError, match=r"found <class .*Sample'>; torch's default_collate"):
        check_batches(spec)
    result = run_trial(spec.model, {"global_batch_size": 8, "device": "cpu"}, **FEW)
    assert result.status == "error"
    assert "(a dataclass's fields a dict), or give a collate function" in result.message
