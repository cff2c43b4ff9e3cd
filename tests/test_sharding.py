"""Meshes, logical-axis rules, sharded forward / decode, learner → actor resharding.

Runs on the 8 simulated CPU devices of tests/conftest.py. Reference for every sharded
computation: the same function on one device.
"""

from __future__ import annotations

import functools

import helpers_models as H
import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from rlvr_jax import models, sharding
from rlvr_jax.config.schema import MeshAxes, MeshConfig
from rlvr_jax.rollout import EngineCore, generate

pytestmark = pytest.mark.skipif(
    jax.device_count() < 8, reason="needs 8 devices (tests/conftest.py simulates them)"
)

TOL = 1e-5


def _device_ids(array) -> set[int]:
    return {d.id for d in array.sharding.device_set}


# ---- meshes ----------------------------------------------------------------------------


def test_make_mesh_axes_and_errors():
    mesh = sharding.make_mesh({"fsdp": 2, "tensor": 4})
    assert mesh.axis_names == ("data", "fsdp", "tensor")
    assert dict(mesh.shape) == {"data": 1, "fsdp": 2, "tensor": 4}
    # tensor varies fastest: devices 0-3 form the first tensor-parallel group
    assert [d.id for d in mesh.devices[0, 0]] == [0, 1, 2, 3]
    assert dict(sharding.make_mesh({"data": 2, "fsdp": -1}).shape)["fsdp"] == 4
    with pytest.raises(ValueError, match="at most one -1"):
        sharding.make_mesh({"data": -1, "fsdp": -1})
    with pytest.raises(ValueError, match="do not divide 8 devices"):
        sharding.make_mesh({"data": 3, "fsdp": -1})
    with pytest.raises(ValueError, match="need 4 devices, got 8"):
        sharding.make_mesh({"data": 4})
    with pytest.raises(ValueError, match=r"\['pipeline'\] are unknown"):
        sharding.make_mesh({"pipeline": 2})


def test_split_devices_and_build_meshes():
    devices = jax.devices()
    learner, actor = sharding.split_devices(devices, 2)
    assert [d.id for d in learner] == [0, 1, 2, 3, 4, 5] and [d.id for d in actor] == [6, 7]
    assert sharding.split_devices(devices, 0) == (devices, devices)
    for bad in (8, -1):
        with pytest.raises(ValueError, match=f"actor_devices={bad}"):
            sharding.split_devices(devices, bad)
    cfg = MeshConfig(
        actor_devices=2,
        learner=MeshAxes(data=3, fsdp=-1, tensor=1),
        actor=MeshAxes(data=-1, fsdp=1, tensor=1),
    )
    learner_mesh, actor_mesh = sharding.build_meshes(cfg)
    assert dict(learner_mesh.shape) == {"data": 3, "fsdp": 2, "tensor": 1}
    assert dict(actor_mesh.shape) == {"data": 2, "fsdp": 1, "tensor": 1}
    assert {d.id for d in actor_mesh.devices.flat} == {6, 7}
    with pytest.raises(ValueError, match=r"mesh\.learner: .*do not divide 6 devices"):
        sharding.build_meshes(MeshConfig(actor_devices=2, learner=MeshAxes(data=4, fsdp=-1)))


def test_logical_to_spec_rules_and_divisibility():
    mesh = sharding.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    rules = sharding.LEARNER_RULES
    names = ("layers", "embed", "kv_heads", "head_dim")
    assert sharding.logical_to_spec(names, rules) == P(None, "fsdp", "tensor", None)
    # 1 KV head cannot be split over tensor=2: that dimension stays replicated
    assert sharding.logical_to_spec(names, rules, mesh, (2, 64, 1, 16)) == P(
        None, "fsdp", None, None
    )
    # batch -> (data, fsdp): 6 rows split over data only, 8 over both, 3 not at all
    for rows, spec in ((6, "data"), (8, ("data", "fsdp")), (3, None)):
        assert sharding.logical_to_spec(("batch", None), rules, mesh, (rows, 5)) == P(spec, None)
    # a mesh axis shards at most one dimension of an array
    assert sharding.logical_to_spec(("vocab", "mlp"), rules) == P("tensor", None)
    assert sharding.ACTOR_RULES["embed"] is None and sharding.ACTOR_RULES["heads"] == "tensor"
    with pytest.raises(KeyError, match="'nonsense' has no rule"):
        sharding.logical_to_spec(("nonsense",), rules)
    with pytest.raises(ValueError, match="unknown mesh axis 'model'"):
        sharding.Rules({"embed": "model"})
    assert hash(sharding.LEARNER_RULES.replace(embed="fsdp")) == hash(sharding.LEARNER_RULES)


# ---- sharded forward -------------------------------------------------------------------


@functools.cache
def _checkpoint(tmp_root: str, arch: str, kv_heads: int):
    import pathlib

    path = pathlib.Path(tmp_root) / f"{arch}_{kv_heads}"
    H.build_hf_checkpoint(arch, path, seed=21, num_key_value_heads=kv_heads)
    return path


def _batch(b: int = 8, t: int = 10):
    tokens_BxT = H.random_tokens(b, t, seed=22)
    mask_BxT = np.ones_like(tokens_BxT)
    mask_BxT[1, :3] = 0  # one left-padded row
    positions_BxT = models.positions_from_mask(mask_BxT)
    return tokens_BxT, positions_BxT, models.segments_from_positions(positions_BxT, mask_BxT)


