"""scripts/experiment_tool_use.py: its task (exact answers, disjoint held-out split), SFT
traces that tokenize exactly as the environment's episodes, and its table."""

import importlib.util
import sys
from pathlib import Path

import rlvr_jax
from rlvr_jax.data import load_tokenizer
from rlvr_jax.data.tokenizer import apply_chat_template

ROOT = Path(__file__).resolve().parents[1]


def load_script():
    path = ROOT / "scripts" / "experiment_tool_use.py"
    spec = importlib.util.spec_from_file_location("experiment_tool_use", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


exp = load_script()


def test_task_and_traces():
    train = exp.rows(40, seed=1)
    test = exp.rows(10, seed=2, exclude={r["expression"] for r in train})
    assert not {r["expression"] for r in train} & {r["expression"] for r in test}
    for r in train:
        a, op, b = r["expression"].split()
        value = {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}[op]
        assert int(r["ground_truth"]) == value
        assert len(a) >= (2 if op == "*" else 4)
    tokenizer = load_tokenizer(Path(rlvr_jax.__file__).parent / "demo" / "assets" / "base")
    sft = exp.sft_rows(train, tokenizer)  # raises unless they tokenize as the episodes do
    tool, direct = sft["tool"][0], sft["no_tool"][0]
    assert tool["response"].startswith("<tool_call>{") and "<tool_response>" in tool["response"]
    assert tool["response"].endswith(f"\\boxed{{{train[0]['ground_truth']}}}")
    assert direct["response"] == f"\\boxed{{{train[0]['ground_truth']}}}"
    for r in sft["tool"]:  # prompt + trace fit the demo model's 256 positions
        n = len(apply_chat_template(tokenizer, r["prompt"]))
        assert n <= exp.MAX_PROMPT_LEN
        assert (
            n + len(tokenizer.encode(r["response"])) + 1 <= exp.MAX_PROMPT_LEN + exp.MAX_NEW_TOKENS
        )


def test_table():
    results = {
        "command": "python scripts/experiment_tool_use.py",
        "sft_steps": 2,
        "rl_steps": 1,
        "policies": {
            "base": {"pass@1": 0.0, "pass@8": 0.0},
            "tool: SFT → RL": {"pass@1": 0.5, "pass@8": 0.9, "rl_samples": 64, "train_s": 12.0},
        },
        "loadavg_before": [1.0, 1.0, 1.0],
        "loadavg_after": [2.0, 2.0, 2.0],
        "wall_s": 60.0,
    }
    table = exp.markdown(results)
    assert "| tool: SFT → RL | yes | 64 | 0.500 | 0.900 | 12 |" in table
    assert "| base | no | 0 | 0.000 | 0.000 | 0 |" in table
