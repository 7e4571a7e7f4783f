"""Parsing and printing of sizes and durations as users write them ("20GiB", "90s", "15m")."""

from __future__ import annotations

import math
import re

_BYTE_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "k": 2**10,
    "m": 2**20,
    "g": 2**30,
    "t": 2**40,
}
_SECONDS = {"": 1, "s": 1, "m": 60, "min": 60, "h": 3600}


def parse_bytes(text: str) -> int:
    """'20GiB', '512MB', '1.5g' or a plain number of bytes -> bytes."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _BYTE_UNITS:
        raise ValueError(
            f"{text!r} is not a size; use a number of bytes or a number with a unit such as "
            "512MiB, 20GiB, 8GB"
        )
    number = float(match.group(1)) * _BYTE_UNITS[unit]
    if not math.isfinite(number):
        raise ValueError(f"{text!r} is not a size this machine could have")
    value = int(number)
    if value <= 0:
        raise ValueError(f"{text!r} is not a positive size")
    return value


def parse_duration(text: str) -> float:
    """'90', '90s', '15m', '2h' -> seconds."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _SECONDS:
        raise ValueError(f"{text!r} is not a duration; use e.g. 90s, 15m or 2h")
    value = float(match.group(1)) * _SECONDS[unit]
    if not math.isfinite(value):
        raise ValueError(f"{text!r} is not a duration this search could take")
    if value <= 0:
        raise ValueError(f"{text!r} is not a positive duration")
    return value


def format_bytes(value: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(value) >= size:
            return f"{value / size:.1f} {unit}"
    return f"{int(value)} B"


def format_budget(value: float) -> str:
    """A memory budget or limit in words: GiB to two places from 1 GiB, else whole MiB (a
    budget of 92 MiB read "0.09 GiB", one of 1 KiB "0.00 GiB"), else what ``format_bytes``
    says."""
    if value >= 2**30:
        return f"{value / 2**30:.2f} GiB"
    if value >= 2**20:
        return f"{value / 2**20:,.0f} MiB"
    return format_bytes(value)


def format_speed(samples_per_s: float) -> str:
    """A throughput's number as every output writes it: "12,345.6"; below one sample a second,
    to three figures ("0.0267": a large model's step on a small machine read "0.0")."""
    if abs(samples_per_s) < 1:
        return f"{samples_per_s:.3g}"
    return f"{samples_per_s:,.1f}"


def format_rate(samples_per_s: float) -> str:
    """A throughput with its unit: "12,345.6 samples/s", "0.0267 samples/s" (``format_speed``);
    a pruned trial's bound read "1.197e+04 samples/s" beside its neighbours' "9,452.0"."""
    return f"{format_speed(samples_per_s)} samples/s"
