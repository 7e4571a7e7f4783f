"""The search space: which values each knob may take, and when a knob exists at all.

A space is a YAML file (``search_spaces/*.yaml``) mapping TrainConfig fields to parameters::

    parallel: [single, ddp, fsdp]
    comm_hook:
      choices: [none, fp16, powersgd]
      when: {parallel: [ddp]}          # only sampled under DDP
    prefetch_factor:
      choices: [2, 4]
      when_not: {num_workers: [0]}      # only sampled with workers

A parameter whose condition does not hold is not sampled: the field keeps its TrainConfig
default. Conditions refer to parameters listed earlier in the file, which are sampled first.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from autotune.config import TrainConfig, field_value
from autotune.errors import ConfigError, closest
from autotune.records import Value

MAX_RANGE_CHOICES = 1000
"""A range with more choices than this is a mistake, not a search space."""

SPACES_DIR = Path(__file__).resolve().parent.parent.parent / "search_spaces"


class Param(BaseModel):
    """One knob's possible values and the condition under which it is sampled."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    choices: tuple[Value, ...] = Field(min_length=1)
    when: dict[str, tuple[Value, ...]] = Field(default_factory=dict)
    when_not: dict[str, tuple[Value, ...]] = Field(default_factory=dict)

    def active(self, values: dict[str, Any]) -> bool:
        """Whether this parameter exists given the values sampled so far."""
        return all(values.get(k) in v for k, v in self.when.items()) and not any(
            values.get(k) in v for k, v in self.when_not.items()
        )


class SearchSpace(BaseModel):
    """An ordered set of parameters over TrainConfig fields."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    params: dict[str, Param]

    @model_validator(mode="after")
    def _check(self) -> SearchSpace:
        fields = TrainConfig.model_fields
        seen: list[str] = []
        for name, param in self.params.items():
            if name not in fields:
                raise ValueError(f"unknown knob {name!r}; {closest(name, fields, 'knobs')}")
            if name in ("global_batch_size", "max_grad_norm"):
                raise ValueError(f"{name} is training semantics and is never searched")
            for ref in (*param.when, *param.when_not):
                if ref not in seen:
                    raise ValueError(
                        f"{name}: condition on {ref!r}, which is not a knob listed before it"
                    )
            if len(set(param.choices)) != len(param.choices):
                raise ValueError(f"{name}: duplicate choices {list(param.choices)}")
            seen.append(name)
        return self

    def fingerprint(self) -> str:
        text = json.dumps(self.model_dump(mode="json"), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def choices(self) -> dict[str, list[Value]]:
        """Each knob's choices, whatever its conditions."""
        return {name: list(param.choices) for name, param in self.params.items()}

    def fewest_ranks(self) -> int:
        """The fewest rank processes a configuration of the space may run: 1 where it offers one
        process (a single device, DataParallel) or does not say, else its least world size."""
        choices = self.choices()
        if set(choices.get("parallel", ("single",))) & {"single", "dp"}:
            return 1
        sizes = [v for v in choices.get("world_size", ()) if isinstance(v, int)]
        return min(sizes, default=1)

    def compiles(self) -> bool:
        """Whether the space offers ``torch.compile`` in any mode."""
        return any(c != "off" for c in self.choices().get("compile", ()))

    def replace_choices(self, name: str, choices: tuple[Value, ...]) -> SearchSpace:
        """This space with knob ``name``'s choices replaced (none: the knob disappears)."""
        if name not in self.params:
            return self
        params = dict(self.params)
        if choices:
            params[name] = params[name].model_copy(update={"choices": choices})
        else:
            del params[name]
        return SearchSpace(params=params)

    def without(self, name: str, value: Value) -> SearchSpace:
        """This space with one choice removed (a knob left with no choice disappears)."""
        if name not in self.params:
            return self
        return self.replace_choices(name, tuple(c for c in self.params[name].choices if c != value))


def _normalise(name: str, raw: Any) -> Any:
    if isinstance(raw, list):
        return {"choices": raw}
    if isinstance(raw, dict) and "range" in raw:
        raw = dict(raw)
        bounds = raw.pop("range")
        if (
            not isinstance(bounds, list)
            or len(bounds) not in (2, 3)
            or not all(isinstance(b, int) and not isinstance(b, bool) for b in bounds)
        ):
            raise ConfigError(
                f"{name}: range {bounds!r} must be [low, high] or [low, high, step] of integers"
            )
        low, high, *step = bounds
        stride = step[0] if step else 1
        if stride <= 0 or low > high:
            raise ConfigError(f"{name}: range [{low}, {high}] is impossible; need low <= high")
        if (high - low) // stride >= MAX_RANGE_CHOICES:
            raise ConfigError(
                f"{name}: range [{low}, {high}] has over {MAX_RANGE_CHOICES} choices; "
                "use a step or list the values"
            )
        return {**raw, "choices": list(range(low, high + 1, stride))}
    if isinstance(raw, dict):
        return raw
    return {"choices": [raw]}


