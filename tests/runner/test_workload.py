from __future__ import annotations

from pathlib import Path

import pytest
import torch

from autotune.api import run_trial
from autotune.errors import WorkloadError
from autotune.report import format_trial
from autotune.runner.loss import default_loss
from autotune.runner.workload import (
    WorkloadCache,
    WorkloadSpec,
    _instantiate_dataset,
    build_workload,
    check_workload,
    load_model,
)
from autotune.search.meta_build import data_source
from tests.helpers import FEW


@pytest.mark.parametrize(
    ("reference", "expected"),
    [
        ("no_such_pkg.models:Net", "--model: no module named 'no_such_pkg.models'"),
        ("tests.fixtures.models:Nope", "module 'tests.fixtures.models' has no attribute 'Nope'"),
        ("tests.fixtures.models:small", "has no attribute 'small'; did you mean 'Small'"),
        ("tests/fixtures/missing.py:Net", "file 'tests/fixtures/missing.py' does not exist"),
        (
            "tests/fixtures/broken_import.py:Net",
            "importing 'tests/fixtures/broken_import.py' raised RuntimeError: this module",
        ),
        (
            "tests.fixtures.models:NOT_CALLABLE",
            "is a int, expected an nn.Module subclass or a zero-argument factory",
        ),
        ("tests.fixtures.models:NotAModule", "which is not a torch.nn.Module subclass"),
        ("tests.fixtures.models", "must look like 'package.module:Name'"),
    ],
)
def test_bad_model_references_are_one_line(reference: str, expected: str) -> None:
    with pytest.raises(WorkloadError) as error:
        check_workload(WorkloadSpec(model=reference))
    assert expected in str(error.value)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    ("reference", "expected"),
    [
        ("tests.fixtures.models:returns_a_list", "returned a list, expected a torch.nn.Module"),
        (
            "tests.fixtures.models:NeedsArguments",
            "could not be built: TypeError: NeedsArguments.__init__() missing 1 required",
        ),
    ],
)
def test_models_that_do_not_build_are_one_line(reference: str, expected: str) -> None:
    with pytest.raises(WorkloadError) as error:
        load_model(reference)
    assert expected in str(error.value)


def test_model_from_a_file_path_and_dataset_from_its_module() -> None:
    workload = build_workload(WorkloadSpec(model="tests/fixtures/models.py:Small"))
    assert type(workload.model).__name__ == "Small"
    assert workload.data_source.endswith(":autotune_dataset")
    x, y = workload.dataset[0]
    assert x.shape == (8,) and y.dtype == torch.int64


def test_synthetic_data_from_example_input_and_from_shape() -> None:
    workload = build_workload(WorkloadSpec(model="tests.fixtures.nodata:WithExample"))
    assert workload.dataset[3].shape == (5,)
    assert "example_input" in workload.data_source
    shaped = build_workload(
        WorkloadSpec(model="tests.fixtures.nodata:Bare", input_shape=(6,), input_dtype="float32")
    )
    assert shaped.dataset[0].shape == (6,)
    assert torch.equal(shaped.dataset[1], shaped.dataset[1])  # deterministic per index


def test_synthetic_token_ids_stay_inside_the_models_lookup_tables() -> None:
    # A user's --input-shape 16 --input-dtype int64 drew ids below 1,000 for a table of 100
    # rows: every trial failed with "index out of range in self".
    spec = WorkloadSpec(
        model="tests.fixtures.nodata:Lookup", input_shape=(16,), input_dtype="int64"
    )
    workload = build_workload(spec)
    ids = torch.stack([workload.dataset[i] for i in range(64)])
    assert ids.dtype == torch.int64 and int(ids.max()) < 50 and int(ids.max()) > 25
    assert workload.data_source == (
        "synthetic int64[16] in [0, 50) (the model's smallest lookup table)"
    )
    workload.model(ids)  # every id indexes both tables
    trial = run_trial(
        "tests.fixtures.nodata:Lookup", {"global_batch_size": 8, "device": "cpu"},
        input_shape=(16,), input_dtype="int64", warmup_steps=1, measured_steps=2,
        target_interval=0,
    )  # fmt: skip
    assert trial.status == "ok", trial.message
    assert trial.data == workload.data_source  # and the trial says the range it drew from
    assert trial.loss_rule == "the output's mean square (no target: speed only)"
    assert "last " in format_trial(trial) and ": the output's mean square" in format_trial(trial)
    assert data_source(spec) == workload.data_source  # as the search's first lines do
    bare = build_workload(
        WorkloadSpec(model="tests.fixtures.nodata:Bare", input_shape=(6,), input_dtype="int32")
    )
    assert bare.data_source == "synthetic int32[6] in [0, 1000)"
    assert int(bare.dataset[0].max()) < 1000
    flags = build_workload(
        WorkloadSpec(model="tests.fixtures.nodata:Bare", input_shape=(6,), input_dtype="bool")
    )
    assert flags.dataset[0].dtype == torch.bool


