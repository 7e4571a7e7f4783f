"""Command line: a thin layer over ``autotune.api``.

    autotune trial --model workloads.gpt:gpt_tiny --global-batch-size 32 --parallel ddp \
        --world-size 2 --comm-hook fp16

Exit codes: ``EPILOG`` below, which ``autotune --help`` prints; bad input is one line on
stderr, no traceback unless --debug.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO

from autotune import __version__
from autotune.api import as_config, declared_global_batch_size, plan, run_trial, tune
from autotune.cli.flags import (
    EXIT_BAD_INPUT,
    EXIT_OK,
    EXIT_TRIAL_FAILED,
    Parser,
    given,
    model_flags,
    study_flags,
    workload_flags,
)
from autotune.config import TrainConfig, load_config, make_config, read_config_file, save_config
from autotune.errors import AutotuneError, Terminated
from autotune.export import FORMATS, notes_for, render
from autotune.html_report import write_report
from autotune.recommendation import Recommendation
from autotune.report import (
    format_costs,
    format_plan,
    format_recommendation,
    format_study,
    format_trial,
    study_json,
)
from autotune.runner.planned_gpu import GPUS
from autotune.runner.request import TrialOptions
from autotune.search.driver import load_recommendation
from autotune.search.plan import prediction_json
from autotune.search.progress import make_reporter
from autotune.search.settings import SECTIONS, SearchSettings, StorageSettings, make_settings
from autotune.secrets import redact

DESCRIPTION = (
    "Find the fastest training configuration of a PyTorch model whose peak memory stays inside "
    "its budget, by short real training trials."
)
EPILOG = (
    "Start with: autotune search --model mymodule:Model --global-batch-size 32 --devices 2 "
    "--out best.yaml (autotune plan predicts memory without running; autotune COMMAND -h for "
    "each command). Exit codes: 0 ok; 1 a trial ended otherwise (oom, crashed, timed out, "
    "error) or a plan with no configuration; 2 bad input, or a search that cannot recommend "
    "(one line saying why); 130 and 143 stopped by Ctrl-C and SIGTERM."
)


def build_parser() -> argparse.ArgumentParser:

    parser = Parser(prog="autotune", description=DESCRIPTION, epilog=EPILOG)
    parser.add_argument("--version", action="version", version=f"autotune {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=Parser)

    trial = commands.add_parser(
        "trial", help="Measure one training configuration with real training steps."
    )
    workload_flags(trial)
    trial.add_argument("--config", help="YAML/JSON file with TrainConfig fields.")
    model_flags(
        trial.add_argument_group("training configuration (override --config)"),
        TrainConfig,
        "cfg_",
    )
    run = trial.add_argument_group("measurement")
    model_flags(run, TrialOptions, "opt_")
    out = trial.add_argument_group("output")
    out.add_argument("--json", action="store_true", help="Print the TrialResult as JSON.")
    out.add_argument("--out", help="Also write the TrialResult JSON to this file.")

    search = commands.add_parser(
        "search", help="Find the fastest configuration that fits the memory budget."
    )
    workload_flags(search)
    top = search.add_argument_group("search")
    model_flags(top, SearchSettings, "set_", exclude=tuple(SECTIONS), require=True)
    for section, section_model in SECTIONS.items():
        model_flags(search.add_argument_group(section), section_model, "set_")
    shown = search.add_argument_group("output")
    shown.add_argument("--out", help="Write the recommended config here (YAML, or .json).")
    shown.add_argument("--json", action="store_true", help="Print the Recommendation as JSON.")
    shown.add_argument("--quiet", action="store_true", help="No progress display.")
    shown.add_argument("--report", help="Also write the HTML report to this file.")
    _cost_flags(search)

    export = commands.add_parser(
        "export", help="Write a stored recommendation, or a config file, for another tool."
    )
    study_flags(export)
    export.add_argument(
        "--config",
        help="Export this config file (trial schema, e.g. search --out's best.yaml) instead "
        "of a stored recommendation.",
    )
    export.add_argument(
        "--format",
        choices=list(FORMATS),
        default="yaml",
        help="yaml/json: autotune's schema; torchrun: a launch command; hf: TrainingArguments "
        "keyword arguments; lightning: Trainer and DataLoader arguments; accelerate: a config "
        "file.",
    )
    export.add_argument(
        "--script",
        default="train.py",
        help="Training script named in the torchrun command (train.py).",
    )
    export.add_argument("--out", help="Write to this file instead of standard output.")
    export.add_argument(
        "--config-file",
        help="torchrun: where the config the command names is written (default: "
        "autotune-best.yaml beside --out, or here); with --config, that file is named.",
    )

    report = commands.add_parser("report", help="Write a stored study's HTML report.")
    study_flags(report)
    report.add_argument("--out", default="autotune-report.html", help="autotune-report.html")
    _cost_flags(report)

    show = commands.add_parser("show", help="List the trials of a stored study.")
    study_flags(show)
    show.add_argument(
        "--json",
        action="store_true",
        help="Print the study as JSON: its trials' records, the trials running, and the "
        "recommendation (null before the search finished).",
    )

    planner = commands.add_parser(
        "plan",
        help="Predict every configuration's peak memory per device for a number of devices, "
        "without running a step (no GPU needed).",
    )
    workload_flags(planner)
    where = planner.add_argument_group("devices")
    where.add_argument("--devices", type=int, required=True, help="Devices to plan for.")
    where.add_argument(
        "--device-memory",
        help="Memory of one device, e.g. 80GiB (default: the --gpu's; one of them is needed).",
    )
    where.add_argument(
        "--gpu",
        metavar="NAME",
        help=f"The GPU a plan for CUDA is for, on a machine without one: {', '.join(GPUS)} "
        "(h100 unless given), or another by its capability and memory (8.9:48GiB): what the "
        "model's code is told of it, the attention kernels it has, and its memory.",
    )
    where.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default=None,
        help="Kind of device planned for: cuda (the default), or the --config's own device; "
        "cpu: ranks sharing this kind of host.",
    )
    where.add_argument(
        "--safety-margin",
        type=float,
        default=0.1,
        help="Share of device memory kept free: fits means peak <= memory * (1 - m) (0.1).",
    )
    what = planner.add_argument_group("what to plan")
    what.add_argument("--space", default="default", help="Search space: a name or a YAML file.")
    what.add_argument("--config", help="Plan this one configuration (YAML/JSON) instead.")
    what.add_argument(
        "--global-batch-size",
        type=int,
        help="Global batch (default: the model module's autotune_global_batch_size, else 32).",
    )
    what.add_argument(
        "--calibrate",
        action="store_true",
        help="First run one short real step here to measure what the process adds to its "
        "tensors (only when planning for this machine's kind of device).",
    )
    planner.add_argument("--json", action="store_true", help="Print the plan as JSON.")
    planner.add_argument("--quiet", action="store_true", help="No progress display.")

    for sub in (trial, search):
        sub.add_argument(
            "--debug",
            action="store_true",
            help="Show tracebacks, and each rank's own output (the model's prints and warnings, "
            "a failure's whole traceback) as each trial ends.",
        )
    for sub in (export, report, show, planner):
        sub.add_argument("--debug", action="store_true", help="Show tracebacks.")
    return parser


def _cost_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("time and cost to train")
    group.add_argument(
        "--train-samples",
        type=int,
        help="Samples the real training run will process (epochs x dataset length).",
    )
    group.add_argument(
        "--price-per-device-hour", type=float, help="Price of one device-hour, for a cost."
    )


def _check_cost_flags(args: argparse.Namespace) -> None:
    """Checked before any work starts, so a typo never costs a finished search."""
    if args.train_samples is None and args.price_per_device_hour is not None:
        raise AutotuneError("--price-per-device-hour needs --train-samples")
    if args.train_samples is not None and args.train_samples < 1:
        raise AutotuneError(f"--train-samples {args.train_samples} must be at least 1")
    if args.price_per_device_hour is not None and args.price_per_device_hour < 0:
        raise AutotuneError(f"--price-per-device-hour {args.price_per_device_hour} is negative")


def _check_outputs(*flags: tuple[str, str | None]) -> None:
    """Make sure each ``(flag, path)`` given can be written before any work starts (its folder
    made if missing): a search of hours must not end on a path that cannot be."""
    for flag, path in flags:
        if not path:
            continue
        target = Path(path)
        if target.is_dir():
            raise AutotuneError(f"{flag} {path!r} is a folder; give a file name")
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise AutotuneError(
                f"{flag} {path!r}: its folder cannot be made ({error.strerror or error})"
            ) from None
        existed = target.exists()
        try:  # opened, not asked (os.access): root passes the question and fails in /proc
            with target.open("a"):
                pass
        except OSError as error:
            raise AutotuneError(
                f"{flag} {path!r} cannot be written ({error.strerror or error})"
            ) from None
        if not existed:
            target.unlink(missing_ok=True)


def _costs(args: argparse.Namespace, recommendation: Any) -> str | None:

    if args.train_samples is None:
        return None
    return format_costs(recommendation, args.train_samples, args.price_per_device_hour)


def _report(args: argparse.Namespace) -> int:

    _check_cost_flags(args)
    _check_outputs(("--out", args.out))
    costs = _costs(args, load_recommendation(args.storage, args.study_name))
    _emit(f"wrote {write_report(args.storage, args.study_name, args.out, costs)}")
    return EXIT_OK


def _search(args: argparse.Namespace) -> int:

    _check_cost_flags(args)
    _check_outputs(("--out", args.out), ("--report", args.report))
    checked = make_settings(given(args, "set_"))
    reporter = make_reporter(args.quiet, checked.budget.trials)  # --json: progress on stderr
    recommendation = tune(
        args.model,
        data=args.data,
        loss=args.loss,
        optimizer=args.optimizer,
        collate=args.collate,
        input_shape=args.input_shape,
        input_dtype=args.input_dtype,
        reporter=reporter,
        rank_output=sys.stderr if args.debug else None,
        **checked.flat(),
    )
    r, storage = recommendation, checked.study.storage
    failed: list[str] = []  # a file that could not be written after all: said after the result
    out = args.out
    if out:  # the config, headed by what was measured (and any caveat) as comments
        fmt = "json" if Path(out).suffix == ".json" else "yaml"
        out = _written(out, "--out", failed, lambda: Path(out).write_text(render(r, fmt)))
    costs = _costs(args, r)
    report = args.report
    if report:
        report = _written(
            report, "--report", failed, lambda: write_report(storage, r.study_name, report, costs)
        )
    if args.json:
        _emit(r.to_json())
    else:
        _emit(format_recommendation(r, out))
        if costs:
            _emit(costs)
        if report:
            _emit(f"report written to {report}")
    if failed:
        raise AutotuneError(
            f"{'; '.join(failed)}; the recommendation is stored in {storage} (study "
            f"'{r.study_name}'): `autotune export` and `autotune report` write it again"
        )
    return EXIT_OK


def _written(path: str, flag: str, failed: list[str], write: Callable[[], object]) -> str | None:
    """``path`` once ``write`` wrote it; None, with the reason added to ``failed``, where it
    could not (a disk filled during the search): the result is printed all the same."""
    try:
        write()
    except OSError as error:
        failed.append(f"{flag} {path!r} could not be written ({error.strerror or error})")
        return None
    return path


def _export(args: argparse.Namespace) -> int:
    target: TrainConfig | Recommendation
    _check_outputs(("--out", args.out))
    if args.config:
        target = load_config(args.config)
        config_file = args.config_file or args.config
    else:
        target = load_recommendation(args.storage, args.study_name)
        beside = Path(args.out).parent if args.out else Path()
        config_file = args.config_file or str(beside / "autotune-best.yaml")
    text = render(target, args.format, script=args.script, config_file=config_file)
    for note in notes_for(target, args.format):
        print(f"autotune: note: {note}", file=sys.stderr)
    if args.format == "torchrun" and config_file != args.config:
        save_config(target.config if isinstance(target, Recommendation) else target, config_file)
        print(f"wrote the config the command reads to {config_file}", file=sys.stderr)
    if args.out:
        Path(args.out).write_text(text)
        print(f"wrote {args.format} to {args.out}", file=sys.stderr)
    else:
        _emit(text, end="")
    return EXIT_OK


def _plan(args: argparse.Namespace) -> int:
    config: Any = None
    if args.config:
        values = read_config_file(args.config)
        if args.global_batch_size is not None:
            values["global_batch_size"] = args.global_batch_size
        config = make_config(values, source=f"config {args.config!r}")
    result = plan(
        args.model,
        devices=args.devices,
        device_memory=args.device_memory,
        device=args.device,
        gpu=args.gpu,
        space=args.space,
        config=config,
        global_batch_size=args.global_batch_size,
        safety_margin=args.safety_margin,
        calibrate=args.calibrate,
        data=args.data,
        loss=args.loss,
        optimizer=args.optimizer,
        collate=args.collate,
        input_shape=args.input_shape,
        input_dtype=args.input_dtype,
        progress=not args.quiet,
    )
    if args.json and config is not None and result.rows:
        row = result.rows[0]
        fits = row.fits(result.limit_bytes)
        _emit(
            json.dumps(
                {
                    **prediction_json(row.prediction, row.config),
                    "limit_bytes": result.limit_bytes,
                    "fits": fits,
                    "calibration": result.calibration,
                    "optimizer": result.optimizer,
                    "gpu": result.gpu_json(),
                    "assumption": result.assumption,  # what the prediction rests on
                    "needs_find_unused_parameters": result.needs_find_unused_parameters,
                },
                indent=2,
            )
        )
    else:
        _emit(result.to_json() if args.json else format_plan(result, args.model))
    return EXIT_OK if result.rows else EXIT_TRIAL_FAILED


def _show(args: argparse.Namespace) -> int:

    if args.json:
        _emit(json.dumps(study_json(args.storage, args.study_name), indent=2))
    else:
        _emit(format_study(args.storage, args.study_name))
    return EXIT_OK


def _trial(args: argparse.Namespace) -> int:
    values = {**(read_config_file(args.config) if args.config else {}), **given(args, "cfg_")}
    source = f"config {args.config!r} with flags" if args.config else "flags"
    if "global_batch_size" not in values:
        values["global_batch_size"] = declared_global_batch_size(args.model)

    config = as_config(make_config(values, source=source))
    _check_outputs(("--out", args.out))
    options = given(args, "opt_")
    result = run_trial(
        args.model,
        config,
        data=args.data,
        loss=args.loss,
        optimizer=args.optimizer,
        collate=args.collate,
        input_shape=args.input_shape,
        input_dtype=args.input_dtype,
        rank_output=sys.stderr if args.debug else None,
        **options,
    )
    failed: list[str] = []  # --out could not be written after all: said after the result
    if args.out:
        text = result.to_json() + "\n"
        _written(args.out, "--out", failed, lambda: Path(args.out).write_text(text))
    if result.status == "invalid" and not args.json:
        print(f"autotune: error: {result.message}", file=sys.stderr)
        return EXIT_BAD_INPUT
    _emit(result.to_json() if args.json else format_trial(result))
    if failed:
        raise AutotuneError(f"{failed[0]}; the trial's result is printed above")
    if result.status == "invalid":
        return EXIT_BAD_INPUT
    return EXIT_OK if result.ok else EXIT_TRIAL_FAILED


_results: list[TextIO] = []
"""Where a running command's result goes: stdout as the command started (``_emit``)."""


