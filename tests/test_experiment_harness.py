"""scripts/experiment_common.py + experiment_report.py (the experiment harness): budgets and
training FLOPs by hand, the bootstrap, the probe's data, and `--quick` runs of the experiments
that have no test file of their own (rollouts per prompt, budget forcing)."""

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from rlvr_jax.config import load

ROOT = Path(__file__).resolve().parents[1]


def load_script(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while being built
    spec.loader.exec_module(module)
    return module


harness = load_script("experiment_common")
report, data = harness.report, harness.data

DEMO_ARCH = {"model_type": "llama", "vocab_size": 512, "hidden_size": 256,
             "intermediate_size": 768, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2, "max_position_embeddings": 256, "tie_word_embeddings": True}  # fmt: skip


def test_budget_and_flops_by_hand(tmp_path, monkeypatch):
    (tmp_path / "config.json").write_text(json.dumps(DEMO_ARCH))
    ctx = harness.Context("c.yaml", [], None, tmp_path, tmp_path, [0], quick=True)
    monkeypatch.setattr(data, "prompt_tokens", lambda cfg, base: 10.0)  # Lp = 10 tokens
    cfg = load(None, ["model.path=m", "rollout.num_samples=4", "sft.batch_size=2"])
    rl = [{"groups/drawn": 3.0, "groups/kept": 2.0, "groups/stale_dropped": 1.0,
           "response_length/mean": 6.0, "tokens": 40.0, "reward/mean": 0.5, "policy_version": 1,
           "eval/pass@1": 0.25, "eval/pass@8": 0.5}]  # fmt: skip
    sft = [{"sft/tokens": 12.0, "policy_version": 1}]
    got = data.account(ctx, [("rl", cfg, rl), ("sft", cfg, sft)])
    b = got["budget"]
    # matmul params: 2 layers × (256·4·64 + 2·256·2·64 + 4·64·256 + 3·256·768) + 512·256
    #   = 2 × 786,432 + 131,072 = 1,703,936; a token at context c: 2·1,703,936 + 2048·c
    # decode: 3 groups × 4 × (10 + 6) tokens at c = 10 + 6/2 = 13: 192 × 3,434,496
    # learner: 2 kept groups × 4 sequences of 10 + 40/8 = 15 tokens, 3 × 15 × (… + 2048·15);
    #   SFT: 2 examples of 10 + 12/2 = 16 tokens, 3 × 16 × (… + 2048·16)
    learner = 8 * 45 * 3_438_592 + 2 * 48 * 3_440_640
    assert b["decode_flops"] == 192 * 3_434_496
    assert b["learner_flops"] == learner and b["old_logprob_flops"] == 0.0
    assert b["flops"] == 192 * 3_434_496 + learner
    assert (b["updates"], b["rl_prompts"], b["rl_completions"]) == (2, 3.0, 12.0)
    assert (b["samples"], b["trained_groups"], b["sft_examples"]) == (16.0, 2.0, 2.0)  # (3+1)·4
    c = got["curve"]
    assert c["step"] == [1, 2] and c["samples"] == [16.0, 16.0] and c["reward"] == [0.5, None]
    assert c["eval"] == [{"step": 1, "prompts": 3.0, "samples": 16.0,
                          "flops": 192 * 3_434_496 + 8 * 45 * 3_438_592,
                          "pass@1": 0.25, "pass@8": 0.5}]  # fmt: skip


def test_bootstrap_and_paired_differences():
    rng = np.random.default_rng(0)
    same = report.bootstrap(np.full((3, 5), 0.4), rng)
    assert same == pytest.approx({"mean": 0.4, "lo": 0.4, "hi": 0.4})
    values = np.array([[0.0, 1.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]])  # seed 1 solves everything
    ci = report.bootstrap(values, rng)
    assert ci["mean"] == 0.75 and 0.0 <= ci["lo"] < 0.75 < ci["hi"] <= 1.0
    # two seeds of one prompt each: counts 32 and 0 of 32 → pass@1 1 and 0
    results = {"heldout": {"n": 32, "ks": [1], "domains": ["a"]}, "probe": None,
               "base": {"counts": [16]}, "compare": [["x", "y"], ["x", "base"]],
               "seeds": {"0": {"x": {"counts": [32]}, "y": {"counts": [32]}},
                         "1": {"x": {"counts": [0]}, "y": {"counts": [0]}}}}  # fmt: skip
    s = report.summarize(results)
    assert s["arms"]["x"]["all"]["pass@1"]["mean"] == 0.5
    assert s["deltas"]["x − y"]["a"]["pass@1"] == {"mean": 0.0, "lo": 0.0, "hi": 0.0}
    assert report.verdict(s["deltas"]["x − y"]["all"]["pass@1"]) == "tied"
    assert report.verdict({"mean": 0.1, "lo": 0.02, "hi": 0.2}) == "ahead"
    assert report.verdict({"mean": -0.1, "lo": -0.2, "hi": -0.01}) == "behind"
    got = report.pass_at_k([32, 0, 16], ["a", "a", "b"], 32, [1, 32])
    assert got == {"pass@1": 0.5, "pass@32": 2 / 3,
                   "per_domain": {"a": {"pass@1": 0.5, "pass@32": 0.5},
                                  "b": {"pass@1": 0.5, "pass@32": 1.0}}}  # fmt: skip


def test_probe_rewrites_the_training_sources(tmp_path):
    rows = [{"prompt": "p", "ground_truth": "1", "verifier": "math", "domain": "arithmetic"},
            {"prompt": "q", "ground_truth": {}, "verifier": "ifeval"}]  # fmt: skip
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    train = f"data.sources=[{{path: {tmp_path / 'train.jsonl'}, weight: 2.0}}]"
    cfg = load(
        None, ["model.path=m", train, f"data.eval_sources=[{{path: {tmp_path / 'test.jsonl'}}}]"]
    )
    (override,) = data.probe_overrides(cfg, "ifeval", tmp_path / "d")  # domain from verifier
    cfg = load(None, ["model.path=m", override])
    (src,) = cfg.data.sources
    assert src.weight == 2.0 and src.name == "train"
    assert [json.loads(x)["prompt"] for x in Path(src.path).read_text().splitlines()] == ["p"]
    with pytest.raises(ValueError, match="no held-out row has that domain"):
        data.probe_overrides(cfg, "code", tmp_path / "d")


def test_arms_that_start_from_others_must_run(tmp_path, capsys):
    dpo = load_script("experiment_dpo_then_rl")
    with pytest.raises(SystemExit):
        dpo.main(["--arms", "DPO → RL", "--out", str(tmp_path)])
    assert "['DPO'] must run too" in capsys.readouterr().err


@pytest.mark.slow
def test_quick_rollouts_per_prompt_splits_and_curves(tmp_path):
    from helpers_train import QUICK_RUNS, tiny_run

    exp = load_script("experiment_rollouts_per_prompt")
    cfg, out = tiny_run(tmp_path), tmp_path / "rpp"
    # a random policy passes the parity verifier half the time: hard = at most 2 of 4
    argv = ["--config", str(cfg), "--quick", "--out", str(out), "--hard-max", "0.5"]
    assert exp.main([*argv, *QUICK_RUNS]) == 0
    results = json.loads((out / "results.json").read_text())
    diff = results["difficulty"]
    assert diff["prompts"] == 32 and sum(diff["histogram"]) == 32
    assert diff["easy"]["prompts"] + diff["hard"]["prompts"] >= 32  # 1 or 2 of 4: both
    runs = results["seeds"]["0"]
    assert list(runs) == ["easy n=4", "easy n=32", "hard n=4", "hard n=32"]
    for split in ("easy", "hard"):
        small, big = runs[f"{split} n=4"], runs[f"{split} n=32"]
        # equal completions: 32 / (2 prompts × 4) = 4 steps vs ⌈32 / 64⌉ = 1 step
        assert [r["steps"] for r in (small["runs"][0], big["runs"][0])] == [4, 1]
        assert small["budget"]["rl_completions"] == 32 and big["budget"]["rl_completions"] == 64
        assert len(small["curve"]["eval"]) == 4 and len(big["curve"]["eval"]) == 1
        assert small["budget"]["flops"] > 0 and 0.0 <= big["pass@1"] <= big["pass@32"] <= 1.0
        assert "hard.jsonl" in small["runs"][0]["command"] or split == "easy"
    assert "hard n=32 − hard n=4" in results["summary"]["deltas"]
    assert "| easy | 4 |" in (out / "results.md").read_text()
    assert (out / "rollouts_per_prompt.png").stat().st_size > 10_000


@pytest.mark.slow
def test_quick_budget_forcing_keeps_its_table(tmp_path):
    from helpers_train import QUICK_RUNS, tiny_run

    exp = load_script("experiment_budget_forcing")
    cfg, out = tiny_run(tmp_path), tmp_path / "bf"
    argv = ["--config", str(cfg), "--quick", "--out", str(out), "--budget", "4", "--answer", "4"]
    argv += ["--text", " ok"]  # 4 + 1 + 4 tokens fit 16 new tokens
    argv += ["rollout.max_new_tokens=16", *QUICK_RUNS]
    assert exp.main(argv) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["meta"]["steps"] == 1 and len(results["meta"]["load_after"]) == 3
    on, off = results["arms"]["on"], results["arms"]["off"]
    assert 0.0 < on["interrupted_fraction"] <= 1.0 and np.isnan(off["interrupted_fraction"])
    assert on["wall_s"] > 0 and 0.0 <= on["pass@1"] <= on["pass@32"] <= 1.0
    text = (out / "results.md").read_text()
    assert "| on |" in text and "interrupted fraction" in text and "| on − off |" in text
