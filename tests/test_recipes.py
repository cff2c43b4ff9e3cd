"""SFT, expert iteration and RL + SFT parallel averaging: the parallel step against gradients
computed independently (SGD by hand, Adam with two separate moment states), SFT data and
batches, expert selection with a real reward service, and each algorithm end to end through
`rlvr-train` on a tiny random policy (exact resume for SFT and parallel averaging)."""

import dataclasses
import functools
import json
import shutil
from pathlib import Path

import helpers_models as H
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers_train import tiny_run

from rlvr_jax import cli, losses, models
from rlvr_jax.config.schema import Config, RewardsConfig, SFTConfig, SourceConfig
from rlvr_jax.data import BadRow, DataError, load_source, load_tokenizer, synthetic
from rlvr_jax.data.rows import row_from_record
from rlvr_jax.rewards import RewardService
from rlvr_jax.rollout import CompletedGroup, Completion
from rlvr_jax.training import run
from rlvr_jax.training.algorithms.expert_iteration import expert_examples, expert_metrics
from rlvr_jax.training.algorithms.rl_sft_parallel import init_parallel_state, make_parallel_step
from rlvr_jax.training.algorithms.sft import (
    SFTSource,
    build_sft_iterator,
    encode_response,
    response_reader,
)
from rlvr_jax.training.batch import Sample, collate
from rlvr_jax.training.groups import score_groups
from rlvr_jax.training.metrics import read_jsonl
from rlvr_jax.training.sft import collate_sft

# -- the parallel-averaging step ---------------------------------------------------------

ARCH = H.micro_arch()
S = 8  # tokens per row before the shift: the arrays have T = 7 positions


def batches() -> tuple[dict, dict]:
    """An RL mini-batch (4 completions, advantages of both signs) and an SFT batch (4
    examples), on the learner's shifted grid."""
    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, 32, n).tolist() for n in (3, 2, 4, 1)]
    completions = [rng.integers(3, 32, n).tolist() for n in (4, 5, 2, 6)]
    samples = [
        Sample(prompt_tokens=p, tokens=c, sampler_logp=[-1.0] * len(c), advantage=a)
        for p, c, a in zip(prompts, completions, (1.0, -0.5, 0.25, -0.75))
    ]
    rl = collate(samples, rows=4, seq_len=S, pad_id=0)
    responses = [rng.integers(3, 32, n).tolist() for n in (3, 1, 4, 2)]
    sft = collate_sft(prompts, responses, rows=4, seq_len=S, pad_id=0)
    return jax.tree.map(jnp.asarray, rl), jax.tree.map(jnp.asarray, sft)


def reference_logp(params, batch):
    """log softmax(logits)[target] straight from the model (not the learner's code)."""
    tokens = getattr(batch, "tokens", batch)  # an RL batch's rows (one completion each here)
    logits_BxTxV = models.apply(
        params, ARCH, tokens.input_ids_BxT, tokens.positions_BxT, tokens.segment_ids_BxT
    ).astype(jnp.float32)
    logp_BxTxV = jax.nn.log_softmax(logits_BxTxV, axis=-1)
    return jnp.take_along_axis(logp_BxTxV, tokens.target_ids_BxT[..., None], axis=-1)[..., 0]


def reference_rl_loss(params, batch):
    """With one optimizer step per batch the PPO ratio is exp(logp − sg(logp)) = 1, whose
    gradient is ∇logp; so L_RL's gradient is that of −Σ m·A·logp / Σ m (token-mean)."""
    logp_BxT = reference_logp(params, batch)
    mask_BxT = batch.mask_BxT
    return -jnp.sum(mask_BxT * batch.advantages_B[:, None] * logp_BxT) / jnp.sum(mask_BxT)


def reference_sft_loss(params, batch):
    """Σ m·(−logp) / Σ m over the response tokens."""
    logp_BxT = reference_logp(params, batch)
    return -jnp.sum(batch.mask_BxT * logp_BxT) / jnp.sum(batch.mask_BxT)


reference_rl_grad = jax.jit(jax.grad(reference_rl_loss))
reference_sft_grad = jax.jit(jax.grad(reference_sft_loss))

ADAM_RL, ADAM_SFT = optax.adam(1e-2), optax.adam(3e-3)
"""The two optimizers of the Adam tests: different rates, independent moments."""