def _label(name: object) -> str:
    """A knob name as an error message shows it: quoted when it would break the line."""
    text = str(name)
    return text if text.isprintable() else repr(text)


EVERY_BLOCK = "all"
"""A choice of ``checkpoint_segments`` meaning every repeated block of the model, whatever their
number (``probe.every_block`` puts the number in its place)."""


def _field_values(name: str, values: Any) -> Any:
    """Each of ``values`` as knob ``name``'s field holds it (an unquoted ``off``, which YAML
    reads as False, becomes "off"): a choice the field cannot take is an error here, where
    enumerating the space would drop it without a word."""
    if name not in TrainConfig.model_fields or not isinstance(values, (list, tuple)):
        return values  # an unknown knob, or a malformed list: the model's checks say which
    try:
        return [
            v if name == "checkpoint_segments" and v == EVERY_BLOCK else field_value(name, v)
            for v in values
        ]
    except ValueError as error:
        raise ConfigError(f"{_label(name)}: {error}") from None


def _field_choices(name: str, param: Any) -> Any:
    """Knob ``name``'s ``param`` (normalised) with its choices and its conditions' values as
    their fields hold them."""
    if not isinstance(param, dict):
        return param
    param = dict(param)
    if "choices" in param:
        param["choices"] = _field_values(name, param["choices"])
    for key in ("when", "when_not"):
        if isinstance(param.get(key), dict):
            param[key] = {k: _field_values(k, v) for k, v in param[key].items()}
    return param


def parse_space(data: Any, source: str) -> SearchSpace:
    """Validate a mapping read from YAML into a SearchSpace, with one-line errors."""
    if not isinstance(data, dict) or not data:
        raise ConfigError(f"search space {source}: expected a mapping of knobs to choices")
    params = {}
    for name, raw in data.items():
        param = _normalise(_label(name), raw)
        try:
            params[name] = _field_choices(name, param)
        except ConfigError as error:
            raise ConfigError(f"search space {source}: {error}") from None
    try:
        return SearchSpace(params=params)
    except ValidationError as error:
        problems = []
        for item in error.errors():
            where = ".".join(_label(p) for p in item["loc"][1:]) or "space"
            message = str(item["msg"]).removeprefix("Value error, ")
            if item["type"] == "too_short":
                where, message = where.removesuffix(".choices"), "empty choice list"
            elif item["type"] == "extra_forbidden":
                message = "unknown key; allowed: choices, range, when, when_not"
            problems.append(f"{where}: {message}")
        raise ConfigError(f"search space {source}: " + "; ".join(problems)) from None


def load_space(name_or_path: str) -> SearchSpace:
    """A space from a file path, or by name from search_spaces/ (e.g. 'default', 'quick')."""
    import yaml

    path = Path(name_or_path)
    if not path.exists():
        path = SPACES_DIR / f"{name_or_path}.yaml"
    if not path.exists():
        names = sorted(p.stem for p in SPACES_DIR.glob("*.yaml"))
        raise ConfigError(
            f"--space {name_or_path!r} is neither a file nor a built-in space; built-in: "
            + ", ".join(names)
        )
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        first = str(error).splitlines()[0]
        raise ConfigError(f"search space {str(path)!r} is not valid YAML: {first}") from None
    return parse_space(data, repr(str(path)))


def space_points(space: SearchSpace, most: int | None = None) -> list[dict[str, Any]] | None:
    """The knob values of every combination of ``space``, as the sampler would draw them (a
    knob whose condition does not hold is absent), in the order the knobs are listed; None when
    there are more than ``most`` (the default space holds billions: a caller that only wants a
    small space whole stops counting early)."""
    names = list(space.params)
    points: list[dict[str, Any]] = []
    pending: list[tuple[int, dict[str, Any]]] = [(0, {})]
    while pending:  # depth first, the first knob's first choice first
        i, values = pending.pop()
        if i == len(names):
            points.append(values)
            if most is not None and len(points) > most:
                return None
            continue
        param = space.params[names[i]]
        if not param.active(values):
            pending.append((i + 1, values))
            continue
        pending.extend((i + 1, {**values, names[i]: c}) for c in reversed(param.choices))
    return points


def valid_configs(
    points: Iterable[dict[str, Any]], make: Callable[[dict[str, Any]], TrainConfig]
) -> list[TrainConfig]:
    """The configurations ``make`` builds of ``points``, each once, in order; the points it
    refuses (a combination TrainConfig's validation rules out) left out."""
    found: dict[str, TrainConfig] = {}
    for values in points:
        try:
            config = make(values)
        except ValueError:
            continue
        found.setdefault(config.key(), config)
    return list(found.values())


def enumerate_configs(space: SearchSpace, fixed: dict[str, Any]) -> list[TrainConfig]:
    """Every valid configuration of ``space`` (with ``fixed`` fields such as the global batch),
    in the order the knobs are listed; combinations TrainConfig refuses are left out."""
    return valid_configs(space_points(space) or [], lambda values: TrainConfig(**values, **fixed))
