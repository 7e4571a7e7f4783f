from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from autotune.cli import main
from autotune.config import load_config
from tests.helpers import exit_code, run_cli


def test_trial_prints_a_summary_and_writes_the_record(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "cfg.yaml"
    config.write_text("global_batch_size: 16\nparallel: ddp\nworld_size: 2\n")
    out = tmp_path / "result.json"
    code = main(
        [
            "trial",
            "--model",
            "tests.fixtures.models:Small",
            "--config",
            str(config),
            "--comm-hook",
            "fp16",
            "--measured-steps",
            "3",
            "--warmup-steps",
            "1",
            "--target-interval",  # the adaptive window's default: test_json_output_is_the_record
            "0",
            "--out",
            str(out),
        ]
    )
    printed = capsys.readouterr().out
    assert code == 0
    assert printed.startswith("trial ok  ddpx2 amp=off hook=fp16")
    assert "samples/s" in printed and "peak memory" in printed
    record = json.loads(out.read_text())
    assert record["status"] == "ok"
    assert record["config"]["comm_hook"] == "fp16"  # the flag overrode the file
    assert record["samples_per_s"] > 0


def test_json_output_is_the_record(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "trial",
            "--model",
            "tests.fixtures.nodata:Bare",
            "--input-shape",
            "6",
            "--global-batch-size",
            "8",
            "--measured-steps",
            "2",
            "--warmup-steps",
            "1",
            "--max-measure-s",  # the adaptive window, capped: a noisy box ran it to 10 s
            "2",
            "--json",
        ]
    )
    record = json.loads(capsys.readouterr().out)
    assert code == 0
    assert record["status"] == "ok"
    # 1 warm-up + at least 2 measured + the one that measures an epoch boundary
    assert record["ranks"][0]["diagnostics"]["optimizer_steps"] == 1 + record["measured_steps"] + 1
    assert record["measured_steps"] >= 2


