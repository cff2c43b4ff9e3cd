"""policy_loss against an independent straightforward reference, finite differences, and the
micro-batch / data-parallel property of the global denominators."""

import itertools
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlvr_jax import losses

B, T, MAX_LEN = 4, 6, 8
LENGTHS = np.array([6, 3, 1, 0])  # the last row is all-masked (e.g. filtered as overlong)
RNG = np.random.default_rng(8)
MASK = (np.arange(T)[None, :] < LENGTHS[:, None]).astype(np.float32)
OLD = -RNG.exponential(1.0, (B, T)).astype(np.float32)
LOGP = (OLD + RNG.normal(0.0, 0.25, (B, T))).astype(np.float32)  # ratios ~ 1 ± 25%: clipping acts
SAMPLER = (OLD + RNG.normal(0.0, 0.4, (B, T))).astype(np.float32)  # some TIS weights hit C
REF = (OLD + RNG.normal(0.0, 0.3, (B, T))).astype(np.float32)
ADV = np.array([1.0, -0.7, 0.4, 2.0], np.float32)

# clip ranges each variant is tested with (None = the variant's defaults, in the reference too)
EPS = {
    "ppo_clip": (0.2, 0.28),
    "cispo": (None, None),  # defaults: ∞ below, 0.28 above
    "gspo": (0.05, 0.08),
    "gspo_token": (0.05, 0.08),
    "reinforce": (None, None),
}
REFERENCE_EPS = {**EPS, "cispo": (np.inf, 0.28)}
AGGS = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
TIS_CAP, KL_COEF = 1.5, 0.1


def reference_loss(logp, variant, agg, tis, kl):
    """Straightforward re-derivation from ALGORITHMS.md: per token, then a loop over rows."""
    eps_low, eps_high = REFERENCE_EPS[variant]
    total = 0.0
    rows, tokens = 0, 0
    for i in range(B):
        n = int(LENGTHS[i])
        if n == 0:
            continue
        lp, old, a = logp[i, :n], OLD[i, :n], ADV[i]
        if variant == "ppo_clip":
            r = jnp.exp(lp - old)
            ell = -jnp.minimum(r * a, jnp.clip(r, 1 - eps_low, 1 + eps_high) * a)
        elif variant == "cispo":
            r = jax.lax.stop_gradient(jnp.exp(lp - old))
            ell = -jnp.minimum(r, 1 + eps_high) * a * lp
        elif variant == "gspo":
            s = jnp.exp(jnp.sum(lp - old) / n)
            ell = jnp.full((n,), -jnp.minimum(s * a, jnp.clip(s, 1 - eps_low, 1 + eps_high) * a))
        elif variant == "gspo_token":
            s = jax.lax.stop_gradient(jnp.exp(jnp.sum(lp - old) / n)) * jnp.exp(
                lp - jax.lax.stop_gradient(lp)
            )
            ell = -jnp.minimum(s * a, jnp.clip(s, 1 - eps_low, 1 + eps_high) * a)
        else:  # reinforce
            ell = -a * lp
        if tis:
            ell = ell * np.minimum(np.exp(OLD[i, :n] - SAMPLER[i, :n]), TIS_CAP)
        if kl:
            delta = REF[i, :n] - lp
            ell = ell + KL_COEF * (jnp.exp(delta) - 1 - delta)
        total = total + (jnp.sum(ell) / n if agg == "seq-mean-token-mean" else jnp.sum(ell))
        rows, tokens = rows + 1, tokens + n
    denominator = {
        "token-mean": tokens,
        "seq-mean-token-mean": rows,
        "seq-mean-token-sum": rows,
        "seq-mean-token-sum-norm": rows * MAX_LEN,
    }[agg]
    return total / denominator


def library_loss(logp, variant, agg, tis, kl, **extra):
    eps_low, eps_high = EPS[variant]
    loss, _ = losses.policy_loss(
        variant,
        logp=logp,
        old_logp=OLD,
        advantages=ADV,
        mask=MASK,
        sampler_logp=SAMPLER,
        ref_logp=REF,
        eps_low=eps_low,
        eps_high=eps_high,
        agg=agg,
        tis_cap=TIS_CAP if tis else None,
        kl_coef=KL_COEF if kl else 0.0,
        max_len=MAX_LEN,
        **extra,
    )
    return loss


@pytest.mark.parametrize(
    ("variant", "agg", "tis", "kl"),  # the fast tier runs each variant x agg with TIS and KL on
    [
        pytest.param(*case, marks=() if case[2] and case[3] else pytest.mark.slow)
        for case in itertools.product(EPS, AGGS, [False, True], [False, True])
    ],
)
def test_matches_reference(variant, agg, tis, kl):
    args = dict(variant=variant, agg=agg, tis=tis, kl=kl)
    value, grad = jax.jit(jax.value_and_grad(partial(library_loss, **args)))(jnp.asarray(LOGP))
    ref_value, ref_grad = jax.value_and_grad(partial(reference_loss, **args))(jnp.asarray(LOGP))
    np.testing.assert_allclose(value, ref_value, rtol=2e-5, atol=1e-6)
    np.testing.assert_allclose(grad, ref_grad, rtol=2e-5, atol=1e-6)
    assert np.all(np.asarray(grad)[MASK == 0] == 0)


