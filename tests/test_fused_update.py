"""The RL update is one jitted program (θ_old's and the reference's log-probs, the advantages,
every mini-batch's optimizer step): it equals the host sequence of jitted calls it replaces —
each log-prob pass, PPO's GAE and each mini-batch's step called on its own, every intermediate
put back on the mesh — on a tiny model over the simulated 8-device learner mesh: the same
params (and critic) after the update, the same metrics."""

import dataclasses
import types

import helpers_models as H
import jax
import numpy as np
import pytest
from test_packing import SEQ, samples

from rlvr_jax import config, losses, models, sharding
from rlvr_jax.training.algorithms import ALGORITHMS
from rlvr_jax.training.algorithms.rl import kl_advantages
from rlvr_jax.training.batch import collate, mini_batch
from rlvr_jax.training.context import Context
from rlvr_jax.training.sources import Batch
from rlvr_jax.training.update import jit_train_step

ARCH = H.tiny_arch()
G = 4  # completions per group

CASES = {
    # two mini-batches: θ_old's log-probs before the first step, the ratio against them
    "olmo3-two-updates": (["loss.preset=olmo3", "train.updates_per_batch=2"], 2),
    # KL in the loss: the reference's log-probs; the ratio against the sampler's log-probs (no
    # old ones), so mini-batch u's tokens lag u more versions
    "grpo-kl-sampler-two-updates": (
        ["loss.preset=grpo", "loss.ratio_denominator=sampler", "train.updates_per_batch=2"],
        2,
    ),
    # KL in the reward: the advantages of the penalised rewards of two kept groups of three
    "kl-reward": (
        [
            "loss.preset=olmo3",
            "loss.kl_mode=reward",
            "loss.kl_coef=0.05",
            "train.prompts_per_batch=3",
        ],
        1,
    ),
    # PPO: the critic's values and GAE before two steps of policy + value loss
    "ppo-two-updates": (
        ["loss.preset=ppo", "critic.kind=shared", "train.updates_per_batch=2"],
        2,
    ),
}


def context(overrides: list[str]) -> Context:
    cfg = config.load(
        None,
        [
            "train.prompts_per_batch=2",
            *overrides,
            "model.path=unused",  # the policy is built here
            f"rollout.num_samples={G}",
            "data.max_prompt_len=8",
            f"rollout.max_new_tokens={SEQ - 8}",
            "train.learning_rate=0.05",
            "train.warmup_steps=0",
        ],
    )
    mesh = sharding.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    shardings = models.param_shardings(ARCH, mesh, sharding.LEARNER_RULES)
    params = sharding.reshard(models.init_params(ARCH, jax.random.key(0)), shardings)
    model = models.Model(ARCH, params, mesh=mesh, rules=sharding.LEARNER_RULES)
    tokenizer = types.SimpleNamespace(pad_token_id=0)
    settings = losses.loss_settings_from_config(cfg.loss)
    return Context(cfg, model, tokenizer, mesh, mesh, settings, stop=lambda: False)


def step_by_step(update, state, batch: Batch):
    """The update as the host sequence of jitted calls it replaces."""
    ctx, U = update.ctx, update.updates
    arrays = batch.arrays
    if not update.needs_old and U > 1:  # mini-batch u is scored by the params after u steps
        lag = np.array(arrays.lag_BxT)
        n = lag.shape[0] // U
        for u in range(1, U):
            lag[u * n : (u + 1) * n] += u
        arrays = arrays.replace(lag_BxT=lag)
    full = ctx.put(arrays)
    if update.needs_old:
        full = full.replace(old_logp_BxT=update.logprob(state.params, full))
    if update.needs_ref:
        full = full.replace(ref_logp_BxT=update.logprob(ctx.model.params, full))
    before = {}
    if ctx.settings.uses_critic:
        full, before = update.gae(state.params, state.critic.params, full)
        full = ctx.put(full)
    elif ctx.settings.reward_kl_coef > 0:  # eager, as it was
        slots, rewards = np.asarray(batch.slots), batch.rewards_B
        adv = kl_advantages(full, slots, rewards, settings=ctx.settings, group_size=G)
        full = full.replace(advantages_B=ctx.put(adv))
    step = jit_train_step(update.train_step, jax.tree.map(lambda x: x.sharding, state))
    out = []
    for u in range(U):
        state, metrics = step(state, ctx.put(mini_batch(full, u, U)) if U > 1 else full)
        out.append({**metrics, **before})
    return state, out


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_the_fused_update_equals_the_step_by_step_sequence(case, caplog):
    overrides, updates = CASES[case]
    ctx = context(overrides)
    rewards = np.random.default_rng(1).integers(0, 2, 2 * G).astype(np.float32)
    s = samples(groups=2, group_size=G)  # kl-reward: fewer than the batch holds, padding rows
    s = [dataclasses.replace(x, reward=float(r)) for x, r in zip(s, rewards)]  # PPO's returns
    arrays = collate(s, rows=ctx.rows, seq_len=SEQ, pad_id=0)
    if ctx.settings.reward_kl_coef > 0:
        arrays = arrays.replace(advantages_B=np.zeros_like(arrays.advantages_B))
    batch = Batch(
        arrays,
        rewards_B=rewards,
        group_size=G,
        slots=np.arange(len(s)),
    )
    update = ALGORITHMS["rl"].update(ctx)
    assert update.updates == updates
    a_state, b_state = (update.init_state(ctx.model.params) for _ in range(2))
    update.compile(a_state, batch)
    with jax.log_compiles(), caplog.at_level("WARNING"):  # compiled ahead: no program compiles
        a_state, fused, n = update.update(a_state, batch)
        jax.block_until_ready((a_state, fused))
    compiled = [r.getMessage() for r in caplog.records if "Compiling" in r.getMessage()]
    assert not [m for m in compiled if "jit(step)" in m or "jit(prepare)" in m], compiled
    b_state, sequence = step_by_step(update, b_state, batch)
    assert n == updates == len(fused) == len(sequence)
    fused, sequence = jax.device_get((fused, sequence))
    for u, (got, want) in enumerate(zip(fused, sequence)):
        assert sorted(got) == sorted(want)
        for key in want:
            np.testing.assert_allclose(
                got[key], want[key], rtol=1e-5, atol=1e-6, err_msg=f"{u} {key}"
            )
    assert int(a_state.step) == int(b_state.step) == updates
    start = jax.tree.leaves(ctx.model.params)
    a_leaves, b_leaves = jax.tree.leaves(a_state.params), jax.tree.leaves(b_state.params)
    moved = max(float(np.abs(np.asarray(y) - np.asarray(p)).max()) for y, p in zip(b_leaves, start))
    assert moved > 1e-4  # the steps changed the params: not a comparison of two no-ops
    if ctx.settings.uses_critic:
        a_leaves += jax.tree.leaves(a_state.critic.params)
        b_leaves += jax.tree.leaves(b_state.critic.params)
    for x, y in zip(a_leaves, b_leaves, strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)
