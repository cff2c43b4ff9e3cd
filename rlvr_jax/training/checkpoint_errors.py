"""What the checkpointer says when something is wrong: `CheckpointError`, one-line summaries
of orbax/TensorStore errors (orbax's own are tracebacks with a 40-line TensorStore spec), the
comparison of a checkpoint's arrays with the run's train state, and the agreement of several
processes on what they found."""

from __future__ import annotations

import contextlib
import errno
import gc
import json
import logging
import os
import re
import sys
from typing import Any

import jax
import numpy as np

log = logging.getLogger("rlvr_jax.training.checkpoint")

_MSG_BYTES = 4096  # per process, when processes exchange what they found


class CheckpointError(ValueError):
    """A checkpoint could not be written, or none could be restored; the message names the
    checkpoint(s), the file(s) and the OS or orbax error. (A ValueError: `rlvr-train` exits 2.)"""


def summarise(e: BaseException | None) -> str:
    """One line for an exception chain: the innermost message (TensorStore's specific one,
    not orbax's wrapper with a 40-line spec), with errno's name where the OS gave a code."""
    chain: list[BaseException] = []
    while e is not None and len(chain) < 16:
        chain.append(e)
        e = e.__cause__ or e.__context__
    inner = next((x for x in reversed(chain) if str(x).strip()), chain[0])
    line = str(inner).strip().splitlines()[0] if str(inner).strip() else ""
    line = line.split(" See full TensorStore details")[0]
    code = getattr(inner, "errno", None)
    if code is None and (m := re.search(r"os_error_code='(\d+)'", line)):
        code = int(m.group(1))
    if code in errno.errorcode and errno.errorcode[code] not in line:
        line += f" [{errno.errorcode[code]}]"
    if any(isinstance(x, json.JSONDecodeError) for x in chain):
        line += " (in the JSON side-car meta/metadata)"
    if len(line) > 600:
        line = line[:600] + "…"
    return f"{type(inner).__name__}: {line}"


def first(problems: list[str], n: int = 3) -> str:
    more = f" (and {len(problems) - n} more)" if len(problems) > n else ""
    return "; ".join(problems[:n]) + more


def _keyname(path) -> str:
    return ".".join(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path)


def mismatch(on_disk: Any, abstract_state: Any) -> str:
    """Where the arrays in a checkpoint's metadata differ from `abstract_state` ("" if not)."""

    def shapes(tree):
        leaves = jax.tree_util.tree_leaves_with_path(tree)
        return {_keyname(p): tuple(getattr(x, "shape", ()) or ()) for p, x in leaves}

    disk, here = shapes(on_disk), shapes(abstract_state)
    if set(disk) != set(here):
        if sorted(disk.values()) == sorted(here.values()):
            return ""  # the same arrays under other key names: orbax decides
        only_disk, only_here = sorted(set(disk) - set(here)), sorted(set(here) - set(disk))
        return f"arrays only in the checkpoint: {only_disk[:3]}, only in this run: {only_here[:3]}"
    diff = [k for k in sorted(disk) if disk[k] != here[k]]
    return "; ".join(f"{k} is {disk[k]} in the checkpoint, {here[k]} here" for k in diff[:3])


def agree(code: int, message: str) -> tuple[int, str]:
    """The largest `code` over all processes, with the messages of those that reported it."""
    if jax.process_count() == 1:
        return code, message
    from jax.experimental import multihost_utils

    raw = message.encode()[:_MSG_BYTES]
    row = np.zeros(_MSG_BYTES + 2, np.int32)
    row[0], row[1], row[2 : 2 + len(raw)] = code, len(raw), np.frombuffer(raw, np.uint8)
    rows = np.asarray(multihost_utils.process_allgather(row))
    top = int(rows[:, 0].max())
    said = [
        f"process {i}: {bytes(r[2 : 2 + r[1]].astype(np.uint8)).decode(errors='replace')}"
        for i, r in enumerate(rows)
        if r[0] == top and r[1]
    ]
    return top, "; ".join(said)


def barrier(name: str) -> None:
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def gb(nbytes: float) -> str:
    return f"{nbytes / 1e9:.3f} GB" if nbytes >= 1e7 else f"{nbytes / 1e6:.3f} MB"


@contextlib.contextmanager
def quiet_unraisable():
    """A failed orbax restore leaves coroutines whose exceptions Python prints as 'Exception
    ignored in ...' with a 40-line TensorStore spec each; they go to the debug log instead."""
    previous = sys.unraisablehook

    def hook(u):
        log.debug("ignored after a failed restore: %s", u.exc_value)

    sys.unraisablehook = hook
    try:
        yield
    finally:
        gc.collect()
        sys.unraisablehook = previous


class _OrbaxTracebacks(logging.Filter):
    """Orbax logs the error of a failed save with a traceback, up to four times; the one-line
    message stays, the tracebacks go to this module's debug log."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and _called_from_orbax():
            log.debug("orbax: %s", record.getMessage(), exc_info=record.exc_info)
            record.exc_info = None
            record.exc_text = None
        return True


def _called_from_orbax() -> bool:
    """Whether orbax made the logging call being filtered (by the calling frames: absl's)."""
    frame, marker = sys._getframe(1), f"{os.sep}orbax{os.sep}"
    for _ in range(12):
        if frame is None:
            return False
        if marker in frame.f_code.co_filename:
            return True
        frame = frame.f_back
    return False


def _late_tensorstore_callback(tp, value, tb) -> bool:
    """After a failed save, a TensorStore write can complete after orbax closed the event loop
    its callback calls into; Python reports that as an unraisable 'Event loop is closed'."""
    if tp is not RuntimeError or str(value) != "Event loop is closed":
        return False
    while tb is not None:
        if tb.tb_frame.f_code.co_name == "call_soon_threadsafe":
            return True
        tb = tb.tb_next
    return False


def quiet_orbax_tracebacks() -> None:
    """Sends orbax's tracebacks of a failed save to the debug log (their one-line messages
    stay), and likewise TensorStore's late-callback traceback; everything else is untouched."""
    absl = logging.getLogger("absl")
    if not any(isinstance(f, _OrbaxTracebacks) for f in absl.filters):
        absl.addFilter(_OrbaxTracebacks())
    if getattr(sys.unraisablehook, "_rlvr_checkpoint", False):
        return
    previous = sys.unraisablehook

    def unraisablehook(u):
        if _late_tensorstore_callback(u.exc_type, u.exc_value, u.exc_traceback):
            log.debug("a TensorStore callback after orbax closed its event loop: %r", u.exc_value)
        else:
            previous(u)

    unraisablehook._rlvr_checkpoint = True
    sys.unraisablehook = unraisablehook
