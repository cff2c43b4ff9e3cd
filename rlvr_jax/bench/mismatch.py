"""`rlvr-bench mismatch`: do the sampler and the learner compute the same function?

The shipped demo model samples its own prompts with an in-flight weight update after
`update_after` chunks (KV cache kept); the completions are re-scored by the learner's forward
(`learner`) and by the exact engine's replay (`replay`, `rollout.rescore`), on-policy tokens
(`before` / `after` the update) apart from lagging ones (`lag`), per dtype × KV layout × one
device or tensor-parallel (`TP_MESH`), with each engine's decode tokens/s.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from rlvr_jax.bench.common import option
from rlvr_jax.bench.table import Bench

DEVICES = 8
"""Simulated devices of the tensor-parallel settings."""
TP_MESH = {"data": 4, "tensor": 2}
"""The tensor-parallel settings' actor mesh (the demo model's 2 KV heads split over 2)."""


@dataclasses.dataclass(frozen=True)
class BenchConfig:
    """Sizes of one run."""

    prompts: int = 16
    """Prompts (the model's own samples after BOS)."""
    samples: int = 2
    """Completions per prompt."""
    prompt_len: int = 12
    """Tokens per prompt."""
    new: int = 48
    """Generated tokens per completion."""
    slots: int = 8
    """Engine slots."""
    chunk: int = 4
    """Decode steps per engine call."""
    update_after: int = 3
    """Decode chunks before the in-flight weight update."""
    noise: float = 0.02
    """The update: each weight + noise × its std × N(0, 1)."""
    repeats: int = 2
    """Timed repeats per engine (the best is kept)."""
    seed: int = 0
    """Seed of the requests and the update."""
    dtypes: tuple[str, ...] = ("float32", "bfloat16")
    """Compute dtypes (repeatable)."""
    layouts: tuple[str, ...] = ("paged", "contiguous")
    """KV layouts (repeatable)."""
    tensor_parallel: bool = option(True, "--no-tp")
    """Also the tensor-parallel settings (8 simulated devices)."""
    quick: bool = option(False, None)
    """The smoke test's sizes (`--quick`): the roofline probe's too."""

    def __post_init__(self) -> None:
        if self.repeats < 1:
            raise ValueError(f"repeats must be >= 1, got {self.repeats}")


QUICK = BenchConfig(
    prompts=4, new=8, slots=4, update_after=1, repeats=1, layouts=("paged",), quick=True
)
"""`--quick` (the smoke test): 8 sequences on 4 slots, two waves of two chunks; the update after
the first chunk, so the first wave has tokens before it and lagged ones, the second after it."""


def _flags_for_devices() -> bool:
    """Asks XLA for `DEVICES` CPU devices unless JAX has started; whether TP can run."""
    from jax._src import xla_bridge

    if not xla_bridge.backends_are_initialized():
        flags = os.environ.get("XLA_FLAGS", "")
        if "xla_force_host_platform_device_count" not in flags:
            flag = f"--xla_force_host_platform_device_count={DEVICES}"
            os.environ["XLA_FLAGS"] = f"{flags} {flag}".strip()
    import jax

    return jax.device_count() >= DEVICES


def _versions(model: Any, noise: float, seed: int) -> list[Any]:
    """Params of versions 0 and 1 (v0 + noise × std × N(0, 1) per weight)."""
    import jax
    import jax.numpy as jnp

    leaves, tree = jax.tree.flatten(model.params)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    moved = [
        (x + noise * jnp.std(x.astype(jnp.float32)) * jax.random.normal(k, x.shape)).astype(x.dtype)
        for x, k in zip(leaves, keys)
    ]
    return [model.params, jax.tree.unflatten(tree, moved)]


def _prompts(engine: Any, cfg: BenchConfig) -> list[list[int]]:
    """The model's own samples after BOS (`prompt_len` tokens each)."""
    from rlvr_jax.rollout import generate

    bos = engine.config.bos_token_id or 0
    done = generate(engine, [[bos]] * cfg.prompts, max_new_tokens=cfg.prompt_len - 1, seed=99)
    return [[bos, *c.tokens] for c in done]


def sample_with_update(engine: Any, prompts: list, dps: list, cfg: BenchConfig) -> list:
    """Completions sampled from version 0, version 1 after `update_after` chunks."""
    from rlvr_jax.rollout import GroupRequest, Scheduler, request_seed

    sched = Scheduler(engine, params=dps[0], version=0)
    for i, p in enumerate(prompts):
        seed = request_seed(cfg.seed, i)
        sched.add(GroupRequest(i, i, tuple(p), cfg.samples, seed, max_new_tokens=cfg.new))
    done, steps = {}, 0
    while not sched.idle:
        for req, group in sched.step():
            done[req.key] = group
        steps += 1
        if steps == cfg.update_after:
            sched.set_params(dps[1], 1)
    return [c for i in range(len(prompts)) for c in done[i]]


def _batch(prompts: list, completions: list, version: int, seq_len: int) -> Any:
    from rlvr_jax.training.batch import Sample, collate
    from rlvr_jax.training.groups import token_lag

    samples = [
        Sample(prompts[c.prompt_index], c.tokens, c.logprobs, 0.0, lag=token_lag(c, version))
        for c in completions
    ]
    return collate(samples, rows=len(samples), seq_len=seq_len, pad_id=0)


def _figures(old: Any, batch: Any, versions: Any) -> dict[str, dict[str, float]]:
    """`losses.mismatch_metrics` on policy, split before / after the update, and the lag."""
    import numpy as np

    from rlvr_jax import losses

    def metrics(mask: Any) -> dict[str, float]:
        m = losses.mismatch_metrics(old, batch.sampler_logp_BxT, mask, batch.lag_BxT)
        return {k: float(v) for k, v in m.items()}

    out = {}
    for name, keep in (("on_policy", 1.0), ("before", versions == 0), ("after", versions == 1)):
        m = metrics(batch.mask_BxT * np.asarray(keep, np.float32))
        out[name] = {k.split("/")[1]: v for k, v in m.items() if k.startswith("mismatch/")}
    m = metrics(batch.mask_BxT)
    out["lag"] = {"kl": m["lag/kl"], "tokens": m["lag/tokens"]}
    return out


def _merge(a: dict, b: dict) -> dict:
    """Two versions' figures, each over its own on-policy tokens (disjoint sets)."""
    out = {}
    for part in ("on_policy", "before", "after"):
        x, y = a[part], b[part]
        n = x["tokens"] + y["tokens"]

        def mean(key: str, x=x, y=y, n=n) -> float:
            return (x[key] * x["tokens"] + y[key] * y["tokens"]) / max(n, 1.0)

        out[part] = {
            "kl": mean("kl"),
            "max_abs_logp": max(x["max_abs_logp"], y["max_abs_logp"]),
            "bitwise_equal_fraction": mean("bitwise_equal_fraction"),
            "tokens": n,
        }
    out["lag"] = b["lag"]  # version 1's lagging tokens: sampled on version 0's cache
    return out


def run_setting(model: Any, mesh: Any, layout: str, cfg: BenchConfig) -> dict:
    """One setting: each engine samples with an update, re-scored and timed."""
    import jax
    import numpy as np

    from rlvr_jax.bench.engine_timing import timed_generate
    from rlvr_jax.rollout import EngineCore, generate, rescore
    from rlvr_jax.training import learner

    max_len = cfg.prompt_len + cfg.new
    kw = dict(max_slots=cfg.slots, max_len=max_len, chunk=cfg.chunk, kv_layout=layout, mesh=mesh)
    engines = {
        "learner": EngineCore(model, **kw),
        "replay": EngineCore(model, **kw, exact=True, max_interrupt_ids=cfg.new),
    }
    prompts = _prompts(engines["learner"], cfg)
    params = _versions(model, cfg.noise, cfg.seed)
    forward = learner.make_logprob_fn(
        model.config, compute_dtype=model.compute_dtype, temperature=1.0
    )
    out: dict[str, Any] = {}
    for method, engine in engines.items():
        dps = [engine.prepare(p) for p in params]
        completions = sample_with_update(engine, prompts, dps, cfg)
        seqs = [(prompts[c.prompt_index], c.tokens) for c in completions]
        figures = []
        for v in (0, 1):
            batch = _batch(prompts, completions, v, max_len)
            versions = np.zeros(batch.mask_BxT.shape, np.int64)
            if method == "replay":
                old = np.zeros(batch.mask_BxT.shape, np.float32)
                for b, logp in enumerate(rescore(engine, seqs, params=dps[v])):
                    first = len(seqs[b][0]) - 1
                    old[b, first : first + len(logp)] = logp
            else:
                local = jax.device_put(params[v], jax.devices()[0])
                old = np.asarray(forward(local, jax.tree.map(np.asarray, batch)))
            for b, c in enumerate(completions):
                first = len(seqs[b][0]) - 1
                versions[b, first : first + len(c.tokens)] = c.policy_versions
            figures.append(_figures(old, batch, versions))
        out[method] = _merge(*figures)

    def timed(engine: Any) -> Any:
        return lambda: generate(engine, prompts, max_new_tokens=cfg.new, num_samples=cfg.samples)

    runs = {"default": timed(engines["learner"]), "exact": timed(engines["replay"])}
    n = len(prompts) * cfg.samples * cfg.new
    best = timed_generate(runs, cfg.repeats, n)[0]
    out["tokens_per_s"] = {k: n / s for k, s in best.items()}
    return out


def _worst(settings: dict, method: str, dtype: str) -> dict:
    rows = [s[method]["on_policy"] for name, s in settings.items() if name.startswith(dtype)]
    return {
        "kl": max(r["kl"] for r in rows),
        "max_abs_logp": max(r["max_abs_logp"] for r in rows),
        "bitwise_equal_fraction": min(r["bitwise_equal_fraction"] for r in rows),
        "tokens": sum(r["tokens"] for r in rows),
    }


def run(cfg: BenchConfig) -> dict:
    """Every setting, the summary keys and the roofline probe."""
    tp_ok = _flags_for_devices() if cfg.tensor_parallel else False
    import jax

    from rlvr_jax import models, sharding
    from rlvr_jax.bench import progress
    from rlvr_jax.bench.roofline import best_roofline
    from rlvr_jax.demo.base_model import SHIPPED_DIR

    meshes = {"1dev": None}
    if tp_ok:
        meshes["tp2x4"] = sharding.make_mesh(TP_MESH, jax.devices()[:DEVICES])
    settings = {}
    for dtype in cfg.dtypes:
        model = models.load_pretrained(SHIPPED_DIR, dtype=dtype)
        for layout in cfg.layouts:
            for mesh_name, mesh in meshes.items():
                name = f"{dtype}/{layout}/{mesh_name}"
                progress.line(f"mismatch: {name}")
                settings[name] = run_setting(model, mesh, layout, cfg)
    tps = {k: s["tokens_per_s"] for k, s in settings.items()}
    ratios = [t["exact"] / t["default"] for t in tps.values()]
    return {
        "mismatch": {d: _worst(settings, "replay", d) for d in cfg.dtypes},
        "mismatch_default": {d: _worst(settings, "learner", d) for d in cfg.dtypes},
        "tokens_per_s": tps,
        "exact_over_default_tokens_per_s": min(ratios),
        "settings": settings,
        "roofline": best_roofline(cfg.quick),
        "config": {
            "model": str(SHIPPED_DIR),
            "tensor_parallel_mesh": TP_MESH if tp_ok else None,
            "xla_flags": os.environ.get("XLA_FLAGS", ""),
        },
    }


BENCH = Bench(
    BenchConfig,
    run,
    presets={"default": BenchConfig(), "quick": QUICK},
    headlines=("mismatch", "mismatch_default", "exact_over_default_tokens_per_s"),
)
