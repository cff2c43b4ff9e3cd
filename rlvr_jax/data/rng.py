"""Counter-based random streams for the data layer.

Every random decision of the data layer comes from a NumPy Philox generator keyed by a BLAKE2b
hash of (seed, purpose, counter...) (stable across processes, unlike `hash()`): resuming needs
only the counters, and streams of different purposes never overlap.
"""

from __future__ import annotations

import hashlib

import numpy as np


def stream_key(seed: int, *path: str | int) -> np.ndarray:
    """The Philox key (two uint64 words) of the stream named by `seed` and `path`."""
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    for part in path:
        if isinstance(part, bool) or not isinstance(part, str | int | np.integer):
            raise TypeError(f"stream path parts must be str or int, got {part!r}")
    parts = [f"s:{p}" if isinstance(p, str) else f"i:{int(p)}" for p in path]
    text = "\x1f".join([str(int(seed)), *parts])
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=16).digest()
    return np.frombuffer(digest, dtype="<u8").astype(np.uint64)


def stream(seed: int, *path: str | int) -> np.random.Generator:
    """A fresh generator for the stream named by `seed` and `path`."""
    return np.random.Generator(np.random.Philox(key=stream_key(seed, *path)))
