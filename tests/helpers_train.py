"""A tiny RL setup built locally for trainer tests: a random policy, a trained tokenizer and
synthetic verifiable prompts (nothing downloaded).

Imports only the standard library at the top: every reward worker of a `tiny_run` (a fresh
process) imports this module for `word_parity`, and rlvr_jax's models and data (jax, flax)
would add ~1 s of CPU to each worker's start."""

import atexit
import shutil
import tempfile
from pathlib import Path

_BUILT: dict[tuple, Path] = {}  # (texts, seed) -> a policy built in this process


def build_policy(path: Path, texts: list[str], *, seed: int = 0) -> Path:
    """A 2-layer Qwen2-shaped random policy with a 320-token BPE tokenizer at `path`
    (`rlvr_jax.models.testing.tiny_policy`). Built once per process for the same texts and seed
    (initialising the params compiles ~20 XLA programs: seconds), then copied file for file."""
    from rlvr_jax.models.testing import tiny_policy

    key = (tuple(texts), seed)
    if key not in _BUILT:
        built = Path(tempfile.mkdtemp(prefix="rlvr_test_policy_"))
        atexit.register(shutil.rmtree, built, ignore_errors=True)
        _BUILT[key] = tiny_policy(built / "policy", texts, seed=seed)
    shutil.copytree(_BUILT[key], path, dirs_exist_ok=True)
    return Path(path)


QUICK_RUNS = ("log.tensorboard=false", "rollout.max_slots=256")
"""Overrides of the experiment scripts' `--quick` runs on `tiny_run` (every rlvr-train run and
the harness's evaluations): no TensorBoard files, and 256 slots: the harness evaluates every
policy on n = 32 samples of 8 held-out prompts, which tiny_run's 16 slots decode 16 at a time,
each wave ~1 s on a loaded 2-core machine (an evaluation 15-20 s, five or more per test), 256
slots in one wave (< 1 s). Per-request seeds: the same samples."""


def word_parity(response: str, ground_truth, **_) -> float:
    """A test verifier: 1 when the response has an even number of words. A random policy gets
    it right about half the time, so groups have reward variance and every step trains."""
    return float(len(response.split()) % 2 == 0)


def tiny_run(tmp_path: Path, *, parity: bool = True) -> Path:
    """Writes data + policy under tmp_path; returns the config path. With `parity`, the
    training rows are scored by `word_parity` (registered as `helpers_train:word_parity`)."""
    from rlvr_jax.data import synthetic

    rows = synthetic.generate("train", 64, seed=0)
    test = synthetic.generate("test", 8, seed=0)
    texts = [r["prompt"] for r in rows] + [synthetic.reference_response(r) for r in rows]
    if parity:
        rows = [{**r, "verifier": "helpers_train:word_parity", "domain": "parity"} for r in rows]
    synthetic.write_jsonl(rows, tmp_path / "train.jsonl")
    synthetic.write_jsonl(test, tmp_path / "test.jsonl")
    build_policy(tmp_path / "policy", texts)
    cfg = tmp_path / "rl.yaml"
    cfg.write_text(
        f"""# rlvr-train --config {cfg}
model: {{path: {tmp_path / "policy"}}}
# one device for learner and actors: on XLA:CPU's simulated devices, two threads running
# multi-device programs at once can abort in the collective rendezvous (README, Limitations)
mesh: {{num_devices: 1, actor_devices: 0}}
data:
  sources: [{{path: {tmp_path / "train.jsonl"}}}]
  eval_sources: [{{path: {tmp_path / "test.jsonl"}}}]
  max_prompt_len: 96
# rollout.compile_ahead off: the engine's programs compile as the run meets them, not every
# prefill chunk and row bucket at start (the setting on: the trainer's other tests and configs)
rollout: {{mode: sync, num_samples: 4, max_new_tokens: 8, max_slots: 16, decode_chunk: 4,
          compile_ahead: false}}
loss: {{preset: olmo3}}
filter: {{max_draws: 2}}
rewards: {{workers: 1}}
# compile_ahead off (as in configs/demo.yaml): the learner's step is compiled for the packed-row
# counts the run meets, not for every count it may meet (2 groups: 1 or 2 rows): a 3-step run
# from a cold compilation cache 22-25 CPU-s instead of 29-31. The setting itself, on and off:
# tests/test_train_loop.py::test_every_packed_row_count_is_compiled_with_the_first_batch
train: {{max_steps: 3, output_dir: {tmp_path / "out"}, prompts_per_batch: 2,
        learning_rate: 1.0e-3, compile_ahead: false}}
checkpoint: {{every_steps: 2, keep: 2}}
eval: {{every_steps: 0, num_samples: 4, ks: [1, 4], max_prompts: 4}}
# no end-of-run plots (matplotlib's import and drawing, ~2 s in each rlvr-train process):
# the tests of curves.png set log.plots=true
log: {{progress_bar: false, tensorboard: true, plots: false}}
"""
    )
    return cfg


def check_mismatch_apart_from_lag(rows: list[dict], mode: str) -> None:
    """The `mismatch/*` and `lag/*` metrics of a run's metrics.jsonl rows (tiny_run, fp32): on
    policy the two sides agree to rounding; sync has no lag; async shows lag apart."""
    for r in rows:
        assert r["mismatch/tokens"] + r["lag/tokens"] > 0, r
        if r["mismatch/tokens"]:  # fp32: the same function up to matmul summation order
            assert r["mismatch/kl"] <= 1e-12 and r["mismatch/max_abs_logp"] < 1e-4, r
    if mode == "sync":  # every token sampled by the params the learner holds
        assert all(r["lag/tokens"] == 0 and r["lag/kl"] == 0 for r in rows)
    else:  # the actors run one version ahead of what they sampled with: lag shows apart
        assert any(r["lag/tokens"] > 0 for r in rows)
        assert any(r["lag/kl"] > max(r["mismatch/kl"], 1e-12) for r in rows)
