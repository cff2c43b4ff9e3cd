"""Multi-turn token ids stay exact across turns: what the learner trains on is, token for token,
the prompt, what the engine decoded and what the environment appended — never a re-rendering
or re-tokenization of the conversation. Checked for ChatML (append-only) and for Qwen3's chat
template, which is not append-only: it drops the reasoning of assistant turns before the last
user query and gives the last assistant turn an empty `<think>` block, so re-rendering a
finished conversation does not give back the tokens the model saw (a recurring bug in peers).

- host side, fast: an episode driven with scripted turns that hold `<think>` reasoning, its
  appended ids hand-derived from each template, through the learner's `build_batch`;
- end to end, slow: `rlvr-train` RL steps with a multi-turn environment on a tiny random policy,
  every learner batch captured and compared with every turn the engine ran."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from rlvr_jax.config.schema import EnvConfig
from rlvr_jax.envs import EnvRunner, Step

QWEN3_TEMPLATE = (Path(__file__).parent / "data" / "qwen3_chat_template.jinja").read_text()
"""The chat template of Qwen3's tokenizer_config.json (Qwen/Qwen3-0.6B), verbatim."""
EOS = "<|im_end|>"


class Talk:
    """A conversation environment: each assistant turn is answered with a user turn
    `Go on (k).` until the third, which ends it (observations are user messages, so under
    Qwen3's template every earlier assistant turn falls before the last user query)."""

    tools: list = []

    def __init__(self, turns: int = 3):
        self.turns, self.k = turns, 0

    def reset(self, row):
        return [{"role": "user", "content": row["prompt"]}]

    def step(self, text: str) -> Step:
        self.k += 1
        if self.k >= self.turns:
            return Step(None, 0.0, True, {})
        return Step([{"role": "user", "content": f"Go on ({self.k})."}], 0.0, False, {})


def with_template(tokenizer, template: str | None):
    if template is not None:
        tokenizer.chat_template = template
    return tokenizer


def expected_append(k: int, stopped_on_eos: bool) -> str:
    """The text appended after assistant turn k under both templates, derived by hand: the
    turn's end (unless the model sampled it), the user turn, the next turn's opener."""
    return ("" if stopped_on_eos else EOS) + (
        f"\n<|im_start|>user\nGo on ({k}).{EOS}\n<|im_start|>assistant\n"
    )


def check_batch(batch, slots, groups, turns_of) -> int:
    """Every completion of `groups` in the learner batch (any layout: one sequence per row,
    packed, or shared-prompt rows): its prompt, then each token the learner predicts at the
    position it had in the engine — the engine's sampled tokens trained, each turn's appended
    ids untrained, exactly where the engine put them. Returns the appended spans checked."""
    inputs = np.asarray(batch.tokens.input_ids_BxT).reshape(-1)
    targets = np.asarray(batch.tokens.target_ids_BxT).reshape(-1)
    positions = np.asarray(batch.tokens.positions_BxT).reshape(-1)
    shared = batch.targets_BxT is not None  # per-slot arrays hold the completion alone
    checked, n = 0, 0
    for g in groups:
        prompt = list(g.prompt_tokens)
        for c in g.completions:
            b = int(slots[n])
            n += 1
            first = 0 if shared else len(prompt) - 1  # slot index of completion token 0
            where = np.asarray(batch.gather_BxT[b, first : first + len(c.tokens)])
            p0 = int(where[0])
            assert inputs[p0 - len(prompt) + 1 : p0 + 1].tolist() == prompt
            assert inputs[where].tolist() == [prompt[-1], *c.tokens[:-1]]
            assert positions[where].tolist() == list(
                range(len(prompt) - 1, len(prompt) - 1 + len(c.tokens))
            )
            predicted = batch.targets_BxT[b, : len(c.tokens)] if shared else targets[where]
            assert np.asarray(predicted).tolist() == list(c.tokens)
            mask = np.asarray(batch.mask_BxT[b, first : first + len(c.tokens)])
            sampled = np.ones(len(c.tokens)) if c.sampled is None else np.asarray(c.sampled)
            assert (mask > 0).tolist() == (sampled > 0).tolist()
            assert np.asarray(batch.mask_BxT[b]).sum() == mask.sum()
            # the engine's side: each turn saw the sequence so far, the appended ids sit
            # right after it, exactly where the completion marks tokens as not sampled
            cursor = 0
            for tokens, appended in turns_of(c):
                assert c.tokens[: len(tokens)] == tokens
                assert all(sampled[cursor : len(tokens)])
                if appended is not None:
                    span = c.tokens[len(tokens) : len(tokens) + len(appended)]
                    assert span == appended
                    assert not any(sampled[len(tokens) : len(tokens) + len(appended)])
                    checked += 1
                    cursor = len(tokens) + len(appended)
    return checked


