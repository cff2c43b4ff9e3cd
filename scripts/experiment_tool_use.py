"""Learning to use a tool: long-number arithmetic, where a calculator helps a tiny model.

    nice -n 19 python scripts/experiment_tool_use.py --out runs/tool_use
    python scripts/experiment_tool_use.py --quick --out /tmp/tool_use        # smoke test

Task: "Compute A + B." / "A - B" with 4-6 digit operands and "A * B" with 2-4 digit ones,
answered in `\\boxed{}` and checked by the `math` verifier — far past what the demo's base
model (pretrained on small-number arithmetic) computes unaided. The calculator tool
(`rlvr_jax.envs.tools.calculator`) computes it exactly, if the model copies the expression
into a Hermes `<tool_call>` and the result into its answer.

Two arms from the demo's base model, with the same budgets:

    tool     SFT on traces that call the calculator (call, tool response, `\\boxed{result}`),
             then RL with `env.name: tools`, `env.tools: [calculator]` (the turns run inside
             the engine's slots; tool responses are masked out of the loss)
    no_tool  SFT on traces that answer directly (`\\boxed{result}`), then RL without tools

The SFT traces are rendered through the tokenizer's chat template exactly as the
environment renders its episodes (the script checks the token ids match); the SFT path has
no per-token mask, so SFT also trains on the tool response's tokens (RL does not). RL uses
`filter.active_sampling: false`, so both arms generate exactly `--rl-steps` × prompts × G
samples. Held-out pass@1 / pass@8 (n = 8, T = 1, one sampling seed) of the base (with and
without the tool offered) and of each arm after SFT and after RL go to `<out>/results.md`,
`results.json` and `tool_use.png`; each run's metrics and checkpoints are under `<out>/`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger("experiment_tool_use")

EVAL_SEED = 20_261_126
EVAL_KS = (1, 8)
DOMAIN = "long_arithmetic"
MAX_PROMPT_LEN, MAX_NEW_TOKENS = 104, 152  # 256 positions: the demo model's
TOOL_OVERRIDES = ["env.name=tools", "env.tools=[calculator]", "env.max_turns=3"]


def problem(rng: np.random.Generator) -> tuple[str, int]:
    """One expression and its value."""
    op = str(rng.choice(["+", "-", "*"]))
    lo, hi = (2, 4) if op == "*" else (4, 6)
    a, b = (int(rng.integers(10 ** (d - 1), 10**d)) for d in rng.integers(lo, hi + 1, size=2))
    value = {"+": a + b, "-": a - b, "*": a * b}[op]
    return f"{a} {op} {b}", value


def rows(n: int, seed: int, exclude: set[str] = frozenset()) -> list[dict[str, Any]]:
    """`n` distinct problems (none in `exclude`) as data rows."""
    rng, out, seen = np.random.default_rng(seed), [], set(exclude)
    while len(out) < n:
        expr, value = problem(rng)
        if expr in seen:
            continue
        seen.add(expr)
        out.append({
            "prompt": f"Compute {expr}. Put your final answer in \\boxed{{}}.",
            "ground_truth": str(value), "verifier": "math", "domain": DOMAIN, "expression": expr,
        })  # fmt: skip
    return out


def tool_call(expr: str) -> str:
    args = json.dumps({"name": "calculator", "arguments": {"expression": expr}})
    return f"<tool_call>{args}</tool_call>"


def sft_rows(train: Sequence[dict], tokenizer: Any) -> dict[str, list[dict]]:
    """The SFT traces of both arms, rendered as the environment renders its episodes:
    `tool`: the calculator's tools block as the system message, the call, the tool's
    response and the answer; `no_tool`: the answer alone. Raises RuntimeError when the
    traces' token ids differ from what the environment and the engine produce."""
    from rlvr_jax.config.schema import EnvConfig
    from rlvr_jax.data.tokenizer import apply_chat_template
    from rlvr_jax.envs import ChatFormat, EnvRunner, ToolEnv

    env = ToolEnv(["calculator"])
    chat = ChatFormat(tokenizer, env.tools)
    head = "<|im_start|>system\n"
    system = chat.render(env.reset(train[0]), add_generation_prompt=False)
    system = system[len(head) : system.index("<|im_end|>")]
    eos = tokenizer.decode([tokenizer.eos_token_id])
    out: dict[str, list[dict]] = {"tool": [], "no_tool": []}
    for r in train:
        messages = env.reset(r)
        call, answer = tool_call(r["expression"]), f"\\boxed{{{r['ground_truth']}}}"
        observation = env.step(call).observation
        history = [*messages, {"role": "assistant", "content": call}]
        response_ids = chat.observation_ids(history, observation, eos)
        response = call + eos + tokenizer.decode(response_ids) + answer
        prompt = [{"role": "system", "content": system}, *messages]
        out["tool"].append({**r, "prompt": prompt, "response": response})
        out["no_tool"].append({**r, "response": answer})
    # the traces are the episodes the engine would run: same prompt ids, same appended ids
    r = out["tool"][0]
    env_cfg = EnvConfig(name="tools", tools=["calculator"])
    stop = [tokenizer.eos_token_id]
    runner = EnvRunner(env_cfg, tokenizer, max_new_tokens=MAX_NEW_TOKENS, stop_token_ids=stop)
    group = runner.group({**train[0], "index": 0})
    prompt_ids = apply_chat_template(tokenizer, r["prompt"])
    call = [*tokenizer.encode(tool_call(train[0]["expression"]), add_special_tokens=False),
            tokenizer.eos_token_id]  # fmt: skip
    appended = group.next_turn(0, call, "stop").result()
    runner.close()
    want = [*call, *appended, *tokenizer.encode(f"\\boxed{{{train[0]['ground_truth']}}}")]
    got = tokenizer.encode(r["response"], add_special_tokens=False)
    if prompt_ids != group.prompt_ids or got != want:
        raise RuntimeError("the SFT traces do not tokenize as the environment's episodes")
    return out