def _emit(*values: Any, end: str = "\n") -> None:
    """Print a command's result on stdout. While a command runs, anything else printed there
    (a user's model printing in its forward, built in this process for the probe or a plan)
    goes to stderr, so that ``--json`` output stays JSON that other tools read."""
    print(*values, end=end, file=_results[-1] if _results else sys.stdout)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _results.append(sys.stdout)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            return _run(args)
    finally:
        _results.pop()


def _run(args: argparse.Namespace) -> int:
    handlers = {
        "trial": _trial,
        "search": _search,
        "export": _export,
        "report": _report,
        "show": _show,
        "plan": _plan,
    }
    sigterm = SigtermWatch()
    try:
        with sigterm:
            return handlers[args.command](args)
    except AutotuneError as error:
        if args.debug:
            raise
        print(f"autotune: error: {_redacted(str(error), args)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print(f"autotune: {_redacted(_stopped(args, sigterm.received), args)}", file=sys.stderr)
        return EXIT_TERMINATED if sigterm.received else EXIT_INTERRUPTED
    except OSError as error:
        if args.debug:
            raise
        print(f"autotune: error: {_redacted(str(error), args)}", file=sys.stderr)
        return EXIT_BAD_INPUT


EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143
"""A shell's codes for a command ended by SIGINT (Ctrl-C) and by SIGTERM: 128 + the signal."""


class SigtermWatch:
    """For a command's length (``with``), SIGTERM raises ``Terminated`` in the main thread, as
    Ctrl-C raises ``KeyboardInterrupt``, and ``received`` says it came (Ray's waits turn either
    into a plain ``KeyboardInterrupt``). Without it the process ended where it stood, without a
    word; the handler before is put back after."""

    def __init__(self) -> None:
        self.received = False
        self._held: Any = None

    def _terminated(self, signum: int, frame: Any) -> None:
        self.received = True
        raise Terminated()

    def __enter__(self) -> SigtermWatch:
        if threading.current_thread() is threading.main_thread():
            self._held = signal.signal(signal.SIGTERM, self._terminated)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._held is not None:
            signal.signal(signal.SIGTERM, self._held)


def _stopped(args: argparse.Namespace, terminated: bool) -> str:
    """The line for a command stopped by Ctrl-C or SIGTERM: for a search, where what finished
    is and how to go on."""
    how = "stopped by SIGTERM" if terminated else "interrupted"
    if args.command != "search":
        return how
    storage = args.set_storage or StorageSettings().storage
    if "://" not in storage and not Path(storage).exists():  # stopped before the study opened
        return f"{how} before anything was stored; the same command starts the search again"
    return (
        f"{how}: the trials that finished are stored in {storage}; the same command resumes "
        "the search (--new-study starts it afresh)"
    )


def _redacted(text: str, args: argparse.Namespace) -> str:
    """A last guard: whatever an error says, the storage's password is not in it."""
    return redact(text, getattr(args, "storage", None), getattr(args, "set_storage", None))
