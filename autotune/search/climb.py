"""The climb: points one knob away from the fastest configurations so far, most promising first.

Training knobs mostly act one at a time (a second rank over the memory line is over it whatever
else changes), so a neighbour's speed is estimated as its anchor's speed times what the same
move (knob, from, to) did between two measured configurations one knob apart: the mean of
those log ratios, each weighted by how close the configuration it moved from is to the anchor
(``CONTEXT_WEIGHT`` per other knob that differs, since what a knob does depends on the rest),
or 1 for a move not seen yet. Two DataLoader moves not seen yet are
estimated at what they can save at most, as measured on the anchor: persistent workers its
epoch boundary (a short trial times one, and restarting the workers is most of it), more
workers its wait for data. So a loading-bound model gets its workers first, before a compute
knob is judged where loading hides what it does (mlp on the CPU: bf16 measured 0.68x without
a worker and 1.28x with one). Memory is estimated likewise, and a neighbour estimated over the
memory limit is not proposed.
The climb proposes the untried neighbour with the highest estimate, among the neighbours of the
``CLIMB_FROM`` fastest configurations that fit (of the baseline while nothing fits), and stops,
leaving the sampler to explore, once no estimate reaches ``floor``.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from autotune.config import TrainConfig
from autotune.records import Value
from autotune.search.space import SearchSpace

CLIMB_FROM = 3
"""How many of the fastest configurations so far the climb looks around."""
CONTEXT_WEIGHT = 0.3
"""What a move did counts this much less for each other knob in which the configuration it
moved from differs from the anchor: effects depend on context (on mlp, accumulation 2 was
faster without a DataLoader worker and slower with one)."""
NO_EFFECT_WEIGHT = 0.1
"""The weight of "no effect" among a move's observations (1 for one in the anchor's context)."""
MAX_WAIT_SHARE = 0.9
"""A data-wait share counts at most this much: more workers are estimated 10x at most."""


@dataclass(frozen=True)
class Move:
    """``params`` is ``start`` with ``knob`` moved from ``old`` to ``new``."""

    knob: str
    old: Value
    new: Value
    params: dict[str, Any]


def moves(space: SearchSpace, start: TrainConfig) -> list[Move]:
    """Points one knob away from ``start``: each knob set to each of its other choices, the rest
    as in ``start`` (knobs whose condition then fails are left out)."""
    base = {  # a value the space does not offer becomes its first choice
        n: getattr(start, n) if getattr(start, n) in p.choices else p.choices[0]
        for n, p in space.params.items()
    }
    found: list[Move] = []
    for name, param in space.params.items():
        for choice in param.choices:
            if choice == base[name]:
                continue
            values: dict[str, Any] = {}
            for n, p in space.params.items():
                if p.active(values):
                    values[n] = choice if n == name else base[n]
            if name in values and all(values != m.params for m in found):
                found.append(Move(name, base[name], choice, values))
    return found


Complete = Callable[[dict[str, Any]], dict[str, Any]]
"""Knob values -> every TrainConfig field the search sets (global batch, device, ...)."""


def _key(params: dict[str, Any], complete: Complete) -> str | None:
    try:
        return TrainConfig(**complete(params)).key()
    except ValueError:
        return None


@dataclass(frozen=True)
class Seen:
    """A measured configuration: its samples/s and its peak memory (None: not known), its
    samples/s without the epoch boundary's cost and the share of its measured time spent
    waiting for data (None: not known)."""

    config: TrainConfig
    samples_per_s: float
    memory_bytes: int | None = None
    steady_samples_per_s: float | None = None
    data_wait_share: float | None = None


Effect = tuple[list[tuple[float, TrainConfig]], list[float]]
"""What one move did: (log ratio of samples/s, the configuration it moved from) per measured
pair, and the log ratios of memory."""


def _move_effects(
    space: SearchSpace, complete: Complete, measured: list[Seen]
) -> dict[tuple[str, Value, Value], Effect]:
    """Per move (knob, from, to): what it showed between measured configurations one knob
    apart."""
    by_key = {seen.config.key(): seen for seen in measured}
    effects: dict[tuple[str, Value, Value], Effect] = defaultdict(lambda: ([], []))
    for seen in measured:
        for move in moves(space, seen.config) if seen.samples_per_s > 0 else ():
            other = by_key.get(_key(move.params, complete) or "")
            if other is None or other.samples_per_s <= 0:
                continue
            speed, memory = effects[(move.knob, move.old, move.new)]
            speed.append((math.log(other.samples_per_s / seen.samples_per_s), seen.config))
            if seen.memory_bytes and other.memory_bytes:
                memory.append(math.log(other.memory_bytes / seen.memory_bytes))
    return effects


def _scale(value: float, logs: list[float]) -> float:
    return value * math.exp(sum(logs) / len(logs))


def _in_context(
    space: SearchSpace, anchor: TrainConfig, move: Move, seen: list[tuple[float, TrainConfig]]
) -> float:
    """The log speed ratio ``move`` is expected to give from ``anchor``: each pair's ratio
    weighted by ``CONTEXT_WEIGHT`` to the power of the knobs (other than the moved one) in
    which the configuration it moved from differs from ``anchor``, shrunk towards no effect by
    ``NO_EFFECT_WEIGHT``."""
    total = weight_sum = 0.0
    for log_ratio, start in seen:
        apart = sum(
            1 for n in space.params if n != move.knob and getattr(start, n) != getattr(anchor, n)
        )
        weight = CONTEXT_WEIGHT**apart
        total, weight_sum = total + weight * log_ratio, weight_sum + weight
    return total / (weight_sum + NO_EFFECT_WEIGHT)


def _unseen_estimate(anchor: Seen, move: Move) -> float:
    """A move nobody has measured yet: the anchor's speed, except for two DataLoader moves,
    estimated at what they can save at most, as measured on the anchor: keeping workers alive
    across epochs saves the epoch boundary's cost; more workers save the wait for data."""
    steady = anchor.steady_samples_per_s
    if move.knob == "persistent_workers" and move.new is True and steady:
        return max(anchor.samples_per_s, steady)
    wait = anchor.data_wait_share
    more = isinstance(move.new, int) and isinstance(move.old, int) and move.new > move.old
    if move.knob == "num_workers" and more and wait:
        return anchor.samples_per_s / (1 - min(wait, MAX_WAIT_SHARE))
    return anchor.samples_per_s


