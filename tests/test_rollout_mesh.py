"""The engine on its own actor sub-mesh (8 simulated devices: learner 0-5, actor 6-7)."""

from __future__ import annotations

import helpers_models as H
import jax
import numpy as np
import pytest

from rlvr_jax import models, sharding
from rlvr_jax.config.schema import MeshAxes, MeshConfig
from rlvr_jax.rollout import EngineCore, RolloutStream, SamplingParams, generate


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    if jax.device_count() < 8:
        pytest.skip("needs the 8 simulated devices of tests/conftest.py")
    path = tmp_path_factory.mktemp("qwen2_mesh")
    H.build_hf_checkpoint("qwen2", path, seed=7)
    learner_mesh, actor_mesh = sharding.build_meshes(
        MeshConfig(actor_devices=2, learner=MeshAxes(fsdp=-1), actor=MeshAxes(data=-1, fsdp=1))
    )
    learner_model = models.load_pretrained(path, mesh=learner_mesh)
    return learner_model, actor_mesh, models.load_pretrained(path)


@pytest.mark.slow
def test_engine_state_and_params_live_on_the_actor_devices(setup):
    learner_model, actor_mesh, single = setup
    actor_devices = set(actor_mesh.devices.flat)
    assert actor_devices == set(jax.devices()[6:])
    core = EngineCore(learner_model, max_slots=4, max_len=32, mesh=actor_mesh)
    for leaf in jax.tree.leaves(core.params):
        assert leaf.sharding.device_set == actor_devices
    state = core.init_decode_state()
    # Slots (and their KV cache rows) split over the actor's data axis: 2 slots per device.
    k0 = state.k[0]
    assert k0.sharding.device_set == actor_devices
    assert {s.data.shape for s in k0.addressable_shards} == {
        (k0.shape[0], k0.shape[1] // 2, *k0.shape[2:])
    }

    prompts = [[5, 6, 7], [9, 10, 11, 12], [3], [40, 41]]
    kw = dict(max_new_tokens=6, temperature=1.0, num_samples=2, seed=1)
    sharded = generate(core, prompts, **kw)
    reference = generate(EngineCore(single, max_slots=4, max_len=32), prompts, **kw)
    assert [c.tokens for c in sharded] == [c.tokens for c in reference]
    np.testing.assert_allclose(
        np.concatenate([c.logprobs for c in sharded]),
        np.concatenate([c.logprobs for c in reference]),
        atol=1e-5,
    )


@pytest.mark.slow
def test_weight_update_moves_learner_params_to_the_actor(setup):
    learner_model, actor_mesh, single = setup
    core = EngineCore(learner_model, max_slots=4, max_len=32, mesh=actor_mesh)
    new_params = jax.tree.map(lambda x: 1.25 * x, learner_model.params)  # on devices 0-5
    assert all(
        leaf.sharding.device_set <= set(jax.devices()[:6]) for leaf in jax.tree.leaves(new_params)
    )
    stream = RolloutStream(core, max_new_tokens=5, sampling=SamplingParams(temperature=0.0))
    stream.update_weights(new_params, version=3)
    stream.submit("a", [5, 6, 7], num_samples=1, seed=0)
    groups = []
    while not stream.idle:
        groups += stream.step()
    (c,) = groups[0].completions
    assert c.policy_versions == [3] * 5
    import dataclasses

    want = generate(
        dataclasses.replace(single, params=jax.tree.map(lambda x: 1.25 * x, single.params)),
        [[5, 6, 7]],
        max_new_tokens=5,
        temperature=0.0,
        max_slots=4,
    )
    assert c.tokens == want[0].tokens


@pytest.mark.slow
def test_tensor_parallel_engine_holds_what_the_plan_says(tmp_path_factory):
    """8 devices as data 4 × tensor 2: decode weights split over heads / mlp (the fused
    q|k|v and gate|up grouped per tensor shard), the page pool over KV heads and data
    shards. The bytes each device holds match the dry-run plan within 10%, and the
    sharded engine samples exactly what a single-device engine does."""
    import collections

    from rlvr_jax.config import load
    from rlvr_jax.plan import make_plan

    path = tmp_path_factory.mktemp("qwen2_tp")
    H.build_hf_checkpoint("qwen2", path, seed=3)
    mesh = sharding.make_mesh({"data": 4, "tensor": 2})
    model = models.load_pretrained(path)
    core = EngineCore(model, max_slots=8, max_len=64, mesh=mesh)
    w = core.params.layers[0]
    assert w.tp == 2 and w.qkv.sharding.spec == jax.P(None, "tensor")
    assert w.gate_up.sharding.spec == jax.P(None, "tensor") and w.o.sharding.spec[0] == "tensor"
    state = core.init_decode_state()
    assert state.k[0].sharding.spec[:2] == ("tensor", "data")
    per_device = collections.Counter()
    for leaf in jax.tree.leaves((core.params, state)):
        for shard in leaf.addressable_shards:
            per_device[shard.device.id] += shard.data.nbytes
    assert len(per_device) == 8

    cfg = load(
        "configs/demo.yaml",
        [
            f"model.path={path}",
            "mesh.actor={data: 4, tensor: 2}",
            "data.max_prompt_len=32",
            "rollout.max_new_tokens=32",
            "rollout.max_slots=8",
            "rollout.kv_layout=paged",  # the engine above (the demo decodes contiguous)
        ],
    )
    plan = make_plan(cfg, n_devices=8)
    assert plan.actor_axes == {"data": 4, "fsdp": 1, "tensor": 2}
    assert plan.kv["pages"] == core.spec.num_pages
    assert max(per_device.values()) == pytest.approx(plan.actor_total, rel=0.10)

    prompts = [[5, 6, 7], [9, 10, 11, 12], [3], [40, 41]]
    for kw in (dict(temperature=0.0), dict(temperature=1.0, num_samples=2, seed=1)):
        sharded = generate(core, prompts, max_new_tokens=12, **kw)
        reference = generate(
            EngineCore(model, max_slots=8, max_len=64), prompts, max_new_tokens=12, **kw
        )
        assert [c.tokens for c in sharded] == [c.tokens for c in reference]
        np.testing.assert_allclose(
            np.concatenate([c.logprobs for c in sharded]),
            np.concatenate([c.logprobs for c in reference]),
            atol=1e-5,
        )
