"""Per-sample CPU work that behaves like real loading: decompressing records, not sleeping."""

from __future__ import annotations

import random
import zlib


def compressed_records(count: int, nbytes: int, seed: int) -> list[bytes]:
    """``count`` zlib-compressed records of ``nbytes`` each, compressible like real media."""
    rng = random.Random(seed)
    records = []
    for _ in range(count):
        alphabet = bytes(rng.randrange(256) for _ in range(16))
        raw = bytes(alphabet[rng.randrange(16)] for _ in range(min(nbytes, 4096)))
        raw = (raw * (nbytes // len(raw) + 1))[:nbytes]
        records.append(zlib.compress(raw, 6))
    return records


def decode(record: bytes, rounds: int) -> bytes:
    """Decompress ``record`` ``rounds`` times (rounds >= 1), as a decoder of that cost would."""
    raw = b""
    for _ in range(max(1, rounds)):
        raw = zlib.decompress(record)
    return raw
