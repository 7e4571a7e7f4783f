"""The Python API takes the model (and its data, loss, optimizer, collate) as the objects a
pipeline already holds, where the ranks can import them; what they cannot is refused in one line."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from autotune.api import run_trial
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
        (_Scripted, "model=__main__._Scripted: defined in the script being run, which the ranks"),
        (_local(), "model=tests.test_api_objects._local.<locals>.Inner: defined in a function"),
        (optimizers.Wide(), "model=a Wide object: give the class or factory every rank builds"),
        (3, "model=an int object: give the class or factory"),
    ],
)
def test_what_the_ranks_cannot_import_is_refused_in_one_line(model: object, expected: str) -> None:
    with pytest.raises(ConfigError) as raised:
        run_trial(model, CONFIG, **FAST)  # type: ignore[arg-type]
    assert str(raised.value).startswith(expected)
    assert "\n" not in str(raised.value)
