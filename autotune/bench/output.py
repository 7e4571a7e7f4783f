"""Where a benchmark's results go: a file written whole, its folder made first, so that an hour
of measurement is never lost to a missing folder or left half-written by an interrupted write."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_whole(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` through a sibling file renamed over it: a run stopped while
    writing leaves the last whole version."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".writing")
    partial.write_text(text)
    partial.replace(path)
    return path


def write_json(path: str | Path, data: Any, indent: int = 1) -> Path:
    """``data`` as JSON at ``path`` (``write_whole``); returns the path."""
    return write_whole(path, json.dumps(data, indent=indent) + "\n")