def test_reference_cases_exercise_clipping_and_truncation():
    """The fixed batch makes clipping and TIS truncation act (else the matrix proves little)."""
    _, m = losses.policy_loss(
        "ppo_clip",
        logp=LOGP,
        old_logp=OLD,
        advantages=ADV,
        mask=MASK,
        sampler_logp=SAMPLER,
        eps_low=0.2,
        eps_high=0.28,
        tis_cap=TIS_CAP,
    )
    assert 0.0 < float(m["clip_fraction"]) < 1.0
    assert 0.0 < float(m["tis/truncated_fraction"]) < 1.0
    _, m = losses.policy_loss(
        "gspo", logp=LOGP, old_logp=OLD, advantages=ADV, mask=MASK, eps_low=0.05, eps_high=0.08
    )
    assert 0.0 < float(m["clip_fraction"]) < 1.0


@pytest.mark.parametrize("variant", ["ppo_clip", "gspo", "reinforce"])
def test_gradient_matches_finite_differences(variant):
    """Central differences (h = 2e-3, float32) of the full entry with TIS and k3 KL on.

    cispo and gspo_token are left out on purpose: their stop-gradients make the gradient differ
    from the derivative of the value (−sg(w)·A for cispo; with per-token TIS weights, gspo_token
    keeps each token's weight on its own gradient).
    """
    f = jax.jit(
        partial(
            library_loss,
            variant=variant,
            agg="token-mean",
            tis=True,
            kl=True,
            **({"dual_clip": 3.0} if variant == "ppo_clip" else {}),
        )
    )
    grad = np.asarray(jax.grad(f)(jnp.asarray(LOGP)))
    h = 2e-3  # the nearest clip kink (r = 0.806 vs 0.8) is 4 h away in log space
    eye = np.eye(B * T, dtype=np.float32).reshape(B * T, B, T) * h
    plus = jax.vmap(f)(jnp.asarray(LOGP)[None] + eye)
    minus = jax.vmap(f)(jnp.asarray(LOGP)[None] - eye)
    fd = np.asarray((plus - minus) / (2 * h)).reshape(B, T)
    np.testing.assert_allclose(grad, fd, atol=2e-4)


def _split(x, sizes):
    return np.split(np.asarray(x), np.cumsum(sizes)[:-1])


@pytest.mark.parametrize(
    "agg",
    [AGGS[0], *(pytest.param(a, marks=pytest.mark.slow) for a in AGGS[1:])],  # fast: token-mean
)
@pytest.mark.parametrize(
    "extra",
    [{}, {"tis_mode": "mask", "tis_low": 0.6, "tis_high": 1.6, "tis_cap": 1.5}],
    ids=["plain", "tis-mask"],
)
def test_micro_batches_sum_to_full_batch(agg, extra):
    """Σ over micro-batches of sizes 1, 2, 1 with the global denominator == full batch."""
    settings = losses.resolve_loss_settings(
        None, variant="gspo_token", eps_low=0.05, eps_high=0.08, agg=agg, **extra
    )
    kwargs = {**settings.policy_loss_kwargs(), "max_len": MAX_LEN}
    denom = settings.loss_denominator(MASK, max_len=MAX_LEN, old_logp=OLD, sampler_logp=SAMPLER)

    def loss_fn(logp, old, sampler, adv, mask, denominator):
        return losses.policy_loss(
            logp=logp,
            old_logp=old,
            sampler_logp=sampler,
            advantages=adv,
            mask=mask,
            loss_denominator=denominator,
            **kwargs,
        )[0]

    step = jax.jit(jax.value_and_grad(loss_fn))
    full, full_grad = step(LOGP, OLD, SAMPLER, ADV, MASK, None)
    sizes = [1, 2, 1]
    parts = [_split(x, sizes) for x in (LOGP, OLD, SAMPLER, ADV, MASK)]
    micro = [step(*p, denom) for p in zip(*parts)]
    np.testing.assert_allclose(sum(v for v, _ in micro), full, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(
        np.concatenate([g for _, g in micro]), full_grad, rtol=1e-5, atol=1e-8
    )
    # and the naive alternative (each micro-batch normalised by itself, averaged) is different
    naive = np.mean([step(*p, None)[0] for p in zip(*parts)])
    assert abs(naive - float(full)) > 1e-3


def test_data_parallel_shards_with_global_denominator():
    """shard_map over 2 devices: each shard uses the psum'd denominator; psum of the shard
    losses is the full-batch loss."""
    mesh = jax.make_mesh((2,), ("data",))
    spec = jax.sharding.PartitionSpec("data")

    def per_shard(logp, old, adv, mask):
        denom = jax.lax.psum(
            losses.loss_denominator("seq-mean-token-sum-norm", mask, MAX_LEN), "data"
        )
        loss, _ = losses.policy_loss(
            "ppo_clip",
            logp=logp,
            old_logp=old,
            advantages=adv,
            mask=mask,
            agg="seq-mean-token-sum-norm",
            max_len=MAX_LEN,
            loss_denominator=denom,
        )
        return jax.lax.psum(loss, "data")

    sharded = jax.jit(
        jax.shard_map(
            per_shard, mesh=mesh, in_specs=(spec,) * 4, out_specs=jax.sharding.PartitionSpec()
        )
    )
    shard = partial(jax.device_put, device=jax.sharding.NamedSharding(mesh, spec))
    full, _ = losses.policy_loss(
        "ppo_clip",
        logp=LOGP,
        old_logp=OLD,
        advantages=ADV,
        mask=MASK,
        agg="seq-mean-token-sum-norm",
        max_len=MAX_LEN,
    )
    got = sharded(*map(shard, (LOGP, OLD, ADV, MASK)))
    np.testing.assert_allclose(got, full, rtol=1e-6)
