"""Orbax checkpoints in `<output_dir>/checkpoints/<step>/`: the train state as arrays and a JSON
side-car (source state, policy version, what else the loop needs to resume exactly).

Saves are asynchronous (orbax writes `<step>.orbax-checkpoint-tmp`, renamed to `<step>` when
complete); a thread of ours then writes each process's file manifest (`checkpoint_files`) and
deletes the checkpoints beyond keep-last-N, only after a save that succeeded. A failed save is
raised as `CheckpointError` on the next `save`/`wait`/`close`, naming the step and the OS
error; its partial directory is removed.

`restore_latest` restores the newest checkpoint whose files match their manifest and that orbax
can read; a damaged one is named, moved aside to `<step>.damaged` (never deleted) and the next
older one tried. With several processes, each verifies its own files and all agree.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import shutil
import threading
from pathlib import Path
from typing import Any

import jax

from rlvr_jax.training import checkpoint_errors as errs
from rlvr_jax.training import checkpoint_files as files
from rlvr_jax.training.checkpoint_errors import CheckpointError

log = logging.getLogger(__name__)

_TMP = ".orbax-checkpoint-tmp"  # orbax's suffix of a checkpoint being written


class Checkpointer:
    """Save/restore of (train state pytree, JSON metadata) by step."""

    def __init__(
        self,
        output_dir: str | Path,
        *,
        keep: int = 2,
        async_save: bool = True,
        verify: str = "checksum",
    ):
        """`verify`: "checksum" (CRC-32 of every file), "size" (sizes only) or "off"."""
        if verify not in files.VERIFY_MODES:
            raise ValueError(
                f"checkpoint.verify: expected one of {files.VERIFY_MODES}, got {verify!r}"
            )
        import orbax.checkpoint as ocp

        self._ocp = ocp
        self.dir = Path(output_dir).absolute() / "checkpoints"
        self.keep = max(keep, 1)
        self.async_save = async_save
        self.verify = verify
        self._process = jax.process_index()
        self._primary = self._process == 0
        errs.quiet_orbax_tracebacks()
        if self._primary:
            self.dir.mkdir(parents=True, exist_ok=True)
            self._remove_leftovers()
        self._mngr = self._new_manager()
        self._broken = False  # the manager saw a failed save: replace it before using it again
        self._worker: threading.Thread | None = None
        self._failure: CheckpointError | None = None
        self._closed = False

    def _new_manager(self):
        ocp = self._ocp
        options = ocp.CheckpointManagerOptions(
            max_to_keep=None,  # keep-last-N is ours: it runs only after a save succeeded
            enable_async_checkpointing=self.async_save,
            create=True,
        )
        handlers = {"state": ocp.StandardCheckpointHandler(), "meta": ocp.JsonCheckpointHandler()}
        return ocp.CheckpointManager(self.dir, options=options, item_handlers=handlers)

    # -- listing -----------------------------------------------------------------------
    def steps(self) -> list[int]:
        """Finished checkpoints on disk (damaged, partial and half-deleted ones are named else)."""
        if not self.dir.is_dir():
            return []
        return sorted(int(p.name) for p in self.dir.iterdir() if p.name.isdigit() and p.is_dir())

    def latest_step(self) -> int | None:
        steps = self.steps()
        return steps[-1] if steps else None

    # -- saving ------------------------------------------------------------------------
    def save(self, step: int, state: Any, meta: dict[str, Any]) -> None:
        """Starts saving checkpoint `step` (returns once the arrays are copied to the host).
        Raises `CheckpointError` for a previous save that failed, or for this one when it
        fails before returning; a step already on disk is not saved again."""
        self.wait()
        ocp = self._ocp
        args = ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta))
        try:
            saved = self._mngr.save(step, args=args)
        except Exception as e:
            failure = self._save_error(step, e)
            self._abandon(step)
            self._mngr, self._broken = self._new_manager(), False
            raise failure from e
        if not saved:
            log.info("checkpoint %d is on disk already; not saved again", step)
        elif self.async_save:
            self._worker = threading.Thread(
                target=self._complete, args=(step,), name=f"checkpoint-{step}"
            )
            self._worker.start()
        else:
            self._complete(step)
            self.wait()

    def _complete(self, step: int) -> None:
        """Waits for orbax to finish `step`, writes the manifest, collects garbage."""
        try:
            self._mngr.wait_until_finished()
        except Exception as e:
            self._failure = self._save_error(step, e)
            self._abandon(step)
            return
        try:
            if self.verify != "off":
                n, nbytes, seconds = files.write_manifest(
                    self.dir / str(step), self._process, checksum=self.verify == "checksum"
                )
                log.info(
                    "checkpoint %d saved: %d files, %s, manifest in %.2f s",
                    step, n, errs.gb(nbytes), seconds,
                )  # fmt: skip
            if self._primary:
                self._collect_garbage(step)
        except OSError as e:
            self._failure = CheckpointError(
                f"checkpoint {step} was written to {self.dir / str(step)}, but its manifest or "
                f"the removal of older checkpoints failed: {errs.summarise(e)}"
            )
            self._failure.__cause__ = e

    def _abandon(self, step: int) -> None:
        """After a failed save: drops the manager (it would raise again) and the partial dir."""
        with contextlib.suppress(Exception):
            self._mngr.close()
        self._broken = True
        if self._primary:
            for partial in self.dir.glob(f"{step}{_TMP}*"):
                shutil.rmtree(partial, ignore_errors=True)
                log.warning("removed the partial checkpoint directory %s", partial)

    def _save_error(self, step: int, e: BaseException) -> CheckpointError:
        kept = ", ".join(map(str, self.steps())) or "none"
        err = CheckpointError(
            f"checkpoint {step} could not be written to {self.dir}: {errs.summarise(e)} "
            f"(the earlier checkpoints are untouched: {kept})"
        )
        err.__cause__ = e
        return err

    def _collect_garbage(self, newest: int) -> None:
        for old in [s for s in self.steps() if s < newest][: -self.keep + 1 or None]:
            doomed = self.dir / f"{old}.deleting"  # unlisted at once; finished at next start
            os.rename(self.dir / str(old), doomed)
            shutil.rmtree(doomed)

    def _remove_leftovers(self) -> None:
        for p in sorted(self.dir.iterdir()):
            if p.is_dir() and (_TMP in p.name or p.name.endswith(".deleting")):
                shutil.rmtree(p, ignore_errors=True)
                log.warning("removed %s, left by an interrupted save or deletion", p)

    def wait(self) -> None:
        """Joins the background save; raises its failure (once), with a fresh manager."""
        if self._worker is not None:
            self._worker.join()
            self._worker = None
        if self._broken:
            self._mngr = self._new_manager()
            self._broken = False
        if self._failure is not None:
            failure, self._failure = self._failure, None
            raise failure

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self.wait()
        finally:
            with contextlib.suppress(Exception):
                self._mngr.close()

    # -- restoring ---------------------------------------------------------------------
    def restore(self, step: int, abstract_state: Any) -> tuple[Any, dict[str, Any]]:
        """Restores checkpoint `step` (no file check, no fallback) into the shardings and dtypes
        of `abstract_state` (`jax.ShapeDtypeStruct`s with `.sharding`, e.g. `abstract_like`)."""
        ocp = self._ocp
        out = self._mngr.restore(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardRestore(abstract_state), meta=ocp.args.JsonRestore()
            ),
        )
        return out["state"], dict(out["meta"])

    def restore_latest(self, abstract_state: Any) -> tuple[int, Any, dict[str, Any]] | None:
        """(step, state, meta) of the newest checkpoint that restores cleanly; None when there
        is no checkpoint at all. Damaged ones are named, moved aside and skipped; raises
        `CheckpointError` when none is intact, or when the newest intact one does not fit
        `abstract_state` (another model or optimizer: nothing is moved then)."""
        self.wait()
        self._mngr.reload()
        earlier = sorted(p.name for p in self.dir.glob("*.damaged*")) if self.dir.is_dir() else []
        damaged: list[str] = []
        with errs.quiet_unraisable():
            for step in reversed(self.steps()):
                out = self._attempt(step, abstract_state)
                if not isinstance(out, str):
                    if damaged:
                        log.warning(
                            "falling back to checkpoint %d; steps %d.. will be recomputed",
                            step, step + 1,
                        )  # fmt: skip
                    return (step, *out)
                moved = self._move_aside(step)
                log.error("checkpoint %d is damaged (moved to %s): %s", step, moved, out)
                damaged.append(f"checkpoint {step} (moved to {moved}): {out}")
        if not damaged and not earlier:
            return None
        if earlier:
            damaged.append(f"moved aside by an earlier run: {', '.join(earlier)}")
        raise CheckpointError(
            f"no intact checkpoint in {self.dir}: {'; '.join(damaged)}. The damaged ones are "
            "kept; set checkpoint.resume: false to start from step 0"
        )

    def _attempt(self, step: int, abstract_state: Any) -> tuple[Any, dict[str, Any]] | str:
        """Checkpoint `step` restored, or what is damaged in it (agreed by every process)."""
        check = files.verify(self.dir / str(step), self._process, mode=self.verify)
        if check.status == "intact":
            log.info(
                "checkpoint %d: %d files (%s) match their checksums (%.2f s, %s/s)",
                step, check.files, errs.gb(check.nbytes), check.seconds,
                errs.gb(check.nbytes / max(check.seconds, 1e-9)),
            )  # fmt: skip
        elif check.note == "no manifest":
            log.warning(
                "checkpoint %d has no manifest (its save was cut short before the manifest, or "
                "an older version wrote it): restoring it without a file check", step
            )  # fmt: skip
        code = {"intact": 0, "unchecked": 1, "damaged": 2}[check.status]
        code, found = errs.agree(code, errs.first(check.problems))
        if code == 2:
            return found
        intact = code == 0
        try:
            on_disk = self._mngr.item_metadata(step)["state"]
        except Exception as e:
            code, msg = 1, f"its array metadata cannot be read: {errs.summarise(e)}"
        else:
            msg = errs.mismatch(on_disk, abstract_state) if on_disk is not None else ""
            code = 2 if msg else 0
        code, found = errs.agree(code, msg)
        if code == 1:
            return found
        if code == 2:
            raise CheckpointError(
                f"checkpoint {step} in {self.dir} does not fit this run's train state "
                f"({found}): was it written with another model or optimizer config? It is left "
                "in place; set checkpoint.resume: false or use another train.output_dir"
            )
        try:
            state, meta = self.restore(step, abstract_state)
            code, msg = 0, ""
        except Exception as e:
            if "RESOURCE_EXHAUSTED" in str(e):
                raise
            code, msg = (2 if intact else 1), f"orbax cannot restore it: {errs.summarise(e)}"
        code, found = errs.agree(code, msg)
        if code == 2:
            raise CheckpointError(
                f"checkpoint {step} in {self.dir} matches its checksums, so its files are as "
                f"written, but {found}"
            )
        return found if code == 1 else (state, meta)

    def _move_aside(self, step: int) -> str:
        errs.barrier(f"rlvr_ckpt_move_{step}_start")
        names = (f"{step}.damaged" + (f".{i}" if i > 1 else "") for i in itertools.count(1))
        name = next(n for n in names if not (self.dir / n).exists())
        if self._primary:
            try:
                os.rename(self.dir / str(step), self.dir / name)
            except OSError as e:
                raise CheckpointError(
                    f"checkpoint {step} in {self.dir} is damaged and cannot be moved aside to "
                    f"{name}: {errs.summarise(e)}"
                ) from e
        errs.barrier(f"rlvr_ckpt_move_{step}_done")
        self._mngr.reload()
        return name


def abstract_like(tree: Any) -> Any:
    """ShapeDtypeStructs (with shardings) of a live pytree, for `Checkpointer.restore`."""
    return jax.tree_util.tree_map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)),
        tree,
    )
