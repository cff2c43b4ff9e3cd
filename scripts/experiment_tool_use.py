"""Learning to use a tool, with seeds: look up codes in a table only the `lookup` tool can read.

    python scripts/experiment_tool_use.py --seeds 0,1,2 --out runs/tool_use
    python scripts/experiment_tool_use.py --quick --out /tmp/tool_use          # smoke test

Task (`rlvr_jax.demo.tool_use`, `configs/tool_use.yaml`): `What is the code of "joyate"?`;
the code (100-999) is in a table the prompt never shows; held-out keys are disjoint from the
training ones. Arms, each seed from the demo's base model (harness:
`scripts/experiment_common.py`):

    SFT                 SFT on tool traces of the training keys (call `lookup`, read the
                        response, answer `\\boxed{code}`); evaluated with the tool offered
    SFT → RL            then RL with the tool (`env.name: tools`, turns inside the engine's
                        slots, tool responses masked out of the loss)
    SFT (no tool)       SFT on direct answers of the same keys (`\\boxed{code}`), same steps
    SFT → RL (no tool)  then RL without the tool, the same samples as SFT → RL

The base model is evaluated with the tool offered (and, in the notes, without). Every policy:
held-out pass@1/8/32 (n = 32, T = 1) with 95% intervals over seeds and prompts, and its
tool-call record over the held-out episodes (`tool_stats`: episodes that call, calls parsed,
arguments valid, tool errors, keys copied exactly, answers taken from the tool). RL runs
`rollout.mode: sync` with `filter.active_sampling: false`, so both RL arms draw exactly
`--rl-steps` × prompts × G samples. Written to `<out>`: results.json, results.md and
tool_use.png (the harness's) with the tool-call table in results.md.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import experiment_common as harness  # the sibling module
from experiment_common import Arm, Phase, quoted

DEFAULTS = dict(sft_steps=200, sft_batch=16, rl_steps=20, eval_prompts=80)
QUICK = dict(sft_steps=2, sft_batch=4, rl_steps=1, eval_prompts=8)
SFT_LR = 1e-3
NO_TOOL = "env.name=null"
BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
KEY = re.compile(r'code of "([a-z]+)"')
"""The key a task prompt asks about (`rlvr_jax.demo.tool_use.PROMPT`)."""


def prepare(ctx: harness.Context, seed: int, finals: dict[str, Path]) -> list[str]:
    """Once: writes both arms' SFT rows for the training keys and evaluates the base model
    without the tool offered (`base_unaided`). Returns no overrides."""
    from rlvr_jax.data import load_tokenizer
    from rlvr_jax.demo import tool_use

    folder = ctx.out / "data"
    if not (folder / "sft_direct.jsonl").is_file():
        rows = tool_use.task_rows(tool_use.split_keys()[0])
        tool_use.write_jsonl(tool_use.tool_traces(rows, load_tokenizer(ctx.base)),
                             folder / "sft_tool.jsonl")  # fmt: skip
        tool_use.write_jsonl(tool_use.direct_traces(rows), folder / "sft_direct.jsonl")
    if "base_unaided" not in ctx.extras:
        unaided = harness.evaluate(ctx, ctx.base, [NO_TOOL])
        ctx.extras["base_unaided"] = {k: unaided[k] for k in ("pass@1", "pass@8", "pass@32")}
    return []


def sft_phase(ctx_out: Path, kind: str, steps: int, batch: int) -> Phase:
    traces = (ctx_out / "data" / f"sft_{kind}.jsonl").absolute()
    return Phase(
        "sft",
        steps,
        f"sft_{kind}",
        (
            f"sft.sources=[{{path: {quoted(traces)}}}]",
            f"sft.batch_size={batch}",
            f"train.learning_rate={SFT_LR}",
            "train.warmup_steps=5",
            NO_TOOL,  # SFT runs without the environment (algorithm: rl only)
        ),
    )


def tool_stats(ctx: Any, rows: list, records: list[list[Any]]) -> dict[str, float | None]:
    """A policy's tool-call record over its held-out episodes (each row's samples):

    - `calling`: episodes with at least one tool call; `calls`: calls per episode (every
      `<tool_call>` the assistant's turns open, well-formed or not);
    - `parsed`: calls that parse (well-formed `<tool_call>{json}</tool_call>`);
    - `valid`: parsed calls naming an offered tool with arguments its signature takes;
    - `errors`: valid calls whose tool failed (here: a key not in the table);
    - `key_copied`: parsed `lookup` calls whose key is the prompt's exactly;
    - `answer_from_tool`: episodes with a tool result whose final `\\boxed{}` is that result.

    Fractions of their own denominators (None when it is 0). Each call's response is the
    `tool` message at its place after the turn (`ToolEnv` answers every call, in order; a
    turn the episode's limits cut off has none: its calls count, their errors cannot)."""
    import inspect

    from rlvr_jax.envs import ToolCall, parse_tool_calls
    from rlvr_jax.envs.tools import resolve_tool

    tools = {name: resolve_tool(name).fn for name in ctx.cfg.env.tools}
    names = ("episodes", "calling", "calls", "parsed", "valid", "errors", "lookups",
             "key_copied", "with_result", "answer_from_tool")  # fmt: skip
    n = dict.fromkeys(names, 0)
    for row, episodes in zip(rows, records):
        prompt = (row.to_dict() if hasattr(row, "to_dict") else dict(row))["prompt"]
        key = next(iter(KEY.findall(str(prompt))), None)
        for rec in episodes:
            n["episodes"] += 1
            msgs, result, calls = rec.messages, None, 0
            for i, m in enumerate(msgs):
                if m["role"] != "assistant":
                    continue
                responses = []
                for follow in msgs[i + 1 :]:
                    if follow["role"] != "tool":
                        break
                    responses.append(follow["content"])
                for j, call in enumerate(parse_tool_calls(m["content"])):
                    calls += 1
                    response = responses[j] if j < len(responses) else None
                    error = response is not None and response.startswith("error:")
                    if response is not None and not error:
                        result = response
                    if not isinstance(call, ToolCall):
                        continue
                    n["parsed"] += 1
                    try:
                        inspect.signature(tools[call.name]).bind(**call.arguments)
                    except (KeyError, TypeError):
                        continue
                    n["valid"] += 1
                    n["errors"] += error
                    if call.name == "lookup":
                        n["lookups"] += 1
                        n["key_copied"] += call.arguments.get("key") == key
            n["calls"] += calls
            n["calling"] += calls > 0
            if result is not None:
                n["with_result"] += 1
                answer = BOXED.findall(rec.final_text)
                n["answer_from_tool"] += bool(answer) and answer[-1].strip() == result.strip()

    def frac(a: str, b: str) -> float | None:
        return n[a] / n[b] if n[b] else None

    return {
        "episodes": n["episodes"],
        "calling": frac("calling", "episodes"),
        "calls": frac("calls", "episodes"),
        "parsed": frac("parsed", "calls"),
        "valid": frac("valid", "parsed"),
        "errors": frac("errors", "valid"),
        "key_copied": frac("key_copied", "lookups"),
        "answer_from_tool": frac("answer_from_tool", "with_result"),
    }


def tool_table(ctx: harness.Context, results: dict[str, Any]) -> None:
    """results.md's tool-call table: each policy's `tool_stats`, mean over seeds."""
    import numpy as np

    keys = ("calling", "calls", "parsed", "valid", "errors", "key_copied", "answer_from_tool")
    lines = [
        "Tool calls over the held-out episodes (mean over seeds; fractions of calls, of parsed "
        "calls, of valid calls, of `lookup` calls, of episodes with a tool result):",
        "",
        "| policy | episodes calling | calls / episode | parsed | arguments valid | "
        "tool errors | key copied | answer = tool result |",
        "|---|" + "---:|" * len(keys),
    ]
    policies = {"base": [results["base"]]}
    for runs in results["seeds"].values():
        for arm, rec in runs.items():
            policies.setdefault(arm, []).append(rec)
    for name, recs in policies.items():
        stats = [r["episodes"] for r in recs if r.get("episodes", {}).get("episodes")]
        cells = []
        for k in keys:
            vals = [s[k] for s in stats if s.get(k) is not None]
            cells.append(f"{np.mean(vals):.3f}" if vals else "—")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    unaided = results.get("base_unaided")
    if unaided:
        lines += ["", f"The base model without the tool offered: pass@1 {unaided['pass@1']:.4f}, "
                  f"pass@32 {unaided['pass@32']:.3f}."]  # fmt: skip
    results["extra_markdown"] = "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = harness.parser(__doc__, out="runs/tool_use")
    p.set_defaults(config="configs/tool_use.yaml")
    for key, value in DEFAULTS.items():
        flag = "--" + key.replace("_", "-")
        p.add_argument(flag, type=int, default=None, help=f"default {value} ({QUICK[key]} quick)")
    args = p.parse_args(argv)
    s: dict[str, Any] = {}
    for key in DEFAULTS:
        given = getattr(args, key)
        s[key] = given if given is not None else (QUICK if args.quick else DEFAULTS)[key]
        if s[key] < 1:
            p.error(f"--{key.replace('_', '-')} must be >= 1, got {s[key]}")
    out = Path(args.out)
    sft = lambda kind: sft_phase(out, kind, s["sft_steps"], s["sft_batch"])
    arms = (
        Arm("SFT", (sft("tool"),), dir="", prepare=prepare, eval_overrides=()),
        Arm("SFT → RL", (Phase("rl", s["rl_steps"], "rl_tool"),), start="SFT", dir=""),
        Arm("SFT (no tool)", (sft("direct"),), dir="", prepare=prepare),
        Arm("SFT → RL (no tool)", (Phase("rl", s["rl_steps"], "rl_direct", (NO_TOOL,)),),
            start="SFT (no tool)", dir=""),
    )  # fmt: skip
    base_model = Path(__file__).resolve().parents[1] / "rlvr_jax" / "demo" / "assets" / "base"
    defaults = [
        f"model.path={quoted(base_model)}",  # the shipped demo base, read only
        "model.create_if_missing=null",
        f"eval.max_prompts={s['eval_prompts']}",
        "checkpoint.every_steps=0",
        "log.progress_bar=false",
        "log.tensorboard=false",
        "rollout.max_slots=256",  # the evaluations' 32 samples of 8 prompts in one wave
        *(["train.prompts_per_batch=2", "rollout.num_samples=4"] if args.quick else []),
    ]

    exp = harness.Experiment(
        name="tool_use",
        title="Learning to use a lookup tool",
        arms=arms,
        defaults=defaults,
        compare=(
            ("SFT → RL", "SFT → RL (no tool)"),
            ("SFT → RL", "SFT"),
            ("SFT → RL (no tool)", "SFT (no tool)"),
            ("SFT", "base"),
        ),
        episodes=tool_stats,
        finish=tool_table,
    )
    harness.run_main(p, args, exp, argv, s)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
