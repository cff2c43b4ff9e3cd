"""The tool-use task family and its tool-calling warm start.

Task: `What is the code of "joyate"? Put your final answer in \\boxed{}.`: the code is in a table
the prompt never shows (`rlvr_jax.envs.lookup`); only the `lookup` tool returns it, and the
held-out keys (`TEST_KEYS`) are disjoint from the training ones. The policy must copy the key
into a Hermes `<tool_call>` and the code from the response into `\\boxed{}` (verifier `math`).

- `split_keys`, `task_rows`, `write_splits` (`python -m rlvr_jax.demo.tool_use --out
  data/tool_use`: the shipped `data/tool_use/{train,test}.jsonl`);
- `tool_traces` / `direct_traces`: SFT rows that call the tool (rendered exactly as
  `ToolEnv` renders its episodes, checked token for token) or answer directly;
- `build_tool_base`: `configs/tool_use.yaml`'s `model.create_if_missing` — the demo base
  model after `WARM_START` (a short SFT on the training keys' tool traces through the trainer's
  own SFT path), so that RL with the tool has calls to reinforce from its first step.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rlvr_jax.envs.lookup import KEYS, TABLE

log = logging.getLogger(__name__)

DOMAIN = "lookup"
PROMPT = 'What is the code of "{key}"? Put your final answer in \\boxed{{}}.'
TEST_KEYS = 80
"""Keys held out of training (the evaluation split); the other 320 are the training split."""
SPLIT_SEED = 0
TOOLS = ("lookup",)


@dataclasses.dataclass(frozen=True)
class WarmStart:
    """The SFT that turns the demo base model into the tool-calling warm start."""

    steps: int = 200
    batch_size: int = 16
    learning_rate: float = 1e-3
    warmup_steps: int = 5


WARM_START = WarmStart()


def split_keys(test: int = TEST_KEYS, seed: int = SPLIT_SEED) -> tuple[list[str], list[str]]:
    """(training keys, held-out keys): a seeded permutation of `KEYS`, the last `test` held
    out."""
    order = np.random.default_rng(seed).permutation(len(KEYS))
    keys = [KEYS[i] for i in order]
    return keys[:-test], keys[-test:]


def task_rows(keys: Sequence[str]) -> list[dict[str, Any]]:
    """One data row per key: the prompt, the code as the ground truth (`math` verifier)."""
    return [
        {
            "prompt": PROMPT.format(key=k),
            "ground_truth": str(TABLE[k]),
            "verifier": "math",
            "domain": DOMAIN,
            "key": k,
        }
        for k in keys
    ]


def write_jsonl(rows: Sequence[dict[str, Any]], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def write_splits(out_dir: str | Path) -> dict[str, Path]:
    """`train.jsonl` (320 rows) and `test.jsonl` (80 held-out keys) under `out_dir`."""
    train, test = split_keys()
    out = Path(out_dir)
    return {
        "train": write_jsonl(task_rows(train), out / "train.jsonl"),
        "test": write_jsonl(task_rows(test), out / "test.jsonl"),
    }


def tool_call(name: str, arguments: dict[str, Any]) -> str:
    """A Hermes tool call as the traces write it."""
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def tool_traces(rows: Sequence[dict[str, Any]], tokenizer: Any) -> list[dict[str, Any]]:
    """SFT rows that call `lookup` with the row's key, read the tool's response and answer
    `\\boxed{code}`: the prompt as chat messages (the tools block as the system message, which
    the tokenizer's plain ChatML template renders as `ToolEnv`'s `TOOL_TEMPLATE` does), the
    response the whole episode after it (call, end of turn, tool response, answer).

    Raises RuntimeError when a trace's token ids differ from those the environment and the
    engine produce for the same episode (the prompt, the call, the appended response)."""
    from rlvr_jax.config.schema import EnvConfig
    from rlvr_jax.data.tokenizer import apply_chat_template
    from rlvr_jax.envs import ChatFormat, EnvRunner, ToolEnv

    env = ToolEnv(list(TOOLS))
    chat = ChatFormat(tokenizer, env.tools)
    head, end = "<|im_start|>system\n", "<|im_end|>"
    rendered = chat.render(env.reset(rows[0]), add_generation_prompt=False)
    if not rendered.startswith(head):
        raise RuntimeError(f"tool traces need a ChatML template, got {rendered[:40]!r}")
    system = rendered[len(head) : rendered.index(end)]
    eos = tokenizer.decode([tokenizer.eos_token_id])
    out = []
    for r in rows:
        messages = env.reset(r)
        call = tool_call("lookup", {"key": r["key"]})
        observation = env.step(call).observation
        history = [*messages, {"role": "assistant", "content": call}]
        appended = tokenizer.decode(chat.observation_ids(history, observation, eos))
        response = f"{call}{eos}{appended}\\boxed{{{r['ground_truth']}}}"
        out.append({**r, "prompt": [{"role": "system", "content": system}, *messages],
                    "response": response})  # fmt: skip
    # the first trace is the episode the engine would run: same prompt, same appended ids
    row, trace = rows[0], out[0]
    runner = EnvRunner(
        EnvConfig(name="tools", tools=list(TOOLS)),
        tokenizer,
        max_new_tokens=1 << 20,
        stop_token_ids=[tokenizer.eos_token_id],
    )
    try:
        group = runner.group({**row, "index": 0})
        call_ids = [*chat.encode(tool_call("lookup", {"key": row["key"]})), tokenizer.eos_token_id]
        appended_ids = group.next_turn(0, call_ids, "stop").result()
    finally:
        runner.close()
    want = [*call_ids, *appended_ids, *chat.encode(f"\\boxed{{{row['ground_truth']}}}")]
    if apply_chat_template(tokenizer, trace["prompt"]) != group.prompt_ids or (
        chat.encode(trace["response"]) != want
    ):
        raise RuntimeError("the tool traces do not tokenize as the environment's episodes do")
    return out


def direct_traces(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """SFT rows that answer `\\boxed{code}` at once (no tool)."""
    return [{**r, "response": f"\\boxed{{{r['ground_truth']}}}"} for r in rows]


# -- the warm start ---------------------------------------------------------------------------


def build_tool_base(path: str | Path, cfg: Any, *, recipe: WarmStart = WARM_START) -> Path:
    """Writes the tool-calling warm start to `path`: the demo base model after `recipe.steps`
    SFT steps (`algorithm: sft`) on the training keys' tool traces, with `warm_start.json`."""
    from rlvr_jax.config import from_dict, to_dict
    from rlvr_jax.data import load_tokenizer
    from rlvr_jax.demo.base_model import build_demo_base
    from rlvr_jax.training.metrics import read_jsonl
    from rlvr_jax.training.run import train

    start = time.perf_counter()
    out = Path(path)
    with tempfile.TemporaryDirectory(prefix="tool_base_") as tmp:
        work = Path(tmp)
        raw = to_dict(cfg)
        # the shipped demo base was pretrained on plain prompts; the tool env renders chat
        base_cfg = from_dict({**raw, "data": {**raw["data"], "prompt_template": "plain"}})
        base = build_demo_base(work / "base", base_cfg)
        tokenizer = load_tokenizer(base)
        traces = write_jsonl(tool_traces(task_rows(split_keys()[0]), tokenizer), work / "sft.jsonl")
        sft = {
            **raw,
            "algorithm": "sft",
            "model": {**raw["model"], "path": str(base), "create_if_missing": None},
            "env": {**raw["env"], "name": None},
            "data": {**raw["data"], "prompt_template": "chat", "eval_sources": []},
            "sft": {**raw["sft"], "sources": [{"path": str(traces)}],
                    "batch_size": recipe.batch_size},
            "train": {**raw["train"], "max_steps": recipe.steps, "output_dir": str(work / "sft"),
                      "learning_rate": recipe.learning_rate, "schedule": "constant",
                      "warmup_steps": recipe.warmup_steps},
            "checkpoint": {**raw["checkpoint"], "every_steps": 0, "export_hf": True},
            "eval": {**raw["eval"], "every_steps": 0},
            "log": {**raw["log"], "progress_bar": False, "tensorboard": False, "plots": False},
        }  # fmt: skip
        log.info("tool warm start: %d SFT steps of %s into %s", recipe.steps, base, out)
        train(from_dict(sft, source="the tool warm start (rlvr_jax.demo.tool_use)"))
        metrics = read_jsonl(work / "sft" / "metrics.jsonl")
        out.mkdir(parents=True, exist_ok=True)
        for item in sorted((work / "sft" / "final").iterdir()):
            if item.is_file():
                shutil.copyfile(item, out / item.name)
    report = {
        "recipe": dataclasses.asdict(recipe),
        "base": "rlvr_jax/demo/assets/base (the demo base model)",
        "traces": "tool_traces(task_rows(split_keys()[0])): 320 training keys",
        "wall_s": round(time.perf_counter() - start, 1),
        "final_loss": metrics[-1].get("loss") if metrics else None,
    }
    (out / "warm_start.json").write_text(json.dumps(report, indent=2) + "\n")
    log.info("tool warm start: built in %.0f s (%s)", report["wall_s"], out)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Write the tool-use task's train/test splits.")
    p.add_argument("--out", default="data/tool_use", help="output directory")
    args = p.parse_args(argv)
    for name, path in write_splits(args.out).items():
        print(f"{name}: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
