"""Command line: a thin layer over ``autotune.api``.

    autotune trial --model workloads.gpt:gpt_tiny --global-batch-size 32 --parallel ddp \
        --world-size 2 --comm-hook fp16

Exit codes: 0 the trial ran ok; 1 the trial ended otherwise (oom, crashed, timed out, error);
2 bad input (one line on stderr, no traceback unless --debug).
"""

from __future__ import annotations

import argparse
import sys
import typing
from collections.abc import Sequence
from typing import Any

from autotune.errors import AutotuneError

EXIT_OK, EXIT_TRIAL_FAILED, EXIT_BAD_INPUT = 0, 1, 2


class _Parser(argparse.ArgumentParser):
    """argparse that reports bad input as one line with exit code 2."""

    def error(self, message: str) -> typing.NoReturn:
        self.exit(EXIT_BAD_INPUT, f"autotune: error: {message} (see --help)\n")


def _config_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per TrainConfig field, its help taken from the field's description."""
    from autotune.config import TrainConfig

    group = parser.add_argument_group("training configuration (override --config)")
    for name, field in TrainConfig.model_fields.items():
        flag = "--" + name.replace("_", "-")
        kwargs: dict[str, Any] = {"dest": f"cfg_{name}", "default": None, "help": field.description}
        choices = typing.get_args(field.annotation)
        if field.annotation is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        elif choices and all(isinstance(c, str) for c in choices):
            kwargs["choices"] = choices
        else:
            kwargs["type"] = int
            kwargs["metavar"] = "N"
        group.add_argument(flag, **kwargs)


def _shape(text: str) -> tuple[int, ...]:
    try:
        shape = tuple(int(part) for part in text.lower().replace(",", "x").split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a shape; use e.g. 3x224x224") from None
    if not shape or min(shape) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a shape; use e.g. 3x224x224")
    return shape


def _byte_size(text: str) -> int:
    from autotune.units import parse_bytes

    try:
        return parse_bytes(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _workload_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("workload")
    group.add_argument("--model", required=True, help="'pkg.module:Model' or 'file.py:Model'.")
    group.add_argument("--data", help="'module:attr': a Dataset or a factory returning one.")
    group.add_argument("--loss", help="'module:attr': loss(output, target) -> scalar tensor.")
    group.add_argument("--input-shape", type=_shape, help="Synthetic sample shape, e.g. 3x32x32.")
    group.add_argument("--input-dtype", default="float32", help="Synthetic sample dtype.")


def build_parser() -> argparse.ArgumentParser:
    from autotune import __version__

    parser = _Parser(prog="autotune", description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--version", action="version", version=f"autotune {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    trial = commands.add_parser(
        "trial", help="Measure one training configuration with real training steps."
    )
    _workload_flags(trial)
    trial.add_argument("--config", help="YAML/JSON file with TrainConfig fields.")
    _config_flags(trial)
    run = trial.add_argument_group("measurement")
    run.add_argument("--warmup-steps", type=int, help="Optimizer steps before measuring (2).")
    run.add_argument("--measured-steps", type=int, help="Optimizer steps measured (8).")
    run.add_argument("--timeout", type=float, dest="timeout_s", help="Trial time limit, s (300).")
    run.add_argument("--seed", type=int)
    run.add_argument(
        "--memory-limit",
        type=_byte_size,
        dest="memory_limit_bytes",
        help="Impose a per-rank memory limit, e.g. 4GiB; exceeding it is an oom.",
    )
    out = trial.add_argument_group("output")
    out.add_argument("--json", action="store_true", help="Print the TrialResult as JSON.")
    out.add_argument("--out", help="Also write the TrialResult JSON to this file.")
    for sub in (trial,):
        sub.add_argument("--debug", action="store_true", help="Show tracebacks.")
    return parser


def _trial(args: argparse.Namespace) -> int:
    from pathlib import Path

    from autotune.api import as_config, run_trial
    from autotune.config import read_config_file
    from autotune.report import format_trial

    values = read_config_file(args.config) if args.config else {}
    for key, value in vars(args).items():
        if key.startswith("cfg_") and value is not None:
            values[key.removeprefix("cfg_")] = value
    source = f"config {args.config!r} with flags" if args.config else "flags"
    if "global_batch_size" not in values:
        raise AutotuneError("--global-batch-size is required (or global_batch_size in --config)")
    from autotune.config import make_config

    config = as_config(make_config(values, source=source))
    options = {
        k: getattr(args, k)
        for k in ("warmup_steps", "measured_steps", "timeout_s", "seed", "memory_limit_bytes")
        if getattr(args, k) is not None
    }
    result = run_trial(
        args.model,
        config,
        data=args.data,
        loss=args.loss,
        input_shape=args.input_shape,
        input_dtype=args.input_dtype,
        **options,
    )
    if args.out:
        Path(args.out).write_text(result.to_json() + "\n")
    if result.status == "invalid" and not args.json:
        print(f"autotune: error: {result.message}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(result.to_json() if args.json else format_trial(result))
    if result.status == "invalid":
        return EXIT_BAD_INPUT
    return EXIT_OK if result.ok else EXIT_TRIAL_FAILED


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handlers = {"trial": _trial}
    try:
        return handlers[args.command](args)
    except AutotuneError as error:
        if args.debug:
            raise
        print(f"autotune: error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("autotune: interrupted", file=sys.stderr)
        return 130
    except OSError as error:
        if args.debug:
            raise
        print(f"autotune: error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