def parallel_step(rl_opt, sft_opt, **kwargs):
    return jax.jit(
        make_parallel_step(ARCH, rl_opt, sft_opt, losses.LossSettings(), max_len=S - 1, **kwargs)
    )


@functools.cache
def adam_parallel_step(n_micro: int):
    """The jitted Adam step, compiled once per micro-batch count for the tests below."""
    return parallel_step(ADAM_RL, ADAM_SFT, n_micro_rl=n_micro, n_micro_sft=n_micro)


def tree_close(a, b, **tol):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), **tol)


@pytest.mark.slow
def test_parallel_step_with_sgd_averages_the_two_updates():
    params = models.init_params(ARCH, jax.random.key(1))
    rl, sft = batches()
    eta_rl, eta_sft = 0.1, 0.03
    state = init_parallel_state(params, optax.sgd(eta_rl), optax.sgd(eta_sft))
    new, metrics = parallel_step(optax.sgd(eta_rl), optax.sgd(eta_sft))(state, rl, sft)

    g_rl, g_sft = reference_rl_grad(params, rl), reference_sft_grad(params, sft)
    # SGD: Δ = −η g, so θ ← θ + ½(Δ_RL + Δ_SFT) = θ − ½(η_RL g_RL + η_SFT g_SFT)
    expected = jax.tree.map(
        lambda p, a, b: p - 0.5 * (eta_rl * a + eta_sft * b), params, g_rl, g_sft
    )
    tree_close(new.params, expected, rtol=1e-5, atol=1e-7)
    assert int(new.step) == 1 and int(new.skipped) == 0
    np.testing.assert_allclose(metrics["sft/loss"], reference_sft_loss(params, sft), rtol=1e-6)
    # at ratio 1 the PPO loss is −Σ m·A / Σ m: masks hold 4, 5, 2, 6 tokens, so
    # −(4·1 − 5·0.5 + 2·0.25 − 6·0.75) / 17 = 2.5 / 17
    np.testing.assert_allclose(metrics["loss"], 2.5 / 17, rtol=1e-5)
    # the update norms are those of the two SGD updates
    np.testing.assert_allclose(
        metrics["parallel/rl_update_norm"], eta_rl * optax.global_norm(g_rl), rtol=1e-5
    )
    np.testing.assert_allclose(
        metrics["parallel/sft_update_norm"], eta_sft * optax.global_norm(g_sft), rtol=1e-5
    )
    dot = sum(jnp.vdot(a, b) for a, b in zip(jax.tree.leaves(g_rl), jax.tree.leaves(g_sft)))
    cosine = dot / (optax.global_norm(g_rl) * optax.global_norm(g_sft))
    np.testing.assert_allclose(metrics["parallel/update_cosine"], cosine, rtol=1e-4, atol=1e-6)


@pytest.mark.slow
def test_parallel_step_with_adam_keeps_two_independent_moment_states():
    params = models.init_params(ARCH, jax.random.key(2))
    rl, sft = batches()
    state = init_parallel_state(params, ADAM_RL, ADAM_SFT)
    for _ in range(2):
        state, _ = adam_parallel_step(1)(state, rl, sft)

    # independent reference: two optax Adams, each fed only its own gradient at θ̄
    theta, s_rl, s_sft = params, ADAM_RL.init(params), ADAM_SFT.init(params)
    for _ in range(2):
        d_rl, s_rl = ADAM_RL.update(reference_rl_grad(theta, rl), s_rl)
        d_sft, s_sft = ADAM_SFT.update(reference_sft_grad(theta, sft), s_sft)
        theta = jax.tree.map(lambda p, a, b: p + 0.5 * (a + b), theta, d_rl, d_sft)
    tree_close(state.params, theta, rtol=1e-4, atol=1e-6)
    tree_close(state.opt_state.rl[0].mu, s_rl[0].mu, rtol=1e-4, atol=1e-8)
    tree_close(state.opt_state.sft[0].nu, s_sft[0].nu, rtol=1e-4, atol=1e-12)

    # one Adam on the averaged gradient (shared moments) lands elsewhere: the test can tell
    shared, s = params, ADAM_RL.init(params)
    for _ in range(2):
        g = jax.tree.map(
            lambda a, b: 0.5 * (a + b),
            reference_rl_grad(shared, rl),
            reference_sft_grad(shared, sft),
        )
        d, s = ADAM_RL.update(g, s)
        shared = optax.apply_updates(shared, d)
    gap = max(
        float(jnp.max(jnp.abs(a - b)))
        for a, b in zip(jax.tree.leaves(shared), jax.tree.leaves(state.params))
    )
    assert gap > 1e-3


