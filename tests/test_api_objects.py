"""The Python API takes the model (and its data, loss, optimizer, collate) as the objects a
pipeline already holds, where the ranks can import them; what they cannot is refused in one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from autotune.api import _workload, run_trial
from autotune.errors import ConfigError
from tests.fixtures import optimizers

CONFIG = {"global_batch_size": 8, "device": "cpu"}
FAST = {"warmup_steps": 1, "measured_steps": 2, "target_interval": 0}


def test_a_class_and_a_factory_given_as_objects_reach_the_trial() -> None:
    result = run_trial(optimizers.Wide, CONFIG, optimizer=optimizers.adamw, **FAST)
    assert result.status == "ok", result.message
    assert result.workload["model"] == "tests.fixtures.optimizers:Wide"
    assert result.workload["optimizer"] == "tests.fixtures.optimizers:adamw"
    assert result.optimizer == "AdamW"


def test_a_module_imported_from_elsewhere_is_found_by_the_ranks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "lib" / "userpkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "nets.py").write_text(
        "import torch\n"
        "class Net(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.layer = torch.nn.Linear(4, 2)\n"
        "    def forward(self, x):\n"
        "        return self.layer(x)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path / "lib"))
    monkeypatch.chdir(tmp_path)  # not where the package is
    from userpkg.nets import Net  # type: ignore[import-not-found]

    result = run_trial(Net, CONFIG, input_shape=(4,), **FAST)
    assert result.status == "ok", result.message


class Stacking:
    """A collator object, as a pipeline holds one (Hugging Face's hold their tokenizer)."""

    def __init__(self, scale: float) -> None:
        self.scale = scale

    def __call__(self, samples: list[tuple[torch.Tensor, torch.Tensor]]) -> list[torch.Tensor]:
        inputs, targets = zip(*samples, strict=True)
        return [torch.stack(inputs) * self.scale, torch.stack(targets)]


def _pairs(seed: int = 0) -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(seed)
    return torch.utils.data.TensorDataset(torch.randn(64, 8, generator=g), torch.arange(64) % 3)


def test_objects_a_pipeline_holds_are_pickled_for_the_ranks() -> None:
    # A dataset, a loss module, a collator and a partial of an optimizer, as a training script
    # holds them, were refused ("give the class or factory every rank builds it with").
    import functools

    result = run_trial(
        "tests.fixtures.models:Small",
        {**CONFIG, "parallel": "ddp", "world_size": 2, "num_workers": 1},
        data=_pairs(),
        loss=torch.nn.CrossEntropyLoss(label_smoothing=0.1),
        collate=Stacking(2.0),
        optimizer=functools.partial(torch.optim.SGD, lr=0.1, momentum=0.9),
        **FAST,
    )
    assert result.status == "ok", result.message
    parts = {k: v.rpartition("/")[2] for k, v in result.workload.items() if v and k != "model"}
    collate = result.workload["collate"].removeprefix("pickled:")
    assert {k: v.partition("-")[0] for k, v in parts.items()} == {
        "data": "TensorDataset", "loss": "CrossEntropyLoss", "collate": "Stacking",
        "optimizer": "partial",
    }  # fmt: skip
    assert result.optimizer == "SGD" and result.loss_rule == ""  # theirs, not the defaults
    assert result.loss_source.startswith("a CrossEntropyLoss object given to the API")
    assert result.collate == f"a Stacking object given to the API (pickled to {collate})"
    assert result.data.startswith("a TensorDataset object given to the API (pickled to ")


@pytest.mark.parametrize(
    "built", [True, pytest.param(False, marks=pytest.mark.slow)], ids=["built", "partial"]
)
def test_a_built_model_or_a_partial_of_its_class_trains_with_what_its_module_declares(
    built: bool,
) -> None:
    # A pipeline that builds its model from its own hyperparameters holds the model, or a
    # partial of its class: both were refused ("give the class or factory every rank builds").
    import functools

    from autotune.search.driver import default_study_name
    from autotune.search.settings import make_settings

    model = optimizers.Wide() if built else functools.partial(optimizers.Wide)
    result = run_trial(model, CONFIG, **FAST)
    assert result.status == "ok", result.message
    assert result.data == "tests.fixtures.optimizers:autotune_dataset"  # beside its class
    assert result.optimizer == "SGD"  # the module's autotune_optimizer
    spec = _workload(model, None, None, None, "float32")
    name = default_study_name(spec, make_settings({"global_batch_size": 8}))
    assert name.startswith("Wide-" if built else "partial-") and name.endswith("-gbs8")


def test_the_checks_before_any_trial_leave_the_callers_model_as_it_was() -> None:
    # A built model given to the API is, in the caller's process, the caller's own model: the
    # coupling check cast it to float64, the bf16 check to bf16 (its weights rounded), and the
    # memory trace swapped its parameters for fake tensors, so the pipeline trained nothing.
    from autotune.runner.fake_memory import trace_step
    from autotune.search import coupled, meta_build, refusals
    from tests.fixtures.models import Small

    model = Small()
    model.head.weight.data[0, 0] = 1 + 2**-20  # what bf16 cannot hold
    held = {name: (t, t.detach().clone()) for name, t in model.state_dict(keep_vars=True).items()}
    workload = _workload(model, _pairs(), None, None, "float32", None, None)
    assert coupled.built_for_real(workload) is not None  # the checks below build and run it
    coupled.coupling(workload)
    refusals.fsdp_bf16_failure(workload)
    assert trace_step(workload, 4, amp="bf16", checkpoint_segments=1).total_bytes > 0
    meta = meta_build.meta_model(workload.model)
    assert meta is not None and all(p.is_meta for p in meta[1].parameters())  # a copy, on meta
    now = model.state_dict(keep_vars=True)
    assert now.keys() == held.keys()
    for name, (tensor, values) in held.items():
        assert now[name] is tensor, name
        assert tensor.dtype == torch.float32 and not tensor.is_meta, name
        assert type(tensor.data) is torch.Tensor and torch.equal(tensor.data, values), name
    assert model.training


def test_an_api_call_keeps_none_of_the_objects_it_was_given() -> None:
    # The pickling's own record of the caller's objects and the probe's caches held every
    # model and dataset a pipeline ever gave: one that tunes dataset after dataset grew.
    import gc
    import weakref

    from autotune import api
    from tests.fixtures.models import Small

    model, data = Small(), _pairs()
    given = weakref.ref(model), weakref.ref(data)
    config = {"global_batch_size": 8}  # planned for CUDA: no rank measured here, quicker
    found = api.plan(model, data=data, devices=1, device_memory="4GiB", config=config)
    assert found.rows and found.trace_error is None  # traced: the caches were filled
    del model, data
    gc.collect()
    assert [ref() for ref in given] == [None, None]
    for call in (api.run_trial, api.tune, api.plan, api.declared_global_batch_size):
        assert call.__wrapped__ is not None  # type: ignore[attr-defined]  # each releases


def test_a_dataloader_given_as_data_gives_its_dataset_and_its_collate_function() -> None:
    from torch.utils.data import DataLoader

    model, default = "tests.fixtures.models:Small", "torch.utils.data:default_collate"

    def kinds(loader: DataLoader[Any], collate: Any = None) -> dict[str, str | None]:
        spec = _workload(model, loader, None, None, "float32", None, collate)
        return {
            what: ref.rpartition("/")[2].partition("-")[0] if ref else None
            for what, ref in (("data", spec.data), ("collate", spec.collate))
        }

    assert kinds(DataLoader(_pairs(), batch_size=4, collate_fn=Stacking(2.0))) == {
        "data": "TensorDataset", "collate": "Stacking"
    }  # fmt: skip
    assert kinds(DataLoader(_pairs(), batch_size=4)) == {"data": "TensorDataset", "collate": None}
    given = kinds(DataLoader(_pairs(), collate_fn=Stacking(2.0)), default)  # the given one wins
    assert given == {"data": "TensorDataset", "collate": default}


def test_a_pickled_objects_reference_follows_its_content_not_the_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # torch pickles a tensor's storage with a random id: the same data gave another file in
    # each run, and a resumed study said it was made with a different data.
    from autotune.runner.pickled import pickled_reference

    same = pickled_reference(_pairs(), "data", None), pickled_reference(_pairs(), "data", None)
    assert same[0] == same[1] and same[0].startswith("pickled:")
    assert pickled_reference(_pairs(seed=1), "data", None) != same[0]
    with pytest.raises(ConfigError, match=r"^data=x: the ranks get an object by pickling it, "):
        pickled_reference((x for x in [1, 2]), "data=x", None)  # a generator
    # a notebook's class: the ranks could not unpickle it ("Can't get attribute") in a trial
    monkeypatch.setattr(sys.modules["__main__"], "_Scripted", _Scripted, raising=False)
    with pytest.raises(ConfigError, match=r"holds _Scripted, defined in an interactive session"):
        pickled_reference([_Scripted()], "data=a list object", None)


def test_pickled_objects_unused_for_a_week_are_deleted_and_those_in_use_kept_fresh(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every search of a changed dataset left its whole pickle in the temporary directory.
    import os
    import tempfile
    import time

    from autotune.runner import pickled
    from autotune.runner.references import import_location

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    objects = tmp_path / "autotune-objects"
    objects.mkdir()
    week_ago = time.time() - pickled.UNUSED_FOR_S - 60
    stale, died, recent = objects / "A-1.pkl", objects / "A-2.12.part", objects / "A-3.pkl"
    for path in (stale, died, recent):
        path.write_bytes(b"x")
    for path in (stale, died):
        os.utime(path, (week_ago, week_ago))
    reference = pickled.pickled_reference(_pairs(), "data", None)
    path = Path(reference.removeprefix(pickled.PREFIX))
    assert sorted(p.name for p in objects.iterdir()) == sorted([recent.name, path.name])
    os.utime(path, (week_ago, week_ago))
    assert pickled.pickled_reference(_pairs(), "data", None) == reference  # reused, not pruned
    assert time.time() - path.stat().st_mtime < 60
    os.utime(path, (week_ago, week_ago))
    del pickled._HELD[reference]  # as a rank loads it: from the file
    _, loaded = pickled.load_pickled(reference, "data", import_location)
    assert torch.equal(loaded.tensors[0], _pairs().tensors[0])
    assert time.time() - path.stat().st_mtime < 60  # loaded: in use


def test_a_large_object_is_not_held_twice_while_it_is_pickled_or_loaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Its identity was pickled whole to memory to be hashed, and a rank read the file whole
    # and copied its body before unpickling it.
    import tempfile
    import tracemalloc

    from autotune.runner import pickled
    from autotune.runner.references import import_location

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    size = 64 * 2**20
    value = [bytes(size)]
    tracemalloc.start()
    try:
        reference = pickled.pickled_reference(value, "data", None)
        assert tracemalloc.get_traced_memory()[1] < size // 4
        del pickled._HELD[reference]
        tracemalloc.reset_peak()
        _, loaded = pickled.load_pickled(reference, "data", import_location)
        assert tracemalloc.get_traced_memory()[1] < size * 5 // 4  # the object, once
    finally:
        tracemalloc.stop()
    assert loaded == value


def test_pickling_that_takes_seconds_is_said_with_its_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A large in-memory dataset took its seconds before a search's first line, in silence.
    import tempfile

    from autotune.runner import pickled

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(pickled, "SAID_AFTER_S", 0.0)  # as a large one takes
    said: list[str] = []
    parts = ("tests.fixtures.models:Small", _pairs(), None, None, "float32")
    spec = _workload(*parts, say=said.append)
    path = spec.data.removeprefix(pickled.PREFIX) if spec.data else ""
    _workload(*parts, say=said.append)
    size = Path(path).stat().st_size
    what = "data=a TensorDataset object"
    assert said == [
        f"{what}: pickled for the ranks, {size / 1024:.1f} KiB in 0 s ({path})",
        f"{what}: hashed: the same content was pickled before in 0 s ({path})",
    ]
    monkeypatch.setattr(pickled, "SAID_AFTER_S", 60.0)
    _workload(*parts, say=said.append)
    assert len(said) == 2  # quick: nothing said


def test_a_pickled_object_is_refused_for_a_ray_cluster_whose_nodes_cannot_read_it() -> None:
    from autotune.search.driver import _check_objects_reach

    workload = _workload("tests.fixtures.models:Small", _pairs(), None, None, "float32")
    _check_objects_reach(workload, None)
    with pytest.raises(ConfigError, match=r"the nodes of the Ray cluster at '10\.0\.0\.7:6379'"):
        _check_objects_reach(workload, "10.0.0.7:6379")


class _Scripted(torch.nn.Module):
    pass


_Scripted.__module__ = "__main__"  # as a class of the script being run is


def _local() -> type:
    class Inner(torch.nn.Module):
        pass

    return Inner


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        (_Scripted, "model=__main__._Scripted: not found at the top level of the script being"),
        (_local(), "model=tests.test_api_objects._local.<locals>.Inner: defined in a function"),
        (3, "model=an int object: give the model (a torch.nn.Module), or the class or factory"),
    ],
)
def test_what_the_ranks_cannot_import_is_refused_in_one_line(model: object, expected: str) -> None:
    with pytest.raises(ConfigError) as raised:
        run_trial(model, CONFIG, **FAST)  # type: ignore[arg-type]
    assert str(raised.value).startswith(expected)
    assert "\n" not in str(raised.value)