@pytest.mark.parametrize(
    "axes, arch, kv_heads, expected_q_spec",
    [
        ({"fsdp": 8}, "llama", 2, P(None, "fsdp", None, None)),
        ({"fsdp": 2, "tensor": 4}, "olmo3", 4, P(None, "fsdp", "tensor", None)),
        ({"data": 2, "tensor": 4}, "qwen3", 2, P(None, None, "tensor", None)),
    ],
)
@pytest.mark.slow
def test_sharded_forward_equals_unsharded(tmp_path_factory, axes, arch, kv_heads, expected_q_spec):
    path = _checkpoint(str(tmp_path_factory.getbasetemp()), arch, kv_heads)
    model = models.load_pretrained(path)
    inputs = _batch()
    ref = np.asarray(
        jax.jit(models.apply, static_argnames="config")(model.params, model.config, *inputs)
    )

    mesh = sharding.make_mesh(axes)
    rules = sharding.LEARNER_RULES
    shardings = models.param_shardings(model.config, mesh, rules)
    params = models.shard_params(model.params, mesh, rules, model.config)
    q_kernel = params["layers"]["attn"]["q_proj"]["kernel"]
    assert q_kernel.sharding.spec == expected_q_spec
    assert len(_device_ids(q_kernel)) == 8
    batch_sh = sharding.batch_sharding(mesh, rules, inputs[0].shape)
    logits_sh = NamedSharding(
        mesh,
        sharding.logical_to_spec(
            ("batch", "activation_length", "activation_vocab"), rules, mesh, ref.shape
        ),
    )
    step = jax.jit(
        lambda p, tokens, positions, segments: models.apply(
            p, model.config, tokens, positions, segments, mesh=mesh, rules=rules
        ),
        in_shardings=(shardings, batch_sh, batch_sh, batch_sh),
        out_shardings=logits_sh,
    )
    logits = step(params, *inputs)
    assert logits.sharding == logits_sh
    np.testing.assert_allclose(np.asarray(logits), ref, rtol=0, atol=TOL)


@pytest.mark.slow
def test_load_pretrained_streams_into_mesh(tmp_path_factory):
    path = _checkpoint(str(tmp_path_factory.getbasetemp()), "olmo3", 4)
    mesh = sharding.make_mesh({"fsdp": 4, "tensor": 2})
    model = models.load_pretrained(path, mesh=mesh)
    plain = models.load_pretrained(path)
    expected = models.param_shardings(model.config, mesh, sharding.LEARNER_RULES)
    for leaf, want, ref in zip(
        jax.tree.leaves(model.params), jax.tree.leaves(expected), jax.tree.leaves(plain.params)
    ):
        assert leaf.sharding.is_equivalent_to(want, leaf.ndim)
        np.testing.assert_array_equal(np.asarray(leaf), np.asarray(ref))
    embedding = model.params["embedding"]
    assert embedding.addressable_shards[0].data.shape == (128 // 2, 64 // 4)
    tokens_BxT = H.random_tokens(4, 9, seed=23)
    np.testing.assert_allclose(
        np.asarray(models.forward(model, tokens_BxT)),
        np.asarray(models.forward(plain, tokens_BxT)),
        rtol=0,
        atol=TOL,
    )


# ---- learner / actor sub-meshes ---------------------------------------------------------


@pytest.mark.slow
def test_learner_to_actor_reshard_and_sharded_decode(tmp_path_factory):
    path = _checkpoint(str(tmp_path_factory.getbasetemp()), "olmo3", 4)
    cfg = MeshConfig(
        actor_devices=2,
        learner=MeshAxes(data=3, fsdp=2, tensor=1),
        actor=MeshAxes(data=1, fsdp=1, tensor=2),
    )
    learner_mesh, actor_mesh = sharding.build_meshes(cfg)
    learner = models.load_pretrained(path, mesh=learner_mesh)
    for leaf in jax.tree.leaves(learner.params):
        assert _device_ids(leaf) == {0, 1, 2, 3, 4, 5}
    assert learner.params["layers"]["mlp"]["up_proj"]["kernel"].sharding.spec == P(
        None, "fsdp", None
    )

    actor_shardings = models.param_shardings(learner.config, actor_mesh, sharding.ACTOR_RULES)
    actor_params = sharding.reshard(learner.params, actor_shardings)
    for leaf, src in zip(jax.tree.leaves(actor_params), jax.tree.leaves(learner.params)):
        assert _device_ids(leaf) == {6, 7}
        np.testing.assert_array_equal(np.asarray(leaf), np.asarray(src))
    up = actor_params["layers"]["mlp"]["up_proj"]["kernel"]
    assert up.sharding.spec == P(None, None, "tensor")  # ACTOR_RULES: no fsdp, mlp over tensor
    assert up.addressable_shards[0].data.shape == (4, 64, 96 // 2)

    # the engine on the actor mesh (tensor-parallel decode) equals the single-device one
    prompts = H.random_tokens(2, 6, seed=24).tolist()
    kw = dict(max_new_tokens=5, temperature=1.0, num_samples=2, seed=3)
    sharded_core = EngineCore(learner, max_slots=4, max_len=16, mesh=actor_mesh)
    k0 = sharded_core.init_decode_state().k[0]
    assert _device_ids(k0) == {6, 7}
    assert k0.sharding.spec[0] == "tensor"  # the pool's KV heads over the tensor axis
    sharded = generate(sharded_core, prompts, **kw)
    plain = EngineCore(models.load_pretrained(path), max_slots=4, max_len=16)
    reference = generate(plain, prompts, **kw)
    assert [c.tokens for c in sharded] == [c.tokens for c in reference]
    np.testing.assert_allclose(
        np.concatenate([c.logprobs for c in sharded]),
        np.concatenate([c.logprobs for c in reference]),
        rtol=0,
        atol=1e-5,
    )
