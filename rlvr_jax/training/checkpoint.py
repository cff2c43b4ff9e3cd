"""Orbax checkpoints in `<output_dir>/checkpoints/`: train state (params, optimizer, step,
skipped-step count) as arrays, and a JSON side-car (data-iterator state, RNG seed state, policy
version, anything else the loop needs to resume exactly).

Saves are asynchronous; orbax writes into a temporary directory and renames it when complete,
so a half-written checkpoint is never listed, and `latest_step()` only sees finished ones.
Keep-last-N is orbax's `max_to_keep`.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import jax

log = logging.getLogger(__name__)


class Checkpointer:
    """Save/restore of (train state pytree, JSON metadata) by step."""

    def __init__(self, output_dir: str | Path, *, keep: int = 2, async_save: bool = True):
        import orbax.checkpoint as ocp

        self._ocp = ocp
        self.dir = Path(output_dir).absolute() / "checkpoints"
        options = ocp.CheckpointManagerOptions(
            max_to_keep=max(keep, 1),
            enable_async_checkpointing=async_save,
            create=True,
        )
        self._mngr = ocp.CheckpointManager(self.dir, options=options)

    def latest_step(self) -> int | None:
        return self._mngr.latest_step()

    def save(self, step: int, state: Any, meta: dict[str, Any]) -> None:
        ocp = self._ocp
        self._mngr.save(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)
            ),
        )

    def restore(self, step: int, abstract_state: Any) -> tuple[Any, dict[str, Any]]:
        """Restores into the shardings and dtypes of `abstract_state` (a pytree of
        `jax.ShapeDtypeStruct` with `.sharding`, e.g. from `jax.eval_shape`)."""
        ocp = self._ocp
        out = self._mngr.restore(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardRestore(abstract_state), meta=ocp.args.JsonRestore()
            ),
        )
        return out["state"], dict(out["meta"])

    def restore_latest(self, abstract_state: Any) -> tuple[int, Any, dict[str, Any]] | None:
        """(step, state, meta) of the newest checkpoint; None when there is none."""
        latest = self.latest_step()
        if latest is None:
            return None
        state, meta = self.restore(latest, abstract_state)
        return latest, state, meta

    def wait(self) -> None:
        self._mngr.wait_until_finished()

    def close(self) -> None:
        self._mngr.wait_until_finished()
        self._mngr.close()


def abstract_like(tree: Any) -> Any:
    """ShapeDtypeStructs (with shardings) of a live pytree, for `Checkpointer.restore`."""
    return jax.tree_util.tree_map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)),
        tree,
    )