def write_jsonl(items: Sequence[dict], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(x) + "\n" for x in items))
    return path


def quoted(path: Path) -> str:
    return json.dumps(str(path))


def load_config(config: str, overrides: Sequence[str]) -> Any:
    from rlvr_jax.config import load

    return load(config, list(overrides))


def train_run(
    config: str, common: Sequence[str], extra: Sequence[str], model: Path, out: Path
) -> Path:
    """One `rlvr-train` run from `model` into `out`; returns its exported policy."""
    from rlvr_jax.training.run import train

    where = [f"train.output_dir={quoted(out)}", f"model.path={quoted(model)}"]
    cfg = load_config(config, [*common, *extra, *where, "model.create_if_missing=null"])
    log.info("%s: %s from %s", out.name, cfg.algorithm, model)
    train(cfg)
    if not (out / "final" / "config.json").is_file():
        raise RuntimeError(f"the run into {out} exported no policy")
    return out / "final"


def evaluate(config: str, common: Sequence[str], model: Path, tools: bool, service: Any) -> dict:
    """Held-out pass@1 / pass@8 of `model`, the calculator offered when `tools`."""
    from rlvr_jax.eval.evaluate import evaluate_policy, load_policy

    env = TOOL_OVERRIDES if tools else []
    where = [f"model.path={quoted(model)}", "model.create_if_missing=null"]
    cfg = load_config(config, [*common, *env, *where])
    policy, tokenizer = load_policy(cfg)
    t0 = time.perf_counter()
    flat = evaluate_policy(policy, tokenizer, cfg, reward_service=service, seed=EVAL_SEED)
    out = {f"pass@{k}": flat[f"eval/pass@{k}"] for k in EVAL_KS}
    out["prompts"], out["eval_s"] = int(flat["eval/prompts"]), time.perf_counter() - t0
    return out