def test_a_failing_trial_exits_1_with_its_reason(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "trial",
            "--model",
            "tests.fixtures.models:Raising",
            "--global-batch-size",
            "8",
            "--measured-steps",
            "2",
            "--warmup-steps",
            "1",
        ]
    )
    assert code == 1
    assert "ValueError: shape mismatch in layer 3" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (
            ["--model", "nowhere.mod:Net", "--global-batch-size", "8"],
            "autotune: error: --model: no module named 'nowhere.mod'",
        ),
        (
            ["--model", "tests.fixtures.models:Small"],
            "autotune: error: --global-batch-size is required",
        ),
        (
            ["--model", "tests.fixtures.models:Small", "--global-batch-size", "8", "--amp", "fp8"],
            "autotune: error: argument --amp: invalid choice: 'fp8'",
        ),
        (
            [
                "--model",
                "tests.fixtures.models:Small",
                "--global-batch-size",
                "9",
                "--parallel",
                "ddp",
                "--world-size",
                "2",
            ],
            "autotune: error: invalid flags: global_batch_size=9 is not divisible",
        ),
        (
            [
                "--model",
                "tests.fixtures.models:Small",
                "--global-batch-size",
                "8",
                "--memory-limit",
                "lots",
            ],
            "'lots' is not a size",
        ),
        (
            [
                "--model",
                "tests.fixtures.models:Small",
                "--global-batch-size",
                "8",
                "--config",
                "missing.yaml",
            ],
            "cannot read config file 'missing.yaml'",
        ),
        (
            [
                "--model",
                "tests.fixtures.models:Small",
                "--global-batch-size",
                "8",
                "--checkpoint-segments",
                "3",
            ],
            "checkpoint_segments=3 exceeds the 2 repeated Sequential blocks of Small",
        ),
    ],
)
def test_bad_input_is_one_line_with_exit_code_2(
    argv: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert exit_code(["trial", *argv]) == 2
    err = capsys.readouterr().err
    assert expected in err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_a_trial_without_a_global_batch_finds_a_model_in_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # the global batch the model's module may declare is looked up where the model is built
    # from: it said "no module named" of a module a search and a given batch found
    (tmp_path / "here_only_model.py").write_text(
        "import torch\nNet = torch.nn.Linear\nautotune_global_batch_size = 0\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    assert exit_code(["trial", "--model", "here_only_model:Net"]) == 2
    err = capsys.readouterr().err
    assert "here_only_model.autotune_global_batch_size = 0: expected a positive int" in err


def test_console_script_exit_code_and_no_traceback() -> None:
    process = run_cli("trial", "--model", "nowhere:Net", "--global-batch-size", "8")
    assert process.returncode == 2
    assert process.stderr.strip() == (
        "autotune: error: --model: no module named 'nowhere' (is it installed or on PYTHONPATH?)"
    )


def test_debug_shows_the_traceback() -> None:
    process = run_cli("trial", "--model", "nowhere:Net", "--global-batch-size", "8", "--debug")
    assert process.returncode != 0
    assert "Traceback" in process.stderr


def test_import_autotune_is_cheap() -> None:
    code = (
        "import sys, autotune; autotune.__version__; "
        "print(sorted(m for m in ('torch', 'ray', 'optuna', 'matplotlib') if m in sys.modules))"
    )
    process = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert process.stdout.strip() == "[]"


def test_the_commands_that_measure_or_predict_have_python_twins_at_the_top_level() -> None:
    import autotune
    import autotune.api

    twins = {"trial": "run_trial", "search": "tune", "plan": "plan"}
    for name in twins.values():
        assert name in autotune.__all__ and getattr(autotune, name) is getattr(autotune.api, name)


def test_example_config_in_the_repo_is_valid() -> None:
    config = load_config(Path("examples/trial.yaml"))
    assert config.global_batch_size > 0


@pytest.mark.parametrize("command", ["trial", "search", "export", "show", "report", "plan"])
def test_every_command_prints_its_help(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as raised:  # a '%' in a description once broke it
        main([command, "--help"])
    assert raised.value.code == 0
    assert "--" in capsys.readouterr().out


def test_the_top_level_help_says_what_the_tool_does_and_how_to_start(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # it printed the module's docstring: "Command line: a thin layer over ``autotune.api``."
    with pytest.raises(SystemExit) as raised:
        main(["--help"])
    assert raised.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "fastest training configuration" in out and "``" not in out
    assert "autotune search --model mymodule:Model" in out and "Exit codes: 0 ok" in out


@pytest.mark.parametrize("command", ["show", "report", "export"])
def test_reading_a_storage_that_is_not_there_creates_nothing(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # a typo in --storage once created an empty database and `show` listed no study, exit 0
    missing = tmp_path / "typo.db"
    assert exit_code([command, "--storage", str(missing)]) == 2
    err = capsys.readouterr().err
    assert f"--storage '{missing}': no such file" in err and len(err.strip().splitlines()) == 1
    assert not missing.exists()


def test_a_storage_without_a_study_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import optuna

    empty = tmp_path / "empty.db"
    optuna.storages.RDBStorage(f"sqlite:///{empty}")
    for command in ("show", "export"):
        assert exit_code([command, "--storage", str(empty)]) == 2
        assert "holds no study yet" in capsys.readouterr().err


def test_an_output_that_cannot_be_written_stops_a_search_before_it_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A search once ran to its end and then failed on --out's missing folder ("[Errno 2]").
    import autotune.cli as cli

    def no_search(*args: object, **kwargs: object) -> None:
        raise AssertionError("the search started")

    monkeypatch.setattr(cli, "tune", no_search)
    (tmp_path / "taken").write_text("")
    search = ["search", "--model", "tests.fixtures.models:Small", "--global-batch-size", "8"]
    for flag, path, said in (
        ("--out", tmp_path, "is a folder"),
        ("--out", tmp_path / "taken" / "best.yaml", "its folder cannot be made"),
        ("--report", tmp_path / "taken" / "r.html", "its folder cannot be made"),
        # a folder that answers os.access as writable, where no file can be made (as root)
        ("--out", Path("/proc/autotune-best.yaml"), "cannot be written"),
    ):
        assert exit_code([*search, flag, str(path)]) == 2
        err = capsys.readouterr().err
        assert said in err and str(path) in err and len(err.strip().splitlines()) == 1
    # a folder that is only missing is made, as a user writing to runs/best.yaml expects
    with pytest.raises(AssertionError, match="the search started"):
        exit_code([*search, "--out", str(tmp_path / "runs" / "best.yaml")])
    assert (tmp_path / "runs").is_dir()
    assert not (tmp_path / "runs" / "best.yaml").exists()  # the check leaves no file behind


def test_a_search_whose_output_fails_at_its_end_still_prints_its_result(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # --out could be written when the search began, and not when it ended (here: its folder
    # became a file; a disk that filled): the result was lost to "[Errno 2] ..." alone
    import autotune.cli as cli
    from tests.test_export import _recommendation

    runs = tmp_path / "runs"
    monkeypatch.setattr(cli, "tune", _losing_the_folder(runs, _recommendation({})))
    argv = ["search", "--model", "tests.fixtures.models:Small", "--global-batch-size", "32"]
    argv += ["--storage", str(tmp_path / "s.db"), "--out", str(runs / "best.yaml")]
    assert exit_code(argv) == 2
    shown = capsys.readouterr()
    assert "recommended" in shown.out and "speed-up" in shown.out
    assert "written to" not in shown.out
    (line,) = shown.err.strip().splitlines()
    assert f"--out '{runs / 'best.yaml'}' could not be written (Not a directory)" in line
    assert "`autotune export`" in line


def _losing_the_folder(folder: Path, result: object) -> Callable[..., object]:
    """A search or trial that returns ``result`` after ``folder`` became a file: the output
    checked writable before it started cannot be written at its end."""
    import shutil

    def run(*args: object, **kwargs: object) -> object:
        shutil.rmtree(folder)
        folder.write_text("")
        return result

    return run


def test_a_trial_whose_output_fails_at_its_end_still_prints_its_result(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import autotune.cli as cli
    from autotune.config import make_config
    from autotune.result import TrialResult

    runs = tmp_path / "runs"
    config = make_config({"global_batch_size": 8, "device": "cpu"})
    broke = TrialResult(config=config, status="error", message="rank 0: it broke")
    monkeypatch.setattr(cli, "run_trial", _losing_the_folder(runs, broke))
    argv = ["trial", "--model", "tests.fixtures.models:Small", "--global-batch-size", "8"]
    assert exit_code([*argv, "--device", "cpu", "--out", str(runs / "r.json")]) == 2
    shown = capsys.readouterr()
    assert "trial error" in shown.out and "rank 0: it broke" in shown.out
    (line,) = shown.err.strip().splitlines()
    assert "could not be written (Not a directory); the trial's result is printed above" in line


def test_json_on_stdout_stays_json_when_the_model_prints(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # `autotune plan --json | jq` failed: the model's prints, from its builds and forwards in
    # this process (the probe, the trace), came first on stdout.
    argv = ["plan", "--model", "tests.fixtures.models:Chatty", "--devices", "2"]
    argv += ["--device-memory", "1GiB", "--space", "quick", "--json", "--quiet"]
    assert main(argv) == 0
    shown = capsys.readouterr()
    assert json.loads(shown.out)["configurations"]
    assert "building Chatty" in shown.err and "forward of (2, 8)" in shown.err


def test_more_checkpointing_than_blocks_is_refused_before_a_rank_is_launched(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # the rank said so after a launch ("rank 0: applying the configuration: ..."): a build on
    # the meta device says it first
    def launched(*_: object) -> None:
        raise AssertionError("a rank was launched")

    monkeypatch.setattr("autotune.api.launch", launched)
    argv = ["trial", "--model", "tests.fixtures.models:Small", "--global-batch-size", "8"]
    assert exit_code([*argv, "--checkpoint-segments", "3"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("checkpoint_segments=3 exceeds the 2 repeated Sequential blocks of "
                        "Small; use 0..2")  # fmt: skip
    assert "rank 0" not in err


def test_sigterm_stops_a_command_as_ctrl_c_does_and_the_handler_before_comes_back() -> None:
    import os
    import signal
    import time

    from autotune.cli import SigtermWatch
    from autotune.errors import Terminated

    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt) as stop, SigtermWatch() as watch:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler raises at the next bytecode
    assert isinstance(stop.value, Terminated) and watch.received
    assert signal.getsignal(signal.SIGTERM) is before
    with SigtermWatch() as quiet:
        pass
    assert not quiet.received and signal.getsignal(signal.SIGTERM) is before


def test_a_search_stopped_before_its_study_opened_does_not_point_at_one(tmp_path: Path) -> None:
    import argparse

    from autotune.cli import _stopped

    db = tmp_path / "s.db"
    args = argparse.Namespace(command="search", set_storage=str(db))
    assert _stopped(args, True) == (
        "stopped by SIGTERM before anything was stored; the same command starts the search again"
    )
    db.write_text("")
    assert _stopped(args, False).startswith(
        f"interrupted: the trials that finished are stored in {db}"
    )


def test_show_names_the_trials_left_running_and_prints_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # a search stopped mid-trial (Ctrl-C, SIGTERM, SIGKILL) leaves it running in the study:
    # `show` listed only the finished ones, and had no form another tool reads
    import socket
    import time

    import optuna

    from autotune.search.storage import OWNER_ATTR, driver_id

    url = f"sqlite:///{tmp_path / 's.db'}"
    study = optuna.create_study(study_name="stopped", storage=url)
    gone = study.ask()  # its driver's process is gone: the next search re-queues it
    gone.set_user_attr(OWNER_ATTR, {"driver": f"{socket.gethostname()}:1:0", "expires": 0})
    live = study.ask()  # this process's: a search measuring it now
    live.set_user_attr(OWNER_ATTR, {"driver": driver_id(), "expires": time.time() + 600})

    assert exit_code(["show", "--storage", str(tmp_path / "s.db")]) == 0
    shown = capsys.readouterr().out
    assert f"{gone.number:>4}             running    left by a search that stopped" in shown
    assert f"{live.number:>4}             running    being measured by a search" in shown

    assert exit_code(["show", "--storage", str(tmp_path / "s.db"), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["study"] == "stopped" and data["trials"] == []
    assert data["running"] == [
        {"number": gone.number, "left_by_a_stopped_search": True},
        {"number": live.number, "left_by_a_stopped_search": False},
    ]
    assert data["recommendation"] is None  # the search did not finish

    optuna.create_study(study_name="other", storage=url)
    assert exit_code(["show", "--storage", str(tmp_path / "s.db"), "--json"]) == 2
    assert "holds 2 studies; pick one with --study-name: stopped, other" in capsys.readouterr().err


def test_trial_debug_shows_each_ranks_own_output(capsys: pytest.CaptureFixture[str]) -> None:
    # The ranks' prints and a failure's traceback went with the trial's temporary directory:
    # a user debugging a model saw one line of the error and none of the prints.
    argv = ["trial", "--model", "tests.fixtures.models:Chatty", "--global-batch-size", "8"]
    argv += ["--parallel", "ddp", "--world-size", "2", "--warmup-steps", "1"]
    argv += ["--measured-steps", "2", "--target-interval", "0", "--json"]
    assert main(argv) == 0
    quiet = capsys.readouterr()
    assert "rank 0's output" not in quiet.err and "forward of" not in quiet.err
    assert main([*argv, "--debug"]) == 0
    shown = capsys.readouterr()
    assert json.loads(shown.out)["status"] == "ok"  # stdout stays the result
    for rank in (0, 1):
        below = shown.err.split(f"--- rank {rank}'s output (below) ---\n")[1]
        assert below.startswith("building Chatty\n") or "forward of (4, 8)" in below
    raising = ["trial", "--model", "tests.fixtures.models:Raising", "--global-batch-size", "8"]
    assert main([*raising, "--debug"]) == 1
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err
    assert 'tests/fixtures/models.py", line' in err and "shape mismatch in layer 3" in err