NET_OF_WIDTH = (
    "class Net(nn.Module):\n"
    "    def __init__(self):\n        super().__init__(); self.f = nn.Linear(WIDTH, 2)\n"
    "    def forward(self, x):\n        return self.f(x)\n"
)
"""A model file's Net, whose input width ``WIDTH`` comes from wherever the file imports it."""


def test_a_model_file_imports_the_modules_beside_it(tmp_path: Path) -> None:
    # `python sub/model.py` imports sub/helpers.py; `--model sub/model.py:Net` failed with
    # "No module named 'helpers'".
    (tmp_path / "helpers_beside.py").write_text("import torch.nn as nn\nWIDTH = 3\n")
    (tmp_path / "beside.py").write_text(
        "import torch.nn as nn\nfrom helpers_beside import WIDTH\n"
        + NET_OF_WIDTH
        + "autotune_dataset = [(i * 1.0 + __import__('torch').zeros(3), i % 2) for i in range(8)]\n"
    )
    workload = build_workload(WorkloadSpec(model=f"{tmp_path}/beside.py:Net"))
    assert workload.model.f.in_features == 3
    # a plain list of samples is a dataset, as a DataLoader takes it
    assert isinstance(workload.dataset, list) and len(workload.dataset) == 8


def test_a_model_file_inside_a_package_takes_its_relative_imports(tmp_path: Path) -> None:
    # `--model src/pkg_rel/model.py:Net`, whose model.py says `from .layers import WIDTH`,
    # failed with "attempted relative import with no known parent package".
    package = tmp_path / "src" / "pkg_rel"
    (package / "sub").mkdir(parents=True)
    for directory in (package, package / "sub"):
        (directory / "__init__.py").write_text("")
    (package / "layers.py").write_text("WIDTH = 5\n")
    (package / "sub" / "model.py").write_text(
        "import torch.nn as nn\nfrom ..layers import WIDTH\n" + NET_OF_WIDTH
    )
    workload = build_workload(WorkloadSpec(model=f"{package}/sub/model.py:Net", input_shape=(5,)))
    assert workload.model.f.in_features == 5
    assert type(workload.model).__module__ == "pkg_rel.sub.model"  # as `python -m` names it
    # a file in a directory that shares its package's name with an installed one is loaded
    # by itself, not as the installed package's module
    shadow = tmp_path / "elsewhere" / "json"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("")
    (shadow / "net.py").write_text(
        "import torch.nn as nn\nclass Net(nn.Linear):\n"
        "    def __init__(self):\n        super().__init__(4, 2)\n"
    )
    assert build_workload(WorkloadSpec(model=f"{shadow}/net.py:Net", input_shape=(4,))).model


def test_samples_by_index_are_a_dataset_and_a_mapping_is_not() -> None:
    class Table:  # a Hugging Face datasets.Dataset is not a torch Dataset: it is indexed
        def __len__(self) -> int:
            return 4

        def __getitem__(self, index: int) -> torch.Tensor:
            return torch.full((6,), float(index))

    assert isinstance(_instantiate_dataset(Table(), None, "m:t", "--data")[0], Table)
    with pytest.raises(WorkloadError, match=r"gave a dict, expected a torch\.utils\.data\.Data"):
        _instantiate_dataset({"x": 1}, None, "m:MAPPING", "--data")


@pytest.mark.slow  # one model's message from a trial
@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_a_forward_that_asks_for_cuda_on_a_cpu_says_the_fix() -> None:
    trial = run_trial(
        "tests.fixtures.nodata:AsksForCuda", {"global_batch_size": 8, "device": "cpu"},
        **FEW,
    )  # fmt: skip
    assert trial.status == "error"
    assert trial.message.endswith(
        "(the model asks for CUDA, which this machine lacks: make tensors inside the model on "
        "its input's device (device=x.device) or register them as buffers, which move with it)"
    ), trial.message


