"""The experiment harness's statistics, tables and plot (`experiment_common` runs the arms).

pass@k per prompt is the unbiased estimator (`rlvr_jax.eval.pass_at_k`) of that prompt's
n = 32 samples. An arm's figure is the mean over its seeds and the held-out prompts; its 95%
interval is a two-level bootstrap: B times, draw the seeds with replacement and, independently,
the prompts with replacement, and average pass@k over the drawn (seed, prompt) cells; the
2.5th and 97.5th percentiles of the B means are the interval. A difference `a − b` is
bootstrapped paired (the same draws of seeds and prompts for both arms; arms of one seed share
its data order, all policies the sampling seed), the base being one seed shared by every seed.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

BOOTSTRAP = 2000
"""Bootstrap resamples."""

BOOTSTRAP_SEED = 0


def pass_at_k(counts: Sequence[int], domains: Sequence[str], n: int, ks: Sequence[int]) -> dict:
    """`{"pass@k": .., "per_domain": {domain: {"pass@k": ..}}}` of per-prompt correct counts."""
    from rlvr_jax.eval.passk import mean_pass_at_k

    out: dict[str, Any] = {f"pass@{k}": mean_pass_at_k(counts, n, k) for k in ks}
    out["per_domain"] = {
        d: {
            f"pass@{k}": mean_pass_at_k([c for c, dd in zip(counts, domains) if dd == d], n, k)
            for k in ks
        }
        for d in sorted(set(domains))
    }
    return out


def groups(domains: Sequence[str], probe: str | None) -> dict[str, np.ndarray]:
    """Prompt masks of the reported groups: `all`, `trained` (with a probe: every domain but
    it), and each domain."""
    d = np.asarray(domains)
    out = {"all": np.ones(len(d), bool)}
    if probe is not None:
        out["trained"] = d != probe
    out.update({name: d == name for name in sorted(set(domains))})
    return out


def cell_values(counts_SxP: np.ndarray, n: int, k: int) -> np.ndarray:
    """pass@k of every (seed, prompt) cell."""
    from rlvr_jax.eval import pass_at_k as estimator

    flat = [estimator(n, int(c), k) for c in counts_SxP.reshape(-1)]
    return np.asarray(flat).reshape(counts_SxP.shape)


def bootstrap(values_SxP: np.ndarray, rng: np.random.Generator) -> dict[str, float]:
    """Mean and 95% interval of `values_SxP` over seeds and prompts (module docstring)."""
    S, P = values_SxP.shape
    seeds_BxS = rng.integers(0, S, (BOOTSTRAP, S))
    prompts_BxP = rng.integers(0, P, (BOOTSTRAP, P))
    means_B = values_SxP[seeds_BxS[:, :, None], prompts_BxP[:, None, :]].mean(axis=(1, 2))
    lo, hi = np.percentile(means_B, [2.5, 97.5])
    return {"mean": float(values_SxP.mean()), "lo": float(lo), "hi": float(hi)}


def summarize(results: dict[str, Any]) -> dict[str, Any]:
    """`{"arms": {arm: {group: {"pass@k": {mean, lo, hi}}}}, "deltas": {"a − b": ...}}` over
    the seeds each arm has, from the per-prompt counts."""
    ev = results["heldout"]
    n, ks, masks = ev["n"], ev["ks"], groups(ev["domains"], results.get("probe"))
    counts = {"base": np.asarray([results["base"]["counts"]])}
    for runs in results["seeds"].values():
        for arm, rec in runs.items():
            if "counts" in rec:
                counts.setdefault(arm, []).append(rec["counts"])
    counts = {arm: np.asarray(c) for arm, c in counts.items()}
    values = {(arm, k): cell_values(c, n, k) for arm, c in counts.items() for k in ks}
    rng = np.random.default_rng(BOOTSTRAP_SEED)

    def table(get) -> dict[str, dict[str, dict[str, float]]]:
        return {
            g: {f"pass@{k}": bootstrap(get(k)[:, m], rng) for k in ks}
            for g, m in masks.items()
            if m.any()
        }

    out: dict[str, Any] = {"arms": {a: table(lambda k, a=a: values[a, k]) for a in counts}}
    out["deltas"] = {}
    for a, b in results.get("compare", []):
        if a in counts and b in counts and (b == "base" or len(counts[b]) == len(counts[a])):
            diff = lambda k, a=a, b=b: values[a, k] - values[b, k]  # the base broadcasts
            out["deltas"][f"{a} − {b}"] = table(diff)
    return out


def fmt(ci: dict[str, float]) -> str:
    return f"{ci['mean']:.3f} [{ci['lo']:.3f}, {ci['hi']:.3f}]"


def verdict(ci: dict[str, float]) -> str:
    """Ahead / behind when the 95% interval of a difference excludes 0, else tied."""
    return "ahead" if ci["lo"] > 0 else "behind" if ci["hi"] < 0 else "tied"


def seeds_of(results: dict[str, Any], arm: str) -> str:
    seeds = [s for s, runs in results["seeds"].items() if arm in runs]
    return ",".join(seeds) if arm != "base" else "—"


def markdown(results: dict[str, Any]) -> str:
    """The results page: setup, pass@k with intervals (headline group, per domain), the
    compared differences, the budgets, then the experiment's own section."""
    ev, summary, probe = results["heldout"], results["summary"], results.get("probe")
    ks = [f"pass@{k}" for k in ev["ks"]]
    head = "trained" if probe else "all"
    m = results["machine"]
    lines = [
        f"# {results['title']} ({results['config']})",
        "",
        f"Command: `{results['command']}`",
        f"Held-out: {ev['prompts']} prompts × n = {ev['n']} samples at T = {ev['temperature']}, "
        f"sampling seed {ev['seed']}; training seeds {', '.join(results['seeds'])}. "
        f"Intervals: 95% bootstrap over seeds and prompts (B = {BOOTSTRAP}).",
    ]
    if not results.get("parts"):
        lines.append(
            f"Machine: {m.get('cpu_model') or m['processor']} × {m['cpu_count']} CPUs"
            f"{' (' + ', '.join(m['cpu_isa']) + ')' if m.get('cpu_isa') else ''}, fp32 matmul "
            f"{m['fp32_gflops']:.1f} GFLOP/s (`rlvr-bench roofline`); load average "
            f"{results['load_before']} before, {results.get('load_after', '—')} after; wall time "
            f"{results.get('wall_s', 0.0) / 60:.1f} min."
        )
    for i, part in enumerate(results.get("parts") or []):  # runs merged (`--merge`)
        pm, wall = part["machine"], part.get("wall_s")
        lines.append(
            f"Run {i + 1} (seeds {', '.join(part['seeds'])}): `{part['command']}`; "
            f"{pm.get('cpu_model') or pm['processor']}, fp32 {pm['fp32_gflops']:.1f} GFLOP/s; "
            f"load {part['load_before']} before, {part.get('load_after') or '—'} after; "
            f"wall {f'{wall / 60:.1f} min' if wall else '—'}."
        )
    if probe:
        lines.append(f"General-skill probe: `{probe}` (held out of every arm's training).")
    cols = " | ".join(f"trained {k}" if probe else k for k in ks)
    lines += ["", f"| policy | seeds | {cols} |", "|---|---|" + "---:|" * len(ks)]
    for arm, table in summary["arms"].items():
        cells = " | ".join(fmt(table[head][k]) for k in ks)
        lines.append(f"| {arm} | {seeds_of(results, arm)} | {cells} |")
    domains = sorted(set(ev["domains"]))
    names = [f"{d} (probe)" if d == probe else d for d in domains]
    lines += ["", "| policy | " + " | ".join(f"{d} {k}" for d in names for k in ks) + " |"]
    lines.append("|---|" + "---:|" * (len(domains) * len(ks)))
    for arm, table in summary["arms"].items():
        lines.append(
            f"| {arm} | " + " | ".join(fmt(table[d][k]) for d in domains for k in ks) + " |"
        )
    if summary["deltas"]:
        cols = [head, *([probe] if probe else [])]
        lines += ["", "| difference | " + " | ".join(f"{c} {k}" for c in cols for k in ks) + " |"]
        lines.append("|---|" + "---:|" * (len(cols) * len(ks)))
        for name, table in summary["deltas"].items():
            cells = " | ".join(
                f"{fmt(table[c][k])} {verdict(table[c][k])}" for c in cols for k in ks
            )
            lines.append(f"| {name} | {cells} |")
    lines += [
        "",
        "| policy | updates | RL prompts | RL completions | SFT examples | training TFLOP | "
        "train s |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for arm in summary["arms"]:
        recs = [runs[arm] for runs in results["seeds"].values() if arm in runs]
        if not recs:
            continue

        def mean(key: str, recs=recs) -> float:
            return float(np.mean([r["budget"][key] for r in recs]))

        lines.append(
            f"| {arm} | {mean('updates'):.0f} | {mean('rl_prompts'):.0f} | "
            f"{mean('rl_completions'):.0f} | {mean('sft_examples'):.0f} | "
            f"{mean('flops') / 1e12:.2f} | {np.mean([r['train_s'] for r in recs]):.0f} |"
        )
    extra = results.get("extra_markdown")
    return "\n".join([*lines, *(["", extra] if extra else [])]) + "\n"


def plot(results: dict[str, Any], path: Path) -> None:
    """Training reward against completions generated (thin: each seed, 5-step moving average;
    thick: their mean) and held-out pass@k with 95% intervals (trained domains, and the probe
    when there is one)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    probe, summary = results.get("probe"), results["summary"]
    fig, axes = plt.subplots(1, 3 if probe else 2, figsize=(16 if probe else 12, 4.2))
    ax = axes[0]
    arms = list(summary["arms"])
    colors = {a: f"C{i}" for i, a in enumerate(arms)}
    for arm in arms[1:]:
        for i, runs in enumerate(results["seeds"].values()):
            c = runs.get(arm, {}).get("curve", {})
            pts = [
                (s, r) for s, r in zip(c.get("samples", []), c.get("reward", [])) if r is not None
            ]
            if pts:
                xs, ys = zip(*pts)
                smooth = np.convolve(ys, np.ones(5) / 5, mode="valid") if len(ys) >= 5 else ys
                ax.plot(
                    xs[len(xs) - len(smooth) :],
                    smooth,
                    color=colors[arm],
                    alpha=0.6,
                    lw=1,
                    label=arm if i == 0 else None,
                )
    ax.set(xlabel="completions generated for training", ylabel="training reward (5-step mean)")
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend(fontsize=8)
    ks = [f"pass@{k}" for k in results["heldout"]["ks"]]
    for ax, group in zip(axes[1:], ["trained" if probe else "all", *([probe] if probe else [])]):
        width = 0.8 / len(ks)
        for j, k in enumerate(ks):
            cis = [summary["arms"][a][group][k] for a in arms]
            mean = [c["mean"] for c in cis]
            err = [[c["mean"] - c["lo"] for c in cis], [c["hi"] - c["mean"] for c in cis]]
            xs = np.arange(len(arms)) + (j - (len(ks) - 1) / 2) * width
            ax.bar(xs, mean, width, yerr=err, capsize=2, label=k)
        ax.set_xticks(range(len(arms)), arms, rotation=20, fontsize=8)
        ax.set(ylim=(0, 1), title=f"held-out {group}{' (probe)' if group == probe else ''}")
        ax.legend(fontsize=8, loc="upper left")
    fig.suptitle(f"{results['title']} — seeds {', '.join(results['seeds'])}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
