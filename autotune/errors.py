"""Errors a user can cause: each carries a one-line sentence naming the bad value and what works."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError


class AutotuneError(Exception):
    """A problem with the user's input or environment, reported as one line without a traceback."""


class ConfigError(AutotuneError):
    """A training configuration or option that cannot be accepted."""


class SearchError(AutotuneError):
    """The search ended without a recommendation; every trial it ran is stored."""


class WorkloadError(AutotuneError):
    """The user's model, data or loss could not be loaded or used."""


class MutatedKeptOutput(RuntimeError):
    """A selectively checkpointed block wrote in place into an output it keeps for backward
    (``autotune.runner.selective_checkpoint``): the model's code and ``checkpoint_policy =
    "selective"`` do not go together, whatever else the configuration sets."""


class Terminated(KeyboardInterrupt):
    """A SIGTERM (``kill``, ``timeout``, a scheduler stopping the job), raised in the main thread
    as Ctrl-C's ``KeyboardInterrupt`` is, so that a command stops the same way: ranks killed,
    what finished kept stored (``cli.SigtermWatch`` installs it)."""


Model = TypeVar("Model", bound=BaseModel)


NOT_TENSORS = "the model was given"
"""How the note begins that an error raised by the model's forward carries when its inputs held
what is not a tensor (strings, which torch's default_collate leaves as tuples): the rank's
reason ends with it in brackets, and a search that stops on the error repeats it, since a
collate function is then the likely fix. A model may take such inputs (one that tokenizes its
own text): the note is added only when the forward failed."""


NO_CUDA_HERE = "the model asks for CUDA"
"""How the note begins that a forward failing for want of CUDA carries on a machine without it
(a tensor made with ``device="cuda"`` inside the model): the rank's reason ends with it in
brackets, as ``NOT_TENSORS``'s does."""
TUPLE_SPLIT = "a tuple batch is (inputs..., target)"
"""How the note begins that a forward given too many positional inputs carries where the batch
was a tuple of three or more (samples of (input, target, weight)): the rank's reason ends with
it in brackets, as ``NOT_TENSORS``'s does."""
DOUBLE_INPUTS = "the batch holds float64 tensors"
"""How the note begins that a forward failing on mixed dtypes carries where its inputs held
float64 tensors (samples from numpy arrays or pandas, float64 by default) while the model's
parameters are of another dtype: the rank's reason ends with it in brackets, as
``NOT_TENSORS``'s does."""
NO_TARGET = "the batch holds no target"
"""How the note begins that a loss failing on ``None`` carries where the batch gave it no
target (a lone tensor; synthetic samples of ``--input-shape``): the rank's reason ends with it
in brackets, as ``NOT_TENSORS``'s does."""
WHOLE_DICT = "the batch went whole to the forward"
"""How the note begins that a forward carries where it failed on a dict batch given whole as
its first argument (it takes none of the batch's keys by name): the rank's reason ends with it
in brackets, as ``NOT_TENSORS``'s does."""
DIVERGED = "the model's parameters are not finite"
"""How the note begins that a forward failing after an update that made parameters NaN or inf
carries (a model that checks its own values, DETR's box format, raised on them): the rank's
reason ends with it in brackets, as ``NOT_TENSORS``'s does."""
FSDP_CASTS = "FSDP casts its parameters to bf16"
"""How the note begins that a forward failing on mixed dtypes carries under FSDP's bf16
parameters (a float32 tensor the model makes itself met a bf16 weight): the rank's reason ends
with it in brackets, as ``NOT_TENSORS``'s does."""
COMPILED_WRITE = "under torch.compile alone"
"""How the note begins that a compiled step's backward carries where it failed on a tensor
written in place after it was saved (a graph break between its use and the write): the rank's
reason ends with it in brackets, as ``NOT_TENSORS``'s does."""
TARGET_AS_INPUT = "the forward was given the batch's target"
"""How the note begins that a forward carries where it failed after the batch's target went to
its last required parameter, as ``model(*batch)`` would pass it (``training.required_parameter``:
a discriminator's ``forward(x, y)``), where that parameter may be something else (an RNN's
``forward(input, hidden)``): the rank's reason ends with it in brackets, as ``NOT_TENSORS``'s
does."""
DICT_TARGET = "the loss was given the whole batch as its target"
"""How the note begins that a user's loss carries where it failed on a dict batch, which it is
given whole as its target (``split_batch``: a dict batch's target is the batch), as on a tensor:
the rank's reason ends with it in brackets, as ``NOT_TENSORS``'s does."""
NO_GROUP_HERE = "the model calls torch.distributed, which needs a process group"
"""How the note begins that a one-process step carries where the model's call into
``torch.distributed`` found no group: one beside SyncBatchNorm on a CPU, where a trial joins
none (``session.join_group_of_one``)."""
RANK_HINTS = (
    DIVERGED, NOT_TENSORS, NO_CUDA_HERE, TUPLE_SPLIT, DOUBLE_INPUTS, NO_TARGET, WHOLE_DICT,
    FSDP_CASTS, COMPILED_WRITE, NO_GROUP_HERE, TARGET_AS_INPUT, DICT_TARGET,
)  # fmt: skip
"""The notes a rank's reason ends with, in brackets, and a search that stops on it repeats."""
NO_CUDA_ERRORS = ("not compiled with CUDA", "no NVIDIA driver", "No CUDA GPUs are available")
"""What torch says when CUDA is asked of a machine without it (a CPU build; no driver; no GPU)."""


