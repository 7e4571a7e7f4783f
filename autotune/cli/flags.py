"""Flags generated from the models, and the parser that reports bad input as one line."""

from __future__ import annotations

import argparse
import typing
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from autotune.search.settings import StorageSettings

EXIT_OK, EXIT_TRIAL_FAILED, EXIT_BAD_INPUT = 0, 1, 2


class Parser(argparse.ArgumentParser):
    """argparse that reports bad input as one line with exit code 2."""

    def error(self, message: str) -> typing.NoReturn:
        self.exit(EXIT_BAD_INPUT, f"autotune: error: {message} (see --help)\n")


def _help(field: FieldInfo) -> str:
    default = field.default
    shown = "" if default in (None, PydanticUndefined) or isinstance(default, bool) else default
    text = (field.description or "") + (f" (default: {shown})" if shown != "" else "")
    return text.replace("%", "%%")  # argparse formats help with %


def model_flags(
    group: Any,
    model: type[BaseModel],
    prefix: str,
    exclude: tuple[str, ...] = (),
    require: bool = False,
) -> None:
    """One flag per field of ``model``, its help the field's description: a default is written
    once, in the model. ``dest`` is ``prefix + field``; a flag left out stays None."""
    for name, field in model.model_fields.items():
        if name in exclude:
            continue
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        flag = "--" + str(extra.get("flag", name.replace("_", "-")))
        kwargs: dict[str, Any] = {"dest": prefix + name, "default": None, "help": _help(field)}
        if require and field.is_required():
            kwargs["required"] = True
        kinds = [a for a in typing.get_args(field.annotation) if a is not type(None)]
        if field.annotation is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        elif typing.get_origin(field.annotation) is typing.Literal:
            kwargs["choices"] = typing.get_args(field.annotation)
        elif extra.get("text"):  # the model parses it (e.g. a duration such as 15m)
            kwargs["metavar"] = "TEXT"
        elif field.annotation is int or kinds == [int]:
            kwargs.update(type=int, metavar="N")
        elif field.annotation is float or kinds == [float]:
            kwargs.update(type=float, metavar="X")
        else:
            kwargs["metavar"] = name.upper()
        group.add_argument(flag, **kwargs)


def study_flags(parser: argparse.ArgumentParser) -> None:
    """--storage and --study-name of a stored study, as ``search`` names them."""
    group = parser.add_argument_group("study")
    model_flags(group, StorageSettings, "", exclude=("new_study",))
    parser.set_defaults(storage=StorageSettings().storage)


def given(args: argparse.Namespace, prefix: str) -> dict[str, Any]:
    """The flags of ``model_flags(..., prefix)`` that were given, by field name."""
    return {
        k.removeprefix(prefix): v
        for k, v in vars(args).items()
        if k.startswith(prefix) and v is not None
    }


def _shape(text: str) -> tuple[int, ...]:
    try:
        shape = tuple(int(part) for part in text.lower().replace(",", "x").split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a shape; use e.g. 3x224x224") from None
    if not shape or min(shape) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a shape; use e.g. 3x224x224")
    return shape


def workload_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("workload")
    group.add_argument("--model", required=True, help="'pkg.module:Model' or 'file.py:Model'.")
    group.add_argument("--data", help="'module:attr': a Dataset or a factory returning one.")
    group.add_argument("--loss", help="'module:attr': loss(output, target) -> scalar tensor.")
    group.add_argument(
        "--optimizer",
        help="'module:attr': a factory taking the parameters (or the model, where its first "
        "parameter is named model) and returning a torch.optim.Optimizer (default: "
        "autotune_optimizer in the model's module, else AdamW).",
    )
    group.add_argument(
        "--collate",
        help="'module:attr': collate(samples) -> batch, the DataLoader's collate_fn, e.g. to "
        "pad samples of different lengths (default: autotune_collate in the model's module, "
        "else torch's default_collate).",
    )
    group.add_argument("--input-shape", type=_shape, help="Synthetic sample shape, e.g. 3x32x32.")
    group.add_argument(
        "--input-dtype",
        default="float32",
        help="Synthetic sample dtype (float32 follows a model whose parameters are all float64).",
    )