def curve(out: Path) -> dict[str, list]:
    from rlvr_jax.training.metrics import read_jsonl

    rows_ = read_jsonl(out / "metrics.jsonl")
    keys = ("reward/mean", "env/tool_calls", "env/turns", "response_length/mean")
    return {"step": [r["step"] for r in rows_], **{k: [r.get(k) for r in rows_] for k in keys}}


def run(args: argparse.Namespace) -> dict[str, Any]:
    from rlvr_jax.data import load_tokenizer
    from rlvr_jax.models.bootstrap import ensure_model
    from rlvr_jax.rewards import RewardService

    out = Path(args.out).absolute()
    base_cfg = load_config(args.config, args.overrides)
    base = ensure_model(base_cfg).absolute()
    tokenizer = load_tokenizer(base_cfg.model.tokenizer or base)
    train = rows(args.train_rows, seed=1)
    test = rows(args.eval_prompts, seed=2, exclude={r["expression"] for r in train})
    sft = sft_rows(train, tokenizer)
    paths = {
        "train": write_jsonl(train, out / "data" / "train.jsonl"),
        "test": write_jsonl(test, out / "data" / "test.jsonl"),
        **{arm: write_jsonl(v, out / "data" / f"sft_{arm}.jsonl") for arm, v in sft.items()},
    }
    common = [
        f"data.sources=[{{path: {quoted(paths['train'])}}}]",
        f"data.eval_sources=[{{path: {quoted(paths['test'])}}}]",
        "data.prompt_template=chat", f"data.max_prompt_len={MAX_PROMPT_LEN}",
        f"rollout.max_new_tokens={MAX_NEW_TOKENS}", "rollout.mode=sync",
        "filter.active_sampling=false", f"eval.max_prompts={args.eval_prompts}",
        f"eval.num_samples={max(EVAL_KS)}", f"eval.ks={list(EVAL_KS)}", "eval.every_steps=0",
        "checkpoint.every_steps=0", "checkpoint.export_hf=true", "log.progress_bar=false",
        "log.tensorboard=false", *args.overrides,
    ]  # fmt: skip
    results: dict[str, Any] = {
        "command": " ".join(["python", *sys.argv]), "config": args.config,
        "sft_steps": args.sft_steps, "rl_steps": args.rl_steps, "base_model": str(base),
        "loadavg_before": os.getloadavg(), "policies": {}, "curves": {},
    }  # fmt: skip
    t_start = time.perf_counter()
    with RewardService(base_cfg.rewards) as service:
        for tools in (False, True):
            name = "base, tool offered" if tools else "base"
            results["policies"][name] = evaluate(args.config, common, base, tools, service)
            write_results(out, results)
        for arm in ("tool", "no_tool"):
            tools = arm == "tool"
            sft_extra = ["algorithm=sft", f"sft.sources=[{{path: {quoted(paths[arm])}}}]",
                         f"train.max_steps={args.sft_steps}", f"sft.batch_size={args.sft_batch}",
                         f"train.learning_rate={args.sft_lr}", "train.warmup_steps=5"]  # fmt: skip
            t0 = time.perf_counter()
            sft_model = train_run(args.config, common, sft_extra, base, out / arm / "sft")
            results["policies"][f"{arm}: SFT"] = {
                **evaluate(args.config, common, sft_model, tools, service),
                "train_s": time.perf_counter() - t0,
            }
            write_results(out, results)
            rl_extra = ["algorithm=rl", f"train.max_steps={args.rl_steps}",
                        *(TOOL_OVERRIDES if tools else [])]  # fmt: skip
            t0 = time.perf_counter()
            rl_model = train_run(args.config, common, rl_extra, sft_model, out / arm / "rl")
            results["curves"][arm] = curve(out / arm / "rl")
            rl = {**evaluate(args.config, common, rl_model, tools, service),
                  "train_s": time.perf_counter() - t0}  # fmt: skip
            rl_cfg = load_config(args.config, [*common, *rl_extra])
            rl["rl_samples"] = (
                args.rl_steps * rl_cfg.train.prompts_per_batch * rl_cfg.rollout.num_samples
            )
            results["policies"][f"{arm}: SFT → RL"] = rl
            write_results(out, results)
    results["loadavg_after"] = os.getloadavg()
    results["wall_s"] = time.perf_counter() - t_start
    write_results(out, results)
    plot(results, out / "tool_use.png")
    return results