def test_no_data_at_all_says_what_to_pass() -> None:
    with pytest.raises(WorkloadError, match="pass --data module:attr"):
        build_workload(WorkloadSpec(model="tests.fixtures.nodata:Bare"))


def test_an_input_shape_beside_a_source_of_data_that_comes_first_is_refused() -> None:
    # A user gave --data and --input-shape; the shape was silently ignored.
    said = r"^--input-shape 3x64 would be ignored: the data comes from --data tests\.fixtures"
    with pytest.raises(WorkloadError, match=said + r"\.models:Pairs \(the first of"):
        check_workload(
            WorkloadSpec(
                model="tests.fixtures.nodata:Bare",
                data="tests.fixtures.models:Pairs",
                input_shape=(3, 64),
            )
        )
    with pytest.raises(WorkloadError, match=r"comes from tests\.fixtures\.models:autotune_data"):
        check_workload(WorkloadSpec(model="tests.fixtures.models:Small", input_shape=(8,)))
    with pytest.raises(WorkloadError, match="the model has 'example_input'"):
        build_workload(WorkloadSpec(model="tests.fixtures.nodata:WithExample", input_shape=(5,)))
    with pytest.raises(WorkloadError, match="--input-dtype int64 shapes synthetic samples and "):
        check_workload(WorkloadSpec(model="tests.fixtures.models:Small", input_dtype="int64"))


def test_named_data_and_loss_are_used() -> None:
    workload = build_workload(
        WorkloadSpec(
            model="tests.fixtures.nodata:Bare",
            data="tests.fixtures.models:Pairs",
            loss="tests.fixtures.models:l1_loss",
        )
    )
    assert workload.loss.__name__ == "l1_loss"
    assert len(workload.dataset) == 256


def test_the_model_modules_loss_is_used_unless_loss_is_given(tmp_path: Path) -> None:
    (tmp_path / "mine.py").write_text(
        "from tests.fixtures.models import Pairs, Small, l1_loss\n"
        "autotune_dataset = Pairs\n"
        "autotune_loss = l1_loss\n"
    )
    model = f"{tmp_path}/mine.py:Small"
    workload = build_workload(WorkloadSpec(model=model))
    assert workload.loss.__name__ == "l1_loss"
    assert workload.loss_source == f"{tmp_path}/mine.py:autotune_loss"
    given = build_workload(WorkloadSpec(model=model, loss="torch.nn.functional:mse_loss"))
    assert given.loss.__name__ == "mse_loss" and given.loss_source.startswith("--loss ")
    (tmp_path / "bad.py").write_text("from tests.fixtures.models import Small\nautotune_loss = 3\n")
    with pytest.raises(WorkloadError, match=r"bad\.py:autotune_loss' is a int, expected a call"):
        check_workload(WorkloadSpec(model=f"{tmp_path}/bad.py:Small"))


def test_bad_loss_and_dtype_references() -> None:
    with pytest.raises(
        WorkloadError, match=r"--loss 'tests\.fixtures\.models:NOT_CALLABLE' is a int"
    ):
        check_workload(
            WorkloadSpec(
                model="tests.fixtures.models:Small", loss="tests.fixtures.models:NOT_CALLABLE"
            )
        )
    with pytest.raises(WorkloadError, match="--input-dtype 'floaty' is not a torch dtype"):
        check_workload(
            WorkloadSpec(model="tests.fixtures.nodata:Bare", input_shape=(2,), input_dtype="floaty")
        )


class _HFOutput:
    def __init__(self, loss: torch.Tensor) -> None:
        self.loss = loss
        self.logits = torch.zeros(2, 3)


def test_default_loss_rules_and_the_words_for_each() -> None:
    # The trial's report says which rule made its loss (the rank reads ``rule``).
    scalar = torch.tensor(1.5)
    assert default_loss(scalar, None) is scalar
    assert default_loss.rule == "the model's scalar output"
    assert default_loss(_HFOutput(torch.tensor(2.0)), None).item() == 2.0
    assert default_loss.rule == "the model output's .loss"
    assert default_loss({"loss": torch.tensor(3.0)}, None).item() == 3.0
    assert default_loss.rule == "the model output's 'loss'"
    # (loss, logits), as Hugging Face returns with return_dict=False: the loss was taken as the
    # class scores, "cross-entropy cannot pair the output [] with the integer target [32]"
    assert default_loss((torch.tensor(4.0), torch.zeros(2, 3)), torch.tensor([0, 1])) == 4.0
    assert default_loss.rule == "the scalar first in the model's output, (loss, ...)"
    logits = torch.tensor([[10.0, 0.0], [0.0, 10.0]])
    assert default_loss(logits, torch.tensor([0, 1])).item() < 1e-3  # cross-entropy
    assert default_loss.rule.startswith("cross-entropy against the integer targets")
    assert default_loss(torch.ones(2), torch.zeros(2)).item() == 1.0  # mean squared error
    assert default_loss.rule == "mean squared error against the floating targets"
    assert default_loss(torch.full((2,), 2.0), None).item() == 4.0  # no target: mean square
    assert default_loss.rule == "the output's mean square (no target: speed only)"


