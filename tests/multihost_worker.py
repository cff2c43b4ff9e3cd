"""One process of the two-process learner test (run by tests/test_multihost.py).

usage: python tests/multihost_worker.py PROCESS_ID NUM_PROCESSES PORT OUT.npz
Runs 3 learner steps on a fixed batch over a learner mesh spanning every process's devices,
then moves the params to an actor sub-mesh that lives on the last process's devices.
With NUM_PROCESSES=1 it is the single-process reference on 8 local devices.
"""

import os
import sys

pid, nproc, port, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
from helpers_cli import xla_flags  # noqa: E402  (the standard library only)

os.environ["XLA_FLAGS"] = xla_flags(8 // nproc)
os.environ["JAX_PLATFORMS"] = "cpu"

import helpers_models as H  # noqa: E402
import jax  # noqa: E402
import jax.experimental.multihost_utils  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from helpers_multihost import init_local  # noqa: E402

from rlvr_jax import losses, models, sharding  # noqa: E402
from rlvr_jax.training import learner  # noqa: E402
from rlvr_jax.training.batch import Sample, collate  # noqa: E402
from rlvr_jax.training.distributed import global_tree  # noqa: E402

if nproc > 1:
    init_local(pid, nproc, port)
assert jax.device_count() == 8, jax.device_count()

ARCH = H.tiny_arch(model_type="llama", tie_word_embeddings=False)
rng = np.random.default_rng(0)
samples = [
    Sample(
        rng.integers(3, 60, 4).tolist(),
        rng.integers(3, 60, n).tolist(),
        (-rng.random(n)).tolist(),
        float(rng.normal()),
    )
    for n in (3, 7, 1, 6, 2, 5, 4, 8)
]
host_batch = collate(samples, rows=8, seq_len=16, pad_id=0)
host_params = jax.device_get(models.init_params(ARCH, jax.random.key(0)))

# learner: devices 0, 1 of every process; actor: devices 2, 3 of every process — both
# sub-meshes span the processes (device order: process 0's four, then process 1's four)
devs = jax.devices()
learner_devices = [devs[i] for i in (0, 1, 4, 5)]
actor_devices = [devs[i] for i in (2, 3, 6, 7)]
mesh = sharding.make_mesh({"data": 2, "fsdp": 2}, learner_devices)
params = global_tree(host_params, models.param_shardings(ARCH, mesh, sharding.LEARNER_RULES))
batch_sh = jax.tree.map(
    lambda v: sharding.batch_sharding(mesh, sharding.LEARNER_RULES, v.shape), host_batch
)
batch = global_tree(host_batch, batch_sh)
opt = optax.adamw(1e-2)
state = learner.init_state(params, opt, mesh=mesh)
state_sh = jax.tree.map(lambda x: x.sharding, state)
step = learner.jit_train_step(
    learner.make_train_step(
        ARCH, opt, losses.resolve_loss_settings("olmo3"), max_len=15, n_micro=2
    ),
    state_sh,
    batch_sh,
)
loss_values = []
for _ in range(3):
    state, metrics = step(state, batch)
    loss_values.append(float(metrics["loss"]))  # a replicated scalar: addressable everywhere

# learner → actor sub-mesh (a cross-process move when nproc > 1)
actor_mesh = sharding.make_mesh({"data": 2, "tensor": 2}, actor_devices)
actor_params = sharding.reshard(
    state.params, models.param_shardings(ARCH, actor_mesh, sharding.ACTOR_RULES)
)
leaf = actor_params["embedding"]
assert set(leaf.sharding.device_set) == set(actor_devices)
# every process checks its own shards of the moved array against the learner's values
full = np.asarray(
    jax.experimental.multihost_utils.process_allgather(state.params["embedding"], tiled=True)
)
for shard in leaf.addressable_shards:
    np.testing.assert_allclose(np.asarray(shard.data), full[shard.index], atol=0)
np.savez(f"{out}.{pid}", loss=np.array(loss_values), embedding=full)
print("worker", pid, "losses", loss_values, flush=True)
if nproc > 1:
    jax.distributed.shutdown()
