"""The DPO reference log-probs, computed once by the frozen starting policy and cached on disk.

log π_ref(y | x) summed over a response's tokens depends on (reference model, prompt tokens,
response tokens): the cache is one file per model fingerprint (its files' contents and the
dtypes) holding one float per 16-byte hash of the tokens, so data, template and tokenizer are
part of the key. Missing sums are computed on the learner mesh before training (`fill`) and the
file written atomically by process 0 (`save`); with several processes,
`dpo.reference_cache_dir` must be on storage they share.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rlvr_jax.training.batch import bucket_length, collate_sft

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
"""Bumped when what a cached value means changes (it is part of the file's fingerprint)."""

MODEL_FILE_SUFFIXES = (".json", ".safetensors", ".model", ".txt")
"""Files of a model directory that make up its fingerprint (config, weights, tokenizer)."""

_BLOCK = 1 << 24


def model_fingerprint(path: str | Path, *, param_dtype: str, compute_dtype: str) -> str:
    """sha256 (hex) of the model directory's files (names and contents, sorted) and dtypes.

    Raises FileNotFoundError when `path` holds no config.json."""
    root = Path(path)
    if not (root / "config.json").is_file():
        raise FileNotFoundError(f"reference model {str(root)!r} has no config.json")
    h = hashlib.sha256(f"v{FORMAT_VERSION} {param_dtype} {compute_dtype}".encode())
    files = sorted(p for p in root.iterdir() if p.is_file() and p.suffix in MODEL_FILE_SUFFIXES)
    for p in files:
        h.update(p.name.encode() + b"\0")
        with p.open("rb") as f:
            while block := f.read(_BLOCK):
                h.update(block)
    return h.hexdigest()


def sequence_key(prompt_ids: Sequence[int], response_ids: Sequence[int]) -> bytes:
    """16-byte key of one (prompt, response) token sequence."""
    h = hashlib.blake2b(digest_size=16)
    h.update(np.asarray(prompt_ids, np.int64).tobytes())
    h.update(b"|")
    h.update(np.asarray(response_ids, np.int64).tobytes())
    return h.digest()


class ReferenceCache:
    """Summed reference log-probs by `sequence_key`, in `<directory>/<fingerprint[:16]>.npz`."""

    def __init__(self, directory: str | Path, fingerprint: str) -> None:
        self.path = Path(directory) / f"ref_logp-{fingerprint[:16]}.npz"
        self.fingerprint = fingerprint
        self.values: dict[bytes, float] = {}
        self.loaded = 0
        if self.path.is_file():
            with np.load(self.path) as f:
                if str(f["fingerprint"]) != fingerprint:
                    raise ValueError(
                        f"{self.path}: written for another model (fingerprint "
                        f"{str(f['fingerprint'])[:16]}…); remove it or set dpo.reference_cache_dir"
                    )
                self.values = dict(zip((bytes(k) for k in f["keys"]), f["values"].tolist()))
            self.loaded = len(self.values)

    def __len__(self) -> int:
        return len(self.values)

    def get(self, prompt_ids: Sequence[int], response_ids: Sequence[int]) -> float:
        """The cached sum. Raises KeyError naming the cache when it was never computed."""
        key = sequence_key(prompt_ids, response_ids)
        if key not in self.values:
            raise KeyError(f"{self.path}: no reference log-prob for a sequence (run fill first)")
        return self.values[key]

    def save(self) -> Path:
        """Writes the cache atomically (a temp file, then a rename)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.tmp{os.getpid()}.npz")
        keys = np.array([np.frombuffer(k, np.uint8) for k in self.values], np.uint8)
        np.savez(
            tmp,
            fingerprint=np.array(self.fingerprint),
            keys=keys.reshape(len(self.values), 16),
            values=np.array(list(self.values.values()), np.float64),
        )
        tmp.replace(self.path)
        return self.path

    def fill(
        self,
        sequences: Iterable[tuple[Sequence[int], Sequence[int]]],
        logprob: Callable[[Any], Any],
        *,
        rows: int,
        full_len: int,
        min_len: int,
        multiple: int,
        pad_id: int,
    ) -> int:
        """Computes the sums of the `(prompt ids, response ids)` not cached yet, `rows` at a time
        (`logprob(token_batch) -> logp_BxT`), lengths bucketed like the training batches'.
        Returns how many were computed (`save` writes them)."""
        todo: dict[bytes, tuple[Sequence[int], Sequence[int]]] = {}
        for p, r in sequences:
            key = sequence_key(p, r)
            if key not in self.values:
                todo.setdefault(key, (p, r))
        if not todo:
            log.info("reference log-probs: all cached in %s", self.path)
            return 0
        log.info("reference log-probs: computing %d sequences (%s)", len(todo), self.path)
        t0 = time.perf_counter()
        keys = list(todo)
        every = max(len(keys) // 10, 1)  # about ten progress lines
        for start in range(0, len(keys), rows):
            chunk = keys[start : start + rows]
            prompts = [todo[k][0] for k in chunk]
            responses = [todo[k][1] for k in chunk]
            longest = max(len(p) + len(r) for p, r in zip(prompts, responses))
            length = bucket_length(longest, full=full_len, min_len=min_len, multiple=multiple)
            batch = collate_sft(prompts, responses, rows=rows, seq_len=length + 1, pad_id=pad_id)
            logp_BxT = np.asarray(logprob(batch), np.float64)
            sums = np.where(batch.mask_BxT > 0, logp_BxT, 0.0).sum(axis=1)
            self.values.update(zip(chunk, sums[: len(chunk)].tolist()))
            done = min(start + rows, len(keys))
            if done == len(keys) or done // every != (done - len(chunk)) // every:
                log.info(
                    "reference log-probs: %d/%d (%.1f s)", done, len(keys), time.perf_counter() - t0
                )
        return len(keys)