def markdown(results: dict[str, Any]) -> str:
    lines = [
        f"# Learning to use a calculator ({results['sft_steps']} SFT + "
        f"{results['rl_steps']} RL steps)",
        "",
        f"`{results['command']}`",
        "",
        "| policy | tool offered | RL samples | pass@1 | pass@8 | train s |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for name, r in results["policies"].items():
        tools = "yes" if ("tool offered" in name or name.startswith("tool:")) else "no"
        lines.append(
            f"| {name} | {tools} | {r.get('rl_samples', 0)} | {r['pass@1']:.3f} | "
            f"{r['pass@8']:.3f} | {r.get('train_s', 0):.0f} |"
        )
    load = results.get("loadavg_before"), results.get("loadavg_after")
    lines += ["", f"Load average before / after: {load[0]} / {load[1]}; wall "
              f"{results.get('wall_s', 0) / 60:.1f} min."]  # fmt: skip
    return "\n".join(lines) + "\n"


def write_results(out: Path, results: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (out / "results.md").write_text(markdown(results))


def plot(results: dict[str, Any], path: Path) -> None:
    """Training reward (and tool calls per episode) per RL step; held-out pass@k bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bars) = plt.subplots(1, 2, figsize=(13, 4.2), gridspec_kw={"width_ratios": [1, 1.4]})
    for arm, color in (("tool", "tab:blue"), ("no_tool", "tab:red")):
        c = results["curves"].get(arm)
        if c:
            ax.plot(c["step"], c["reward/mean"], color=color, lw=2, label=f"{arm}: reward")
        if c and arm == "tool":
            ax.plot(
                c["step"], c["env/tool_calls"], color=color, ls="--", label="tool: calls/episode"
            )
    ax.set_xlabel("RL step (8 prompts x 8 samples)")
    ax.set_title("RL from the SFT policies")
    ax.grid(alpha=0.3)
    ax.legend()
    names = list(results["policies"])
    xs = np.arange(len(names))
    p1 = [results["policies"][n]["pass@1"] for n in names]
    p8 = [results["policies"][n]["pass@8"] for n in names]
    bars.bar(xs - 0.2, p1, width=0.4, label="pass@1")
    bars.bar(xs + 0.2, p8, width=0.4, label="pass@8")
    for x, a, b in zip(xs, p1, p8):
        bars.text(x - 0.2, a + 0.01, f"{a:.2f}", ha="center", fontsize=7)
        bars.text(x + 0.2, b + 0.01, f"{b:.2f}", ha="center", fontsize=7)
    bars.set_xticks(xs, [n.replace(": ", ":\n") for n in names], fontsize=7)
    bars.set_ylim(0, 1.05)
    bars.set_title("held-out pass@k (n = 8, T = 1)")
    bars.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--config", default="configs/demo.yaml")
    p.add_argument("--out", default="runs/tool_use")
    p.add_argument("--train-rows", type=int, default=2000)
    p.add_argument("--eval-prompts", type=int, default=128)
    p.add_argument("--sft-steps", type=int, default=60)
    p.add_argument("--sft-batch", type=int, default=32)
    p.add_argument("--sft-lr", type=float, default=3e-4)
    p.add_argument("--rl-steps", type=int, default=30)
    p.add_argument("--quick", action="store_true", help="tiny budgets (smoke test)")
    p.add_argument("overrides", nargs="*", metavar="key.sub=value")
    args = p.parse_args(argv)
    if args.quick:
        args.train_rows, args.eval_prompts, args.sft_steps, args.rl_steps = 64, 4, 2, 1
        args.sft_batch = 8
        args.overrides = ["train.prompts_per_batch=2", "rollout.num_samples=8", *args.overrides]
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("absl").setLevel(logging.WARNING)
    results = run(args)
    sys.stdout.write(markdown(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
