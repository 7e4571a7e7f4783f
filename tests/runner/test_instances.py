"""Copies of a model the caller holds: checks and traces before any trial change the copy, never
the caller's model, and a model on a GPU is pickled for the ranks in host memory."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

from autotune.runner import pickled
from autotune.runner.instances import copy_with_tensors, real_copy
from autotune.runner.references import import_location
from tests.fixtures.models import Small


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight  # tied, as a language model's head
        self.frozen = nn.Linear(4, 4)
        self.frozen.requires_grad_(False)
        self.register_buffer("scale", torch.tensor([2.0]))
        self.mask = torch.ones(4)  # a plain attribute
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # the old weight_norm, still used
            self.normed = nn.utils.weight_norm(nn.Linear(4, 4))  # its weight: a computed tensor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.normed(self.frozen(self.embed(x))) * self.scale * self.mask)


def _same_tensors(a: nn.Module, b: nn.Module) -> None:
    for (name, x), (_, y) in zip(
        a.state_dict(keep_vars=True).items(), b.state_dict(keep_vars=True).items(), strict=True
    ):
        assert torch.equal(x, y) and x.requires_grad == y.requires_grad, name
        assert type(x) is type(y), name


@pytest.mark.parametrize("kind", ["real", "meta"])
def test_a_copy_keeps_ties_and_flags_and_leaves_the_original_alone(kind: str) -> None:
    # A weight_norm'd layer holds its weight as a computed tensor, which deepcopy refuses: such
    # a model given as an object could not be copied at all.
    model = Tied()
    kept = {name: t.detach().clone() for name, t in model.state_dict().items()}
    copied = (
        real_copy(model, "m")
        if kind == "real"
        else copy_with_tensors(model, lambda t: t.to("meta"), "m")
    )
    assert copied.head.weight is copied.embed.weight and copied.head.weight is not model.head.weight
    assert not copied.frozen.weight.requires_grad and copied.embed.weight.requires_grad
    assert isinstance(copied.embed.weight, nn.Parameter)
    if kind == "real":
        _same_tensors(copied, model)
        assert torch.equal(copied(torch.arange(3)), model(torch.arange(3)))
        copied.double()
    else:
        assert all(t.is_meta for t in copied.state_dict().values())
    now = model.state_dict()
    assert all(torch.equal(now[name], t) and now[name].dtype == t.dtype for name, t in kept.items())


def test_tensors_on_a_device_are_pickled_in_host_memory_as_they_were(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Unpickled as they were, a model the caller moved to its GPU would be put on that GPU by
    # every rank. Here the model's tensors are taken to be on a device: the host copies
    # pickled in their place must come back as the same kinds of tensors, ties and flags
    # included.
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    model = Tied()
    held = {id(t) for t in (*model.state_dict(keep_vars=True).values(), model.mask)}
    moved: set[int] = set()

    def on_a_device(tensor: torch.Tensor) -> bool:
        if id(tensor) in held:
            moved.add(id(tensor))
        return id(tensor) in held

    monkeypatch.setattr(pickled, "_on_a_device", on_a_device)
    reference = pickled.pickled_reference(model, "--model", None)
    del pickled._HELD[reference]  # as a rank loads it: from the file
    _, loaded = pickled.load_pickled(reference, "--model", import_location)
    assert moved == held  # each one pickled through its host copy
    assert loaded.head.weight is loaded.embed.weight
    _same_tensors(loaded, model)
    assert torch.equal(loaded(torch.arange(3)), model(torch.arange(3)))


class RefusesDeepcopy(Small):
    """Pickles, but ``copy.deepcopy`` refuses it (a library's guard)."""

    def __deepcopy__(self, memo: dict[int, object]) -> RefusesDeepcopy:
        raise TypeError("cannot be deep-copied")


def test_a_reused_rank_gives_each_trial_its_own_model_given_as_an_object(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A model given as an object that could not be copied was loaded again for each trial of a
    # reused rank: the same object, so a trial started from what the one before left. One
    # whose weight_norm'd layer deepcopy refused was not copied either, and a factory's was
    # built again (other weights) for each trial.
    import tempfile

    from autotune.runner.workload import WorkloadCache, WorkloadSpec, _copied

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    reference = pickled.pickled_reference(RefusesDeepcopy(), "--model", None)
    del pickled._HELD[reference]  # as a rank has it: from the file
    cache = WorkloadCache()
    spec = WorkloadSpec(model=reference, data="tests.fixtures.models:autotune_dataset")
    first, second = cache.get(spec).model, cache.get(spec).model
    assert first is not second and first.head.weight is not second.head.weight
    assert torch.equal(first.head.weight, second.head.weight)  # the same model, read again
    model = Tied()
    copied = _copied(model, "m")
    assert copied.normed.weight_v is not model.normed.weight_v
    assert torch.equal(copied.normed.weight_v, model.normed.weight_v)
