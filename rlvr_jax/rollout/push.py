"""The weight-push contract between the learner and the actors, one rule per check: an actor
(`RolloutStream.update_weights`, the schedulers' `set_params`, `VllmEngine.load`)
refuses a push out of order — its version not newer than the one it holds or was last sent
(`OutOfOrderPushError`: it would roll the policy back silently) — or partial — leaves missing,
extra or of other shapes (`PartialPushError`: an actor must never mix two policies). The
learner's side (`rlvr_jax.training.push`) bounds each push in time (`PushTimeoutError`) and
probes the actor afterwards (`StaleWeightsError`)."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from rlvr_jax.models.quant import nbytes

tree_bytes = nbytes
"""Bytes of the arrays of a params tree (what a push moves): `push/bytes`."""


class WeightPushError(RuntimeError):
    """A weight push was refused or did not complete."""


class OutOfOrderPushError(WeightPushError):
    """A push whose version is not newer than the actor's."""


class PartialPushError(WeightPushError):
    """A push whose params are not a whole policy of the actor's shapes."""


class PushTimeoutError(WeightPushError):
    """A push that did not complete within `rollout.push_timeout_s`."""


class StaleWeightsError(WeightPushError):
    """After a push, the actor's log-probs of the probe differ from the learner's by more than
    `rollout.push_probe_tolerance`."""


Signature = dict[str, tuple[int, ...]]
"""Each params leaf's shape, by its path (`jax.tree_util.keystr`)."""


def signature(params: Any) -> Signature:
    """The shape of every leaf of `params` (arrays or `jax.ShapeDtypeStruct`s), by path."""
    leaves = jax.tree_util.tree_leaves_with_path(params)
    return {jax.tree_util.keystr(path): tuple(np.shape(x)) for path, x in leaves}


def check_complete(params: Any, expected: Signature, *, version: int | None = None) -> None:
    """Raises `PartialPushError` unless `params` has exactly the leaves of `expected`, each of
    its shape; the error names up to three missing, extra and mis-shaped leaves."""
    got = signature(params)
    missing = sorted(set(expected) - set(got))
    extra = sorted(set(got) - set(expected))
    shapes = [
        f"{k} {got[k]} (expected {expected[k]})"
        for k in sorted(set(got) & set(expected))
        if got[k] != expected[k]
    ]
    problems = [
        f"{what}: {', '.join(items[:3])}{' ...' if len(items) > 3 else ''}"
        for what, items in (("missing", missing), ("extra", extra), ("other shapes", shapes))
        if items
    ]
    if problems:
        of = "" if version is None else f" of policy version {version}"
        raise PartialPushError(
            f"weight push{of} refused: not a whole policy "
            f"({len(got)} of {len(expected)} leaves; {'; '.join(problems)})"
        )


def check_order(version: int, held: int) -> None:
    """Raises `OutOfOrderPushError` unless `version` is newer than `held` (the version the
    actor holds, or was last sent)."""
    if version <= held:
        raise OutOfOrderPushError(
            f"weight push of policy version {version} refused: the actor already holds or was "
            f"sent version {held} (pushes must arrive in increasing version order)"
        )
