"""File-level integrity of an orbax checkpoint: a per-process manifest of every file the process
wrote (relative path → size and CRC-32), written after orbax finalised it and verified before a
restore. Orbax checks nothing itself: a damaged data file fails deep in TensorStore without
naming the file, or restores silently into wrong numbers.

Process i owns `…/ocdbt.process_i/…` and `…/array_metadatas/process_i`; process 0 everything
else. Each process hashes and verifies only its own files.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import re
import time
import zlib
from pathlib import Path

MANIFEST = "rlvr_manifest.process_{}.json"
"""Name of process i's manifest inside a step directory."""
_MANIFEST_RE = re.compile(r"^rlvr_manifest\.process_\d+\.json(\.tmp)?$")
_OWNER_RE = re.compile(r"^(?:ocdbt\.)?process_(\d+)$")
_CHUNK = 8 << 20
VERIFY_MODES = ("checksum", "size", "off")


def owner(relpath: str) -> int:
    """The process that wrote `relpath` (a path relative to the step directory)."""
    for part in relpath.split("/"):
        m = _OWNER_RE.match(part)
        if m:
            return int(m.group(1))
    return 0


def own_files(step_dir: Path, process: int) -> list[str]:
    """Relative paths (sorted) of the files under `step_dir` that `process` wrote."""
    out = []
    for root, _dirs, files in os.walk(step_dir):
        rel_root = os.path.relpath(root, step_dir)
        for name in files:
            rel = name if rel_root == "." else f"{rel_root}/{name}".replace(os.sep, "/")
            if not _MANIFEST_RE.match(name) and owner(rel) == process:
                out.append(rel)
    return sorted(out)


def crc32_file(path: Path) -> tuple[int, int]:
    """(size, CRC-32) of a file, read in 8 MiB chunks (zlib releases the GIL while hashing)."""
    crc, size = 0, 0
    buf = bytearray(_CHUNK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            crc = zlib.crc32(view[:n], crc)
            size += n
    return size, crc


def _threads() -> int:
    return min(8, os.cpu_count() or 1)


def write_manifest(step_dir: Path, process: int, *, checksum: bool) -> tuple[int, int, float]:
    """Writes `process`'s manifest into `step_dir` atomically; returns (files, bytes, seconds)."""
    t0 = time.perf_counter()
    rels = own_files(step_dir, process)
    if checksum:
        with concurrent.futures.ThreadPoolExecutor(_threads()) as pool:
            sums = list(pool.map(lambda r: crc32_file(step_dir / r), rels))
        files = {r: [size, f"{crc:08x}"] for r, (size, crc) in zip(rels, sums)}
    else:
        files = {r: [(step_dir / r).stat().st_size, None] for r in rels}
    body = {"version": 1, "process": process, "checksum": "crc32" if checksum else None}
    body["files"] = files
    path = step_dir / MANIFEST.format(process)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(body, f, indent=0)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return len(files), sum(v[0] for v in files.values()), time.perf_counter() - t0


@dataclasses.dataclass
class Verification:
    """What `verify` found in one process's files of one checkpoint."""

    status: str
    """"intact" (sizes and checksums match), "unchecked" (not checked by checksum) or "damaged"."""
    problems: list[str] = dataclasses.field(default_factory=list)
    """One entry per damaged file, naming it (relative to the step directory)."""
    note: str = ""
    """Why an unchecked checkpoint was not checked ("no manifest", ...)."""
    files: int = 0
    nbytes: int = 0
    seconds: float = 0.0


def verify(step_dir: Path, process: int, *, mode: str) -> Verification:
    """Checks `process`'s files of `step_dir` against its manifest (`mode`: `VERIFY_MODES`)."""
    if mode == "off":
        return Verification("unchecked", note="verification is off")
    path = step_dir / MANIFEST.format(process)
    if not path.exists():
        return Verification("unchecked", note="no manifest")
    t0 = time.perf_counter()
    try:
        manifest = json.loads(path.read_text())
        files = {str(k): (int(v[0]), v[1]) for k, v in manifest["files"].items()}
    except (OSError, ValueError, KeyError, TypeError, IndexError) as e:
        return Verification("damaged", [f"its manifest {path.name} is unreadable ({e})"])
    check_sums = mode == "checksum" and manifest.get("checksum") == "crc32"

    def check(item: tuple[str, tuple[int, str | None]]) -> str | None:
        rel, (size, crc) = item
        try:
            actual = (step_dir / rel).stat().st_size
            if actual != size:
                what = "cut short" if actual < size else "grown"
                return f"{rel} ({what}: {actual} bytes, {size} written)"
            if check_sums and crc is not None and f"{crc32_file(step_dir / rel)[1]:08x}" != crc:
                return f"{rel} (checksum differs)"
        except FileNotFoundError:
            return f"{rel} (missing)"
        except OSError as e:
            return f"{rel} (unreadable: {e.strerror or e})"
        return None

    with concurrent.futures.ThreadPoolExecutor(_threads()) as pool:
        found = [p for p in pool.map(check, sorted(files.items())) if p]
    seconds = time.perf_counter() - t0
    nbytes = sum(size for size, _ in files.values())
    status = "damaged" if found else "intact" if check_sums else "unchecked"
    note = "" if check_sums else "sizes only"
    return Verification(status, found, note, len(files), nbytes, seconds)
