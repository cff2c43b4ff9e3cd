"""Tensor-parallel decode on an actor sub-mesh == single-device decode, in a fresh process
(run by tests/test_sharding.py: the many programs a long pytest process has compiled made the
CPU runtime crash natively in this check once; a fresh interpreter keeps it deterministic).

usage: python tests/sharded_decode_worker.py CHECKPOINT_DIR
Exits 0 when the paged engine on devices {6, 7} (KV heads over the tensor axis) gives the same
tokens and log-probs (within 1e-5) as the engine on one device; prints the mismatch otherwise.
"""

import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
os.environ["JAX_PLATFORMS"] = "cpu"

import jax
import numpy as np
from helpers_models import random_tokens

from rlvr_jax import models, sharding
from rlvr_jax.config.schema import MeshAxes, MeshConfig
from rlvr_jax.rollout import EngineCore, generate

path = sys.argv[1]
cfg = MeshConfig(
    actor_devices=2,
    learner=MeshAxes(data=3, fsdp=2, tensor=1),
    actor=MeshAxes(data=1, fsdp=1, tensor=2),
)
learner_mesh, actor_mesh = sharding.build_meshes(cfg)
learner = models.load_pretrained(path, mesh=learner_mesh)
prompts = random_tokens(2, 6, seed=24).tolist()
kw = dict(max_new_tokens=5, temperature=1.0, num_samples=2, seed=3)
sharded_core = EngineCore(learner, max_slots=4, max_len=16, mesh=actor_mesh)
k0 = sharded_core.init_decode_state().k[0]
assert {d.id for d in k0.sharding.device_set} == {6, 7}, k0.sharding
assert k0.sharding.spec[0] == "tensor", k0.sharding.spec  # the pool's KV heads over tensor
sharded = generate(sharded_core, prompts, **kw)
reference = generate(
    EngineCore(models.load_pretrained(path), max_slots=4, max_len=16), prompts, **kw
)
assert [c.tokens for c in sharded] == [c.tokens for c in reference], "tokens differ"
np.testing.assert_allclose(
    np.concatenate([c.logprobs for c in sharded]),
    np.concatenate([c.logprobs for c in reference]),
    rtol=0,
    atol=1e-5,
)
assert jax.device_count() == 8
print("sharded decode == single-device decode")
