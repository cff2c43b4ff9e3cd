"""`rlvr-bench decode --weight-dtype D [--lora-rank R]`: the engine decoding from quantized (or
bf16) weights against the same engine at the compute dtype on `rlvr-bench decode`'s throughput
workload, with the sampler-learner mismatch it causes (`_mismatch`); with LoRA, what a push
costs (`push`) and merged against applied adapters in a decode step (`apply`, docs/lora.md)."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from rlvr_jax import models
from rlvr_jax.bench import common, progress
from rlvr_jax.bench import engine_timing as timing
from rlvr_jax.bench.roofline import best_roofline
from rlvr_jax.losses.kl import kl_per_token
from rlvr_jax.models import lora, quant
from rlvr_jax.rollout import EngineCore, generate


def _policy(cfg: Any, lora_rank: int) -> models.Model:
    """The bench model (random, `cfg.dtype`), with trained-looking adapters of `lora_rank`."""
    from rlvr_jax.config.schema import LoraConfig

    model = cfg.model(cfg.seed, cfg.dtype)
    if not lora_rank:
        return model
    model = models.adapt_lora(model, LoraConfig(rank=lora_rank, alpha=2.0 * lora_rank))
    adapters = lora.adapters(model.params)
    moved = jax.tree.map(
        lambda x: x + 0.02 * jax.random.normal(jax.random.key(1), x.shape), adapters
    )
    return dataclasses.replace(model, params=lora.graft(lora.strip(model.params), moved))


def _mismatch(model: models.Model, prompts: list[list[int]], completions: list[Any]) -> dict:
    """Per generated token, the engine's log-probs against fp32 learner ones, as the trainer
    reports them (`kl_sampler_learner`: mean k3; |δ|; TIS weights outside [0.5, 2])."""
    plain = dataclasses.replace(model, params=lora.merge(model.params, jnp.float32))
    rows = [p + c.tokens for p, c in zip(prompts, completions)]
    length = max(len(r) for r in rows)
    tokens_BxT = np.zeros((len(rows), length), np.int32)
    mask_BxT = np.zeros((len(rows), length), np.int32)
    for i, r in enumerate(rows):
        tokens_BxT[i, : len(r)], mask_BxT[i, : len(r)] = r, 1
    logits = models.forward(plain, tokens_BxT, mask_BxT=mask_BxT)
    logp_BxTxV = np.asarray(jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1))
    sampler, learner = [], []
    for i, (p, c) in enumerate(zip(prompts, completions)):
        positions = np.arange(len(p) - 1, len(p) - 1 + len(c.tokens))
        learner.append(logp_BxTxV[i, positions, c.tokens])
        sampler.append(np.asarray(c.logprobs))
    s, lrn = np.concatenate(sampler), np.concatenate(learner)
    delta = lrn - s
    kl = kl_per_token("k3", jnp.asarray(s[None]), jnp.asarray(lrn[None]))
    weight = np.exp(delta)
    return {
        "kl_sampler_learner": float(jnp.mean(kl)),
        "mean_abs_logp_diff": float(np.mean(np.abs(delta))),
        "max_abs_logp_diff": float(np.max(np.abs(delta))),
        "tis_weight_outside_0.5_2": float(np.mean((weight < 0.5) | (weight > 2.0))),
        "tokens": int(delta.size),
    }


def run(cfg: Any) -> dict:
    """The comparison (module docstring) of `cfg` (`decode.BenchConfig`); JSON-able."""
    weight_dtype, lora_rank = cfg.weight_dtype, cfg.lora_rank
    progress.line("building the policy and the two engines")
    model = _policy(cfg, lora_rank)
    rng = np.random.default_rng(cfg.seed)
    prompts = rng.integers(0, cfg.vocab, size=(cfg.batch, cfg.prompt)).tolist()
    kw = dict(max_slots=cfg.batch, max_len=cfg.prompt + cfg.new, chunk=cfg.chunk)
    label = weight_dtype or cfg.dtype
    names = (cfg.dtype, label) if label != cfg.dtype else (cfg.dtype,)
    engines = {name: EngineCore(model, weight_dtype=name, **kw) for name in names}
    sample = dict(max_new_tokens=cfg.new, temperature=1.0, seed=cfg.seed)
    fns = {n: functools.partial(generate, e, prompts, **sample) for n, e in engines.items()}
    n_tokens = cfg.batch * cfg.new
    walls, outs = timing.timed_generate(fns, cfg.repeats, n_tokens)
    progress.line("mismatch: the learner's log-probs of the sampled tokens")
    mismatch = {n: _mismatch(model, prompts, outs[n]) for n in names}
    progress.line("profile: decode step")
    profile = {n: timing.profile_engine(e, prompts, cfg.repeats) for n, e in engines.items()}
    roof = best_roofline(cfg.quick)
    arch = model.config
    memory_fraction = {
        n: common.step_bandwidth(
            arch, roof, profile[n]["decode_ms_per_step"] * 1e-3, slots=cfg.batch,
            context=cfg.prompt, param_bytes=common.WEIGHT_BYTES[n],
            cache_bytes=jnp.dtype(engines[n].spec.cache_dtype).itemsize,
        )["memory_fraction"]
        for n in names
    }  # fmt: skip
    result = {
        "tokens_per_s": {n: n_tokens / walls[n] for n in names},
        "ratios": {f"{label}_over_{cfg.dtype}_tokens_per_s": walls[cfg.dtype] / walls[label]},
        "mismatch": mismatch,
        "decode_weight_bytes": {n: quant.nbytes(engines[n].params) for n in names},
        "profile": profile,
        "roofline_fraction": timing.roofline_fractions(arch, cfg, roof, walls),
        "decode_step_memory_fraction": memory_fraction,
        "roofline": roof,
    }
    if lora_rank:
        result["push"] = _push(engines[label], model, cfg.repeats)
        result["apply"] = _apply_vs_merge(model, cfg, result["push"]["seconds"]["adapters"])
    result["config"] = {"weight_dtype": label, "model": arch.to_hf(), "params": arch.n_params()}
    return result


def _push(engine: EngineCore, model: models.Model, repeats: int) -> dict:
    """Seconds and bytes of an adapters-only push against a whole-policy push."""
    adapters = lora.adapters(model.params)
    merged = lora.merge(model.params)
    fns = {
        "adapters": lambda: jax.block_until_ready(engine.prepare(adapters)),
        "whole_policy": lambda: jax.block_until_ready(engine.prepare(merged)),
    }
    for fn in fns.values():
        fn()
    seconds = timing.interleaved_best(fns, repeats + 2)[0]
    sizes = {"adapters": quant.nbytes(adapters), "whole_policy": quant.nbytes(merged)}
    return {
        "seconds": seconds,
        "bytes": sizes,
        "bytes_fraction": sizes["adapters"] / sizes["whole_policy"],
    }


def _adapted(tree: dict) -> list[tuple[Any, lora.Adapter]]:
    """(kernel, adapter) of every adapted projection, kernels stacked over layers."""
    found = [(tree["kernel"], tree[lora.KEY])] if lora.KEY in tree else []
    for value in tree.values():
        if isinstance(value, dict):
            found += _adapted(value)
    return found


def _apply_vs_merge(model: models.Model, cfg: Any, merge_seconds: float) -> dict:
    """One decode step's adapted projections, merged against adapters applied (docstring)."""
    dtype = model.compute_dtype
    pairs = [
        (lora.merged_kernel(k, None, dtype), lora.merged_kernel(k, a, dtype), a)
        for k, a in _adapted(model.params)
    ]
    xs = [
        jax.random.normal(jax.random.key(i), (cfg.batch, *a.a.shape[1:-1]), dtype)
        for i, (_, _, a) in enumerate(pairs)
    ]

    def step(apply: bool, xs: list, pairs: list) -> jax.Array:
        total = jnp.zeros((), jnp.float32)
        for x, (base, merged, adapter) in zip(xs, pairs, strict=True):
            n_in = x.ndim - 1

            def layer(acc, weights, x=x, n_in=n_in):
                w, one = weights
                y = jnp.tensordot(x, w, n_in)
                if apply:
                    y = y + lora.delta(x, one, dtype)
                return acc + y.astype(jnp.float32).sum(), None

            weights = (base, adapter) if apply else (merged, None)
            total = jax.lax.scan(layer, total, weights)[0]
        return total

    fns, totals = {}, {}
    for name, apply in (("merged", False), ("applied", True)):
        compiled = functools.partial(jax.jit(functools.partial(step, apply)), xs, pairs)
        totals[name] = float(compiled())
        fns[name] = functools.partial(lambda f: jax.block_until_ready(f()), compiled)
    seconds = timing.interleaved_best(fns, 4 * cfg.repeats + 4)[0]
    overhead = max(seconds["applied"] - seconds["merged"], 1e-9)
    # the FLOPs the adapters add to the projections: r (in + out) against in · out a row
    extra = sum(a.a[0].size + a.b[0].size for _, _, a in pairs)
    per_push = overhead * cfg.new
    return {
        "step_seconds": seconds,
        "overhead_per_decode_step_s": overhead,
        "decode_steps_per_push": cfg.new,
        "apply_seconds_per_push": per_push,
        "merge_seconds_per_push": merge_seconds,
        "break_even_decode_steps": merge_seconds / overhead,
        "faster": "merge" if merge_seconds <= per_push else "apply",
        "flops_overhead_fraction": extra / sum(b[0].size for b, _, _ in pairs),
        "outputs_relative_gap": abs(totals["applied"] - totals["merged"])
        / max(abs(totals["merged"]), 1e-30),
    }