@pytest.mark.slow
def test_parallel_step_micro_batching_matches_one_batch():
    params = models.init_params(ARCH, jax.random.key(3))
    rl, sft = batches()
    state = init_parallel_state(params, ADAM_RL, ADAM_SFT)
    whole, m1 = adam_parallel_step(1)(state, rl, sft)
    micro, m2 = adam_parallel_step(2)(init_parallel_state(params, ADAM_RL, ADAM_SFT), rl, sft)
    tree_close(whole.params, micro.params, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(m1["sft/loss"], m2["sft/loss"], rtol=1e-5)
    np.testing.assert_allclose(m1["loss"], m2["loss"], rtol=1e-5)


@pytest.mark.slow
def test_parallel_step_skips_everything_when_one_loss_is_not_finite():
    params = models.init_params(ARCH, jax.random.key(4))
    rl, sft = batches()
    rl = rl.replace(advantages_B=rl.advantages_B.at[0].set(jnp.nan))
    state = init_parallel_state(params, ADAM_RL, ADAM_SFT)
    new, metrics = adam_parallel_step(1)(state, rl, sft)
    tree_close(new.params, params, rtol=0, atol=0)
    assert int(new.step) == 0 and int(new.skipped) == 1 and float(metrics["step_ok"]) == 0.0
    # the SFT half was finite but is not applied either: its moments did not move
    assert int(new.opt_state.sft[0].count) == 0


# -- the tiny run shared by the tests below ---------------------------------------------


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """tiny_run's data and policy, plus `sft.jsonl`: its arithmetic rows with a short
    `response` (`\\boxed{answer}`, 8-9 tokens with the separator and EOS)."""
    root = tmp_path_factory.mktemp("recipes")
    cfg = tiny_run(root)
    rows = [r for r in synthetic.generate("train", 64, seed=0) if r["domain"] == "arithmetic"]
    responses = [{**r, "response": f"\\boxed{{{r['ground_truth']}}}"} for r in rows]
    synthetic.write_jsonl(responses, root / "sft.jsonl")
    return root, cfg


def load_config(cfg_path: Path, *overrides: str) -> Config:
    from rlvr_jax.config import load

    return load(str(cfg_path), list(overrides))


# -- SFT data -------------------------------------------------------------------------


def arithmetic_row() -> dict:
    return next(r for r in synthetic.generate("train", 16, seed=0) if r["domain"] == "arithmetic")


def test_response_reader_field_reference_and_skips():
    row = arithmetic_row()
    read = response_reader(SFTConfig(response_field="answer"))
    assert read({**row, "answer": "It is 3."}) == "It is 3."
    with pytest.raises(BadRow, match="missing field 'answer'") as e:
        read(row)
    assert e.value.kind == "missing_response"

    with_reference = response_reader(SFTConfig(synthetic_reference=True))
    assert with_reference(row) == synthetic.reference_response(row)
    assert with_reference({**row, "response": "given"}) == "given"  # the field wins
    with pytest.raises(BadRow, match="no synthetic reference") as e:
        with_reference({**row, "domain": "parity"})
    assert e.value.kind == "no_reference"

    bounded = response_reader(SFTConfig(), length=lambda text: len(text.split()), max_tokens=3)
    assert bounded({**row, "response": "one two three"}) == "one two three"
    with pytest.raises(BadRow, match=r"4 tokens > rollout.max_new_tokens 3") as e:
        bounded({**row, "response": "one two three four"})
    assert e.value.kind == "too_long"


def test_load_source_carries_responses_and_counts_skips(tmp_path):
    row = arithmetic_row()
    path = synthetic.write_jsonl(
        [
            {**row, "response": "fine"},
            row,  # no response
            {**row, "response": 123},
            {**row, "response": "   "},
            {**row, "response": "also fine"},
        ],
        tmp_path / "sft.jsonl",
    )
    src = load_source(SourceConfig(path=str(path)), response=response_reader(SFTConfig()))
    assert [(r.index, r.response) for r in src.rows] == [(0, "fine"), (4, "also fine")]
    assert src.skipped == {"missing_response": 1, "wrong_type": 1, "empty_response": 1}
    # without `response` the rows are prompt rows, as before
    assert {r.response for r in load_source(SourceConfig(path=str(path))).rows} == {None}


@pytest.mark.slow
def test_sft_iterator_and_batcher_with_synthetic_references(tiny):
    root, cfg_path = tiny
    data = synthetic.generate("train", 64, seed=0)
    cfg = load_config(
        cfg_path,
        f"sft.sources=[{{path: {root / 'unparity.jsonl'}}}]",
        "sft.synthetic_reference=true",
        "rollout.max_new_tokens=40",
    )
    synthetic.write_jsonl(data, root / "unparity.jsonl")
    tokenizer = load_tokenizer(root / "policy")
    examples = build_sft_iterator(cfg, tokenizer, seed=0)
    src = examples.sources[0]
    # every kept row trains on its reference solution; the rest did not fit the budgets
    for r in src.rows:
        assert r.response == synthetic.reference_response(data[r.index])
        assert len(encode_response(r.response, tokenizer, "plain")) <= 40
    assert 0 < len(src.rows) < len(data) and set(src.skipped) <= {"too_long"}

    batcher = SFTSource(
        examples, tokenizer, "plain", rows=3, seq_len=cfg.data.max_prompt_len + 41, pad_id=2
    )
    arrays = batcher.next_arrays()
    assert arrays.mask_BxT.shape == (3, cfg.data.max_prompt_len + 40)
    drawn = build_sft_iterator(cfg, tokenizer, seed=0).next_batch(3)
    for i, row in enumerate(drawn):
        trained = arrays.target_ids_BxT[i][arrays.mask_BxT[i] > 0].tolist()
        # the masked targets are exactly separator + response + EOS
        assert trained == encode_response(row.response, tokenizer, "plain")
        assert trained[-1] == tokenizer.eos_token_id
    assert examples.state()["draws"] == 3  # (sft.batch_size >= 1 is checked at config load)


@pytest.mark.slow
def test_sft_iterator_needs_some_source(tiny):
    _, cfg_path = tiny
    cfg = load_config(cfg_path, "data.sources=[]")
    with pytest.raises(DataError, match=r"sft.sources and data.sources are both empty"):
        build_sft_iterator(cfg, tokenizer=None, seed=0)


# -- expert iteration's selection -----------------------------------------------------


def completion(tokens: list[int], i: int) -> Completion:
    return Completion(0, i, tokens, [0.0] * len(tokens), "stop", [0] * len(tokens))


@pytest.mark.slow
def test_expert_selection_keeps_only_verified_correct_samples(tiny):
    root, _ = tiny
    tokenizer = load_tokenizer(root / "policy")
    record = {"prompt": "p", "ground_truth": None, "verifier": "helpers_train:word_parity"}
    row = row_from_record({**record, "domain": "parity"}, source="t", index=0, where="test")
    texts = [["two words", "three words here", "one"], ["four words are here", "x"]]
    groups = [
        CompletedGroup(
            g, row, [completion(tokenizer.encode(t), i) for i, t in enumerate(ts)], [5, 6, 7 + g]
        )
        for g, ts in enumerate(texts)
    ]
    # domain weight 0.5 halves the *rewards*; selection goes by the verifier score (1 = even)
    with RewardService(RewardsConfig(workers=1, domain_weights={"parity": 0.5})) as service:
        verified, metrics = score_groups(groups, service, tokenizer, max_len=8)
    np.testing.assert_array_equal(verified[0].scores_G, [1.0, 0.0, 0.0])
    np.testing.assert_array_equal(verified[0].rewards_G, [0.5, 0.0, 0.0])
    np.testing.assert_array_equal(verified[1].scores_G, [1.0, 0.0])
    assert metrics["reward/mean"] == pytest.approx(0.2)  # (0.5 + 0.5) / 5

    prompts, responses = expert_examples(verified, min_score=1.0)
    assert prompts == [[5, 6, 7], [5, 6, 8]]
    assert [tokenizer.decode(r) for r in responses] == ["two words", "four words are here"]
    assert expert_metrics(verified, min_score=1.0) == {
        "expert/kept": 2.0,
        "expert/kept_fraction": 0.4,
        "expert/verifier_mean": pytest.approx(0.4),
        "expert/prompts_solved": 1.0,
    }


# -- end to end through rlvr-train ------------------------------------------------------


def common_args(cfg_path: Path, out: Path, *extra: str) -> list[str]:
    return ["--config", str(cfg_path), f"train.output_dir={out}", "log.tensorboard=false", *extra]


def assert_sft_tokens(root: Path, cfg_path: Path, args: list[str], rows: list[dict]) -> None:
    """Each step trained on the response tokens of the next 4 examples of the seeded mixture."""
    cfg = load_config(cfg_path, *args[2:])
    tokenizer = load_tokenizer(root / "policy")
    examples = build_sft_iterator(cfg, tokenizer, seed=cfg.data.seed)
    for r in rows:
        batch = examples.next_batch(4)
        expected = sum(len(encode_response(e.response, tokenizer, "plain")) for e in batch)
        assert r["sft/tokens"] == expected


def final_params(out: Path):
    return models.load_pretrained(out).params


@pytest.mark.slow
def test_bad_recipe_settings_are_errors_naming_the_key(tiny, tmp_path, capsys):
    _, cfg_path = tiny
    args = common_args(cfg_path, tmp_path, "algorithm=expert_iteration", "sft.expert_min_score=0")
    assert cli.train_main(args) == 2
    assert "sft.expert_min_score must be in (0, 1]" in capsys.readouterr().err
    assert cli.train_main(common_args(cfg_path, tmp_path, "algorithm=sft", "sft.batch_size=0")) == 2
    assert "sft.batch_size must be >= 1, got 0" in capsys.readouterr().err
    cfg = load_config(cfg_path)
    with pytest.raises(ValueError, match="algorithm: unknown 'ppo'"):
        run.train(dataclasses.replace(cfg, algorithm="ppo"))


@pytest.mark.slow
def test_sft_without_responses_is_a_data_error(tiny, tmp_path, capsys):
    _, cfg_path = tiny
    assert cli.train_main(common_args(cfg_path, tmp_path, "algorithm=sft")) == 2
    # every row of data.sources lacks `response`: the error counts them by reason
    assert "no usable rows; skipped 64 of 64 rows (missing_response: 64)" in capsys.readouterr().err


@pytest.mark.slow
def test_sft_runs_and_resumes_exactly(tiny, tmp_path):
    root, cfg_path = tiny
    out = tmp_path / "sft"
    args = common_args(
        cfg_path,
        out,
        "algorithm=sft",
        f"sft.sources=[{{path: {root / 'sft.jsonl'}}}]",
        "sft.batch_size=4",
        "rollout.max_new_tokens=10",
        "train.max_steps=3",
        "checkpoint.every_steps=2",
        "checkpoint.keep=3",
        "eval.every_steps=3",
        "eval.max_prompts=2",
        "log.plots=true",
    )
    assert cli.train_main(args) == 0
    straight = read_jsonl(out / "metrics.jsonl")
    assert 0.0 <= straight[2]["eval/pass@1"] <= straight[2]["eval/pass@4"] <= 1.0
    assert [r["step"] for r in straight] == [1, 2, 3]
    assert [r["policy_version"] for r in straight] == [1, 2, 3]
    for key in (
        "loss",
        "grad_norm",
        "sft/token_accuracy",
        "time/train_s",
        "throughput/tokens_per_s",
    ):
        assert all(np.isfinite(r[key]) for r in straight), key
    assert_sft_tokens(root, cfg_path, args, straight)
    assert (out / "curves.png").is_file()
    straight_params = final_params(out / "final")

    # as if the run had died right after its checkpoint at step 2: the rerun redoes step 3
    shutil.rmtree(out / "checkpoints" / "3")
    shutil.rmtree(out / "final")
    assert cli.train_main(args) == 0
    resumed = read_jsonl(out / "metrics.jsonl")
    assert [r["step"] for r in resumed] == [1, 2, 3]
    for key in ("loss", "sft/tokens", "grad_norm", "policy_version"):
        assert resumed[2][key] == straight[2][key], key
    for a, b in zip(jax.tree.leaves(final_params(out / "final")), jax.tree.leaves(straight_params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.slow
def test_expert_iteration_runs_end_to_end(tiny, tmp_path):
    _, cfg_path = tiny
    out = tmp_path / "ei"
    args = common_args(
        cfg_path,
        out,
        "algorithm=expert_iteration",
        "sft.expert_sft_steps=2",
        "train.max_steps=2",
        "checkpoint.every_steps=0",
    )
    assert cli.train_main(args) == 0
    rows = read_jsonl(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        # word_parity is binary and unweighted: reward = verifier score, so the kept samples
        # are exactly the rewarded ones among the 2 prompts × 4 samples
        assert r["expert/kept"] == r["reward/parity"] * 8
        assert r["groups/filtered_fraction"] == 0.0 and r["staleness/mean"] == 0.0
    updated = sum(r["expert/kept"] > 0 for r in rows)
    assert updated >= 1 and "loss" in rows[0] and "sft/tokens" in rows[0]
    assert rows[-1]["policy_version"] == 2 * updated  # expert_sft_steps per round
    assert (out / "final" / "config.json").is_file()


@pytest.mark.slow
def test_parallel_averaging_runs_and_resumes_exactly(tiny, tmp_path):
    root, cfg_path = tiny
    out = tmp_path / "parallel"
    args = common_args(
        cfg_path,
        out,
        "algorithm=rl_sft_parallel",
        f"sft.sources=[{{path: {root / 'sft.jsonl'}}}]",
        "sft.batch_size=4",
        "sft.learning_rate=3.0e-4",
        "rollout.max_new_tokens=10",
        "train.max_steps=2",
        "checkpoint.every_steps=1",
        "checkpoint.keep=3",
    )
    assert cli.train_main(args) == 0
    rows = read_jsonl(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    for key in (
        "loss",
        "clip_fraction",
        "kl/sampler_learner",
        "reward/mean",
        "sft/loss",
        "sft/grad_norm",
        "parallel/rl_update_norm",
        "parallel/sft_update_norm",
        "parallel/update_cosine",
    ):
        assert key in rows[-1], key
    assert rows[-1]["policy_version"] == 2 and rows[-1]["sft/loss"] > 0
    meta = json.loads((out / "checkpoints" / "2" / "meta" / "metadata").read_text())
    assert meta["source"]["sft"]["draws"] == 8  # one SFT batch of 4 per optimizer step
    straight_params = final_params(out / "final")

    shutil.rmtree(out / "checkpoints" / "2")
    shutil.rmtree(out / "final")
    assert cli.train_main(args) == 0  # resumes from step 1 and redoes step 2
    assert [r["step"] for r in read_jsonl(out / "metrics.jsonl")] == [1, 2]
    assert json.loads((out / "checkpoints" / "2" / "meta" / "metadata").read_text()) == meta
    for a, b in zip(jax.tree.leaves(final_params(out / "final")), jax.tree.leaves(straight_params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.slow
def test_sft_and_parallel_averaging_run_with_a_token_budget(tiny, tmp_path):
    """`train.max_tokens_per_micro_batch`: `sft` packs its examples with the RL packer (the
    same response tokens trained on as one example per row) and `rl_sft_parallel` trains its
    packed RL half beside the SFT rows."""
    root, cfg_path = tiny
    budget = "train.max_tokens_per_micro_batch=214"  # two full rows of 96 + 10 + 1 tokens
    for algorithm in ("sft", "rl_sft_parallel"):
        out = tmp_path / algorithm
        args = common_args(
            cfg_path,
            out,
            f"algorithm={algorithm}",
            f"sft.sources=[{{path: {root / 'sft.jsonl'}}}]",
            "sft.batch_size=4",
            "rollout.max_new_tokens=10",
            "train.max_steps=2",
            "checkpoint.every_steps=0",
            budget,
        )
        assert cli.train_main(args) == 0
        rows = read_jsonl(out / "metrics.jsonl")
        assert [r["step"] for r in rows] == [1, 2]
        assert all(np.isfinite(r["loss"]) and np.isfinite(r["grad_norm"]) for r in rows)
        if algorithm == "sft":
            assert_sft_tokens(root, cfg_path, args, rows)
        else:
            assert rows[-1]["sft/loss"] > 0 and "parallel/update_cosine" in rows[-1]