@pytest.mark.parametrize("template", ["chatml", "qwen3"])
def test_scripted_reasoning_turns_reach_the_learner_exactly(tiny_tokenizer_dir, template):
    from rlvr_jax.data import load_tokenizer
    from rlvr_jax.losses import resolve_loss_settings
    from rlvr_jax.rollout import Completion
    from rlvr_jax.training.groups import ScoredGroup, build_batch

    qwen3 = template == "qwen3"
    tok = with_template(load_tokenizer(tiny_tokenizer_dir), QWEN3_TEMPLATE if qwen3 else None)
    eos = tok.convert_tokens_to_ids(EOS)
    runner = EnvRunner(
        EnvConfig(name="test_turn_tokens:Talk", max_turns=4),
        tok,
        max_new_tokens=400,
        stop_token_ids=[eos],
    )
    texts = ["<think>\nadd the two</think>\n\nIt is 4.", "<think>so 5</think>5", "Done: 6."]
    try:
        group = runner.group({"prompt": "What is 2 + 2?", "index": 0})
        tokens: list[int] = []
        turns = []
        for k, text in enumerate(texts, start=1):
            tokens = [*tokens, *tok.encode(text, add_special_tokens=False), eos]
            appended = group.next_turn(0, list(tokens), "stop").result()
            turns.append((list(tokens), appended))
            if appended is None:
                break
            assert tok.decode(appended) == expected_append(k, stopped_on_eos=True)
            assert appended == tok.encode(expected_append(k, True), add_special_tokens=False)
            tokens = [*tokens, *appended]
        record = group.episode(0)
    finally:
        runner.close()
    assert [t[1] is None for t in turns] == [False, False, True] and record.turns == 3
    # the template is append-only (ChatML) or not (Qwen3): re-rendering the finished
    # conversation gives the engine's text back, or drops the first turns' reasoning
    rendered = tok.apply_chat_template(record.messages, tokenize=False)
    engine_text = tok.decode([*group.prompt_ids, *tokens]) + "\n"  # the template's last "\n"
    if not qwen3:
        assert rendered == engine_text
    else:
        assert rendered != engine_text and "add the two" not in rendered
        assert "add the two" in engine_text
    sampled = [True] * len(tokens)
    for seen, appended in turns[:-1]:
        sampled[len(seen) : len(seen) + len(appended)] = [False] * len(appended)
    completion = Completion(0, 0, list(tokens), [0.0] * len(tokens), "stop",
                            [0] * len(tokens), sampled=sampled, episode=record)  # fmt: skip
    g = ScoredGroup(
        row=None,
        prompt_tokens=list(group.prompt_ids),
        completions=[completion, completion],
        rewards_G=np.array([1.0, 0.0], np.float32),
        scores_G=np.array([1.0, 0.0], np.float32),
        domain="talk",
        texts=["", ""],
        request_id="r",
    )
    settings = resolve_loss_settings("olmo3")
    batch, slots = build_batch([g], settings, rows=2, seq_len=512, pad_id=tok.pad_token_id)
    assert check_batch(batch, slots, [g], lambda c: turns) == 4  # 2 completions x 2 responses


@pytest.mark.slow
@pytest.mark.parametrize("template", ["chatml", "qwen3"])
def test_rl_batches_hold_the_engines_turns_exactly(tmp_path, monkeypatch, template):
    from helpers_train import tiny_run

    from rlvr_jax import cli
    from rlvr_jax.envs import episode
    from rlvr_jax.training.algorithms import rl

    cfg = tiny_run(tmp_path)
    policy = tmp_path / "policy"
    config = policy / "config.json"  # room for three turns (RoPE: no weights change)
    config.write_text(
        json.dumps({**json.loads(config.read_text()), "max_position_embeddings": 512})
    )
    if template == "qwen3":
        tc = policy / "tokenizer_config.json"
        tc.write_text(json.dumps({**json.loads(tc.read_text()), "chat_template": QWEN3_TEMPLATE}))

    turns: dict[int, list] = {}  # id(EpisodeRecord) -> [(tokens at the turn's end, appended)]
    real_turn = episode.EnvGroup._turn

    def record_turn(self, sample_index, tokens, finish_reason):
        appended = real_turn(self, sample_index, tokens, finish_reason)
        rec = self.episode(sample_index)
        turns.setdefault(id(rec), []).append((list(tokens), appended))
        return appended

    batches = []
    real_build = rl.build_batch

    def capture(groups, *args, **kwargs):
        batch, slots = real_build(groups, *args, **kwargs)
        batches.append((list(groups), batch, slots))
        return batch, slots

    monkeypatch.setattr(episode.EnvGroup, "_turn", record_turn)
    monkeypatch.setattr(rl, "build_batch", capture)
    args = [
        "--config", str(cfg), "train.max_steps=2", "rollout.max_new_tokens=96",
        "data.max_prompt_len=160", "env.name=test_turn_tokens:Talk", "env.max_turns=4",
        # frequent single-token stops: a random policy's turns end before the budget
        "rollout.stop_strings=[e, t, a, o, ' ']",
    ]  # fmt: skip
    assert cli.train_main(args) == 0
    from rlvr_jax.data import load_tokenizer

    tok = load_tokenizer(policy)
    eos = tok.convert_tokens_to_ids(EOS)
    appended_spans = 0
    for groups, batch, slots in batches:
        appended_spans += check_batch(batch, slots, groups, lambda c: turns[id(c.episode)])
        for g in groups:
            for c in g.completions:
                for k, (seen, appended) in enumerate(turns[id(c.episode)], start=1):
                    if appended is not None:  # the template's tail, derived by hand
                        stopped_on_eos = seen[-1] == eos
                        assert tok.decode(appended) == expected_append(k, stopped_on_eos)
    assert len(batches) == 2 and appended_spans > 0