def test_the_model_modules_collate_function_is_used_unless_collate_is_given() -> None:
    from torch.utils.data import default_collate

    tagger = WorkloadSpec(model="tests.fixtures.padded:Tagger")
    workload = build_workload(tagger)
    assert workload.collate is not None and workload.collate.__name__ == "autotune_collate"
    assert workload.collate_source == "tests.fixtures.padded:autotune_collate"
    given = build_workload(
        WorkloadSpec(model=tagger.model, collate="torch.utils.data:default_collate")
    )
    assert given.collate is default_collate
    assert given.collate_source == "--collate torch.utils.data:default_collate"
    assert build_workload(WorkloadSpec(model="tests.fixtures.models:Small")).collate is None
    # a rank running trial after trial gets a fresh model, and the same collate function
    cache = WorkloadCache()
    first, second = cache.get(tagger), cache.get(tagger)
    assert first.collate is not None and first.collate is second.collate
    assert first.collate.__name__ == "autotune_collate" and first.model is not second.model
    bad = "tests.fixtures.models:NOT_CALLABLE"
    with pytest.raises(WorkloadError, match=f"--collate '{bad}' is a int, expected a callable"):
        check_workload(WorkloadSpec(model=tagger.model, collate=bad))


def test_lazy_modules_take_their_shapes_where_the_workload_is_built() -> None:
    # DDP and FSDP refuse uninitialized parameters ("Run a dummy forward pass"): the workload
    # runs that forward once, in eval mode, and leaves the model in training mode.
    from tests.fixtures.lazy import CLASSES, FEATURES, HIDDEN

    workload = build_workload(WorkloadSpec(model="tests.fixtures.lazy:LazyMLP"))
    shapes = [tuple(p.shape) for p in workload.model.parameters()]
    assert shapes == [
        (HIDDEN, FEATURES),
        (HIDDEN,),
        (HIDDEN,),
        (HIDDEN,),
        (CLASSES, HIDDEN),
        (CLASSES,),
    ]
    assert workload.model.training
    batch_norm = workload.model.net[1]
    assert int(batch_norm.num_batches_tracked) == 0  # statistics untouched by that forward


@pytest.mark.slow
@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_a_model_of_lazy_modules_trains_under_ddp_and_fsdp(parallel: str) -> None:
    config = {"global_batch_size": 16, "parallel": parallel, "world_size": 2, "device": "cpu"}
    result = run_trial("tests.fixtures.lazy:LazyMLP", config, **FEW)
    assert result.status == "ok", result.message


def test_a_model_that_cannot_be_deep_copied_is_built_again_for_each_trial() -> None:
    # A Ray gang's ranks keep the workload between trials and copy its model: a model holding
    # a lock failed every trial of a search, though a trial of its own ran.
    cache = WorkloadCache()
    spec = WorkloadSpec(model="tests.fixtures.models:HoldsALock")
    first, second = cache.get(spec), cache.get(spec)
    assert first.model is not second.model and first.model.lock is not second.model.lock
    assert first.dataset is second.dataset


def test_a_model_its_factory_builds_on_the_meta_device_is_refused_where_ranks_build_it() -> None:
    # Every trial failed as it moved the model ("Cannot copy out of meta tensor"), said as a
    # configuration's failure.
    with pytest.raises(WorkloadError) as raised:
        build_workload(WorkloadSpec(model="tests.fixtures.traced:stack_on_meta"))
    message = str(raised.value)
    assert message.startswith(
        "--model 'tests.fixtures.traced:stack_on_meta' builds its tensors on the meta device "
        "(blocks.0.0.weight, blocks.0.0.bias, blocks.0.2.weight and 13 more)"
    )
    assert "to_empty" in message and "autotune plan" in message and "\n" not in message
