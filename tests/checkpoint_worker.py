"""One process of the two-process checkpoint test (run by tests/test_checkpoint.py).

usage: python tests/checkpoint_worker.py PROCESS_ID NUM_PROCESSES PORT OUTPUT_DIR PHASE
PHASE "save" writes checkpoints 1 and 2 of a state sharded over both processes' devices (each
process writes its own `ocdbt.process_<i>` files and manifest); PHASE "restore" runs
`restore_latest` and prints `RESULT {json}` with the step restored, whether the values are
those of that step, and this process's error log lines.
"""

import json
import logging
import os
import sys

pid, nproc, port = (int(a) for a in sys.argv[1:4])
out, phase = sys.argv[4], sys.argv[5]
from helpers_cli import xla_flags  # noqa: E402  (the standard library only)

os.environ["XLA_FLAGS"] = xla_flags(8 // nproc)
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402
import numpy as np  # noqa: E402
from helpers_multihost import init_local  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec  # noqa: E402

from rlvr_jax.training.checkpoint import Checkpointer, CheckpointError  # noqa: E402
from rlvr_jax.training.distributed import global_tree  # noqa: E402

init_local(pid, nproc, port)
mesh = jax.make_mesh((8,), ("x",))
sharded, replicated = NamedSharding(mesh, PartitionSpec("x")), NamedSharding(mesh, PartitionSpec())
shardings = {"w": sharded, "b": replicated}


def state(k: int) -> dict:
    w = np.arange(64 * 32, dtype=np.float32).reshape(64, 32) + k
    return global_tree({"w": w, "b": np.full((4,), k, np.float32)}, shardings)


errors: list[str] = []


class Keep(logging.Handler):
    def emit(self, record):
        if record.levelno >= logging.ERROR:
            errors.append(record.getMessage())


logging.getLogger("rlvr_jax.training.checkpoint").addHandler(Keep())
ckpt = Checkpointer(out, keep=3)
if phase == "save":
    for step in (1, 2):
        ckpt.save(step, state(step), {"step": step})
    ckpt.close()
    print("RESULT " + json.dumps({"saved": True}))
else:
    abstract = {
        k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=v.sharding) for k, v in state(0).items()
    }
    try:
        step, restored, meta = ckpt.restore_latest(abstract)
        want = state(step)
        same = all(
            np.array_equal(np.asarray(a.addressable_data(0)), np.asarray(b.addressable_data(0)))
            for a, b in zip(jax.tree_util.tree_leaves(restored), jax.tree_util.tree_leaves(want))
        )
        result = {"step": step, "meta_step": meta["step"], "values_match": same}
    except CheckpointError as e:
        result = {"error": str(e)}
    ckpt.close()
    print("RESULT " + json.dumps({**result, "errors": errors}))