def next_move(
    space: SearchSpace,
    complete: Complete,
    anchors: list[Seen],
    measured: list[Seen],
    tried: Iterable[str],
    floor: float,
    limit_bytes: int | None = None,
) -> dict[str, Any] | None:
    """The untried neighbour of ``anchors`` (fastest first) with the highest estimated
    samples/s at or above ``floor`` whose estimated memory stays under ``limit_bytes``;
    ``measured``: every configuration measured so far, for what each move did."""
    tried = set(tried)
    effects = _move_effects(space, complete, measured)
    best: tuple[float, dict[str, Any]] | None = None
    for anchor in anchors[:CLIMB_FROM]:
        for move in moves(space, anchor.config):
            key = _key(move.params, complete)
            if key is None or key in tried:
                continue
            speed_seen, memory_logs = effects.get((move.knob, move.old, move.new), ([], []))
            estimate = (
                anchor.samples_per_s * math.exp(_in_context(space, anchor.config, move, speed_seen))
                if speed_seen
                else _unseen_estimate(anchor, move)
            )
            if (
                limit_bytes is not None
                and anchor.memory_bytes
                and memory_logs
                and _scale(anchor.memory_bytes, memory_logs) > limit_bytes
            ):
                continue  # seen to need more memory than there is
            if estimate >= floor and (best is None or estimate > best[0]):
                best = (estimate, move.params)
    return best[1] if best else None