def rank_hint(message: str) -> str:
    """The note of ``RANK_HINTS`` at the end of a trial's reason ('' where there is none)."""
    for note in RANK_HINTS:
        _, found, rest = message.rpartition(f" ({note}")
        if found:
            return f"{note}{rest.removesuffix(')')}"
    return ""


def first_three(names: list[str]) -> str:
    """The first three of ``names``, and how many more."""
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if names[3:] else "")


def shortened(text: str, limit: int = 200) -> str:
    """``text`` cut to ``limit`` characters, marked where it was cut."""
    return text if len(text) <= limit else f"{text[:limit].rstrip()}..."


def shortened_keeping_hint(message: str, limit: int = 200) -> str:
    """A trial's reason cut to ``limit`` characters (``shortened``), but the note of
    ``RANK_HINTS`` it ends with (the fix the ranks named) kept whole, after a semicolon."""
    hint = rank_hint(message)
    cause = message.removesuffix(f" ({hint})") if hint else message
    return f"{shortened(cause, limit)}{'; ' + hint if hint else ''}"


def error_line(error: BaseException, limit: int = 300) -> str:
    """``error`` in one line, its type first (``RuntimeError: stack expects ...``): the first
    line of its message, and the next where the first ends by announcing it (transformers'
    "... You can install it with pip:" before the command), at most ``limit`` characters."""
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    text = " ".join(lines[:2] if len(lines) > 1 and lines[0].endswith(":") else lines[:1])
    return f"{type(error).__name__}: {text}"[:limit]


def closest(
    name: str, known: Iterable[str], listed: str = "known fields", n: int = 1, shown: int = 0
) -> str:
    """What was meant by the unknown ``name``: up to ``n`` close ones of ``known``, case aside
    ("did you mean 'parallel'?"; "adamw" is AdamW before Adam), else ``listed`` and the known
    names (the first ``shown`` of them where that is not 0); "" where nothing is known."""
    import difflib

    known = list(known)
    lowered = {k.lower(): k for k in known}
    close = [lowered[c] for c in difflib.get_close_matches(name.lower(), lowered, n=n)]
    if close:
        return "did you mean " + " or ".join(repr(c) for c in close) + "?"
    if not known:
        return ""
    listing = known[:shown] if shown else known
    return f"{listed}: {', '.join(listing)}" + (", ..." if len(listing) < len(known) else "")


def describe_validation_error(
    error: ValidationError, source: str, model: type[BaseModel], flat: bool = False
) -> str:
    """One line naming each offending field of ``model``, its value and what would be accepted.

    The one place that turns pydantic's errors into the sentence users see, for every model:
    an unknown field lists ``model``'s own fields. ``flat``: name a nested field by its own
    name, as users gave it."""
    messages = []
    for item in error.errors():
        loc = item["loc"][-1:] if flat else item["loc"]
        field = ".".join(str(p) for p in loc)
        msg = str(item["msg"]).removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            msg = f"unknown field {field!r}; " + closest(str(loc[-1]), model.model_fields)
        elif item["type"] == "missing":
            msg = f"missing required field {field!r}"
        elif field:
            msg = f"{field}={item.get('input')!r}: {msg}"
        messages.append(msg)
    return f"invalid {source}: " + "; ".join(messages)


def validated(model: type[Model], values: dict[str, Any], source: str, flat: bool = False) -> Model:
    """``values`` as a ``model``, or a ``ConfigError`` with one clear line."""
    try:
        return model.model_validate(values)
    except ValidationError as error:
        raise ConfigError(describe_validation_error(error, source, model, flat)) from None