def test_a_lambda_given_as_a_factory_is_refused_with_the_partial_that_would_do() -> None:
    # A script's tune(Net, optimizer=lambda params: torch.optim.SGD(params, lr=lr)) was told
    # "not found at the top level of the script", where the lambda is; the README's own apply
    # example passes one (apply runs in the caller's process, where it is fine)
    with pytest.raises(ConfigError) as raised:
        run_trial(
            "tests.fixtures.models:Small",
            CONFIG,
            optimizer=lambda params: torch.optim.SGD(params, lr=0.05),
            **FAST,
        )
    said = str(raised.value)
    assert "a lambda has no name the ranks can import it by" in said
    assert "functools.partial(torch.optim.SGD" in said and "\n" not in said


SCRIPT = """
import torch
import autotune

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 2)

    def forward(self, x):
        return self.layer(x)


class Samples(torch.utils.data.Dataset):
    def __len__(self):
        return 32

    def __getitem__(self, index):
        return torch.full((4,), float(index)), index % 2

{guard}
    result = autotune.run_trial(Net, {{"global_batch_size": 8, "device": "cpu"}}, data=Samples(),
                                warmup_steps=1, measured_steps=2, target_interval=0)
    print(result.status, result.workload["model"], result.message)
"""


@pytest.mark.parametrize("guarded", [True, False])
def test_a_class_of_the_script_being_run_is_imported_from_its_file(
    tmp_path: Path, guarded: bool
) -> None:
    # `python train.py` that calls the tuner on its own Net was refused ("defined in the script
    # being run"): the ranks now import the file, as multiprocessing's spawn does, where its
    # __main__ guard keeps the call from running again; without the guard, one line says so.
    script = tmp_path / "train.py"
    guard = 'if __name__ == "__main__":' if guarded else "if True:"
    script.write_text(SCRIPT.format(guard=guard))
    ran = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    if guarded:
        assert ran.returncode == 0, ran.stderr[-2000:]
        assert ran.stdout.split() == ["ok", "train.py:Net"]  # its Samples unpickled in a rank
    else:
        assert ran.returncode != 0
        assert (
            ran.stderr.strip()
            .splitlines()[-1]
            .endswith(
                f"autotune was called again while it imported {script} for its ranks: put the call "
                'under `if __name__ == "__main__":`, which only the script run directly enters'
            )
        )


def test_a_call_in_one_process_of_a_distributed_launch_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # `torchrun --nproc-per-node=8 train.py` whose script tunes first: eight searches at once,
    # each on the devices the others hold.
    import autotune
    from autotune.api import _check_not_launched

    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "8")
    for call in (lambda: autotune.tune("tests.fixtures.models:Small"),
                 lambda: run_trial("tests.fixtures.models:Small", CONFIG)):  # fmt: skip
        with pytest.raises(ConfigError, match=r"called in a distributed launch \(RANK=3 of WORL"):
            call()
    monkeypatch.setenv("WORLD_SIZE", "1")  # torchrun --nproc-per-node=1: one process
    _check_not_launched("tune")
