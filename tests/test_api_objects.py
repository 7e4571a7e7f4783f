"""The Python API takes the model (and its data, loss, optimizer, collate) as the objects a
pipeline already holds, where the ranks can import them; what they cannot is refused in one line."""

from __future__ import annotations

import subprocess
import sys
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
        (_Scripted, "model=__main__._Scripted: not found at the top level of the script being"),
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


SCRIPT = """
import torch
import autotune

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 2)

    def forward(self, x):
        return self.layer(x)

{guard}
    result = autotune.run_trial(Net, {{"global_batch_size": 8, "device": "cpu"}}, input_shape=(4,),
                                warmup_steps=1, measured_steps=2, target_interval=0)
    print(result.status, result.workload["model"])
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
        assert ran.stdout.split() == ["ok", "train.py:Net"]
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
