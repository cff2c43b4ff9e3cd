"""The weighted mixture: weights, per-epoch shuffles, determinism and exact resume."""

import collections
import json

import pytest

from rlvr_jax.config.schema import DataConfig, SourceConfig
from rlvr_jax.data import synthetic
from rlvr_jax.data.mixture import PromptIterator, build_prompt_iterator, load_eval_rows
from rlvr_jax.data.rows import DataError, PromptRow
from rlvr_jax.data.sources import PromptSource, load_sources


def make_source(name: str, n: int, weight: float = 1.0) -> PromptSource:
    rows = tuple(PromptRow(f"{name}-{i}", "1", "math", "math", {}, name, i) for i in range(n))
    return PromptSource(name, rows, weight)


def keys(rows):
    return [(r.source, r.index) for r in rows]


def test_weights_statistical():
    it = PromptIterator(
        [make_source("a", 50, 5.0), make_source("b", 30, 3.0), make_source("c", 20, 2.0)], seed=1
    )
    counts = collections.Counter(r.source for r in it.next_batch(6000))
    # Expected p = 0.5 / 0.3 / 0.2; sd = sqrt(p (1 - p) / 6000) = 0.00645 / 0.00592 / 0.00516.
    for name, p, sd in (("a", 0.5, 0.00645), ("b", 0.3, 0.00592), ("c", 0.2, 0.00516)):
        assert abs(counts[name] / 6000 - p) < 4 * sd, (name, counts)
    assert it.probs.tolist() == pytest.approx([0.5, 0.3, 0.2])


def test_zero_weight_source_is_never_drawn():
    it = PromptIterator([make_source("a", 5, 1.0), make_source("z", 5, 0.0)], seed=0)
    assert {r.source for r in it.next_batch(500)} == {"a"}


def test_each_epoch_is_a_permutation_of_each_source():
    it = PromptIterator([make_source("a", 7, 2.0), make_source("b", 4, 1.0)], seed=3)
    per_source = collections.defaultdict(list)
    for row in it.next_batch(300):
        per_source[row.source].append(row.index)
    for name, size in (("a", 7), ("b", 4)):
        seq = per_source[name]
        epochs = [seq[i : i + size] for i in range(0, len(seq) - size + 1, size)]
        assert len(epochs) >= 10
        assert all(sorted(e) == list(range(size)) for e in epochs)
        assert len({tuple(e) for e in epochs}) > 1  # reshuffled between epochs


def test_deterministic_and_seeded():
    make = lambda seed: PromptIterator([make_source("a", 9), make_source("b", 6)], seed=seed)
    assert keys(make(0).next_batch(40)) == keys(make(0).next_batch(40))
    assert keys(make(0).next_batch(40)) != keys(make(1).next_batch(40))
    # Batch boundaries do not matter: 40 in one call == 4 calls of 10.
    it = make(0)
    in_chunks = [row for _ in range(4) for row in it.next_batch(10)]
    assert keys(in_chunks) == keys(make(0).next_batch(40))


def write_source(path, n, tag):
    rows = [
        {"prompt": f"{tag} question {i}", "ground_truth": str(i), "verifier": "math"}
        for i in range(n)
    ]
    synthetic.write_jsonl(rows, path)
    return SourceConfig(path=str(path), weight=1.0 if tag == "x" else 2.0)


def test_resume_continues_with_the_next_unseen_prompt(tmp_path):
    cfgs = [write_source(tmp_path / "x.jsonl", 6, "x"), write_source(tmp_path / "y.jsonl", 4, "y")]
    it = PromptIterator(load_sources(cfgs), seed=7)
    it.next_batch(10)
    saved = json.loads(json.dumps(it.state()))  # JSON-serialisable
    expected = it.next_batch(5)
    fresh = PromptIterator(load_sources(cfgs), seed=7)  # a fresh process would do this
    fresh.restore(saved)
    assert [r.prompt for r in fresh.next_batch(5)] == [r.prompt for r in expected]
    assert fresh.state() == it.state()
    assert len(json.dumps(saved)) < 200  # just counters


def test_state_contents_and_resume_at_an_epoch_boundary():
    it = PromptIterator([make_source("a", 3)], seed=0)
    it.next_batch(3)  # exactly one epoch
    state = it.state()
    assert state == {
        "version": 1,
        "seed": 0,
        "draws": 3,
        "sources": {"a": {"size": 3, "epoch": 0, "cursor": 3}},
    }
    expected = keys(it.next_batch(7))
    fresh = PromptIterator([make_source("a", 3)], seed=0)
    fresh.restore(state)
    assert keys(fresh.next_batch(7)) == expected
    assert fresh.state()["sources"]["a"] == {
        "size": 3,
        "epoch": 3,
        "cursor": 1,
    }  # 3 + 7 = 10 = 3*3 + 1


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda s: s.update(seed=5), "seed"),
        (lambda s: s.update(version=9), "version"),
        (lambda s: s["sources"].pop("b"), "sources"),
        (lambda s: s["sources"]["b"].update(size=99), "had 99 rows"),
        (lambda s: s["sources"]["b"].update(cursor=50), "epoch/cursor"),
    ],
)
def test_restore_rejects_mismatched_state(change, match):
    it = PromptIterator([make_source("a", 5), make_source("b", 4)], seed=0)
    it.next_batch(3)
    state = json.loads(json.dumps(it.state()))
    change(state)
    with pytest.raises(ValueError, match=match):
        PromptIterator([make_source("a", 5), make_source("b", 4)], seed=0).restore(state)


def test_bad_iterator_arguments():
    with pytest.raises(DataError, match="at least one source"):
        PromptIterator([])
    with pytest.raises(DataError, match="distinct"):
        PromptIterator([make_source("a", 2), make_source("a", 3)])
    with pytest.raises(DataError, match="positive sum"):
        PromptIterator([make_source("a", 2, 0.0)])
    with pytest.raises(DataError, match="weight must be >= 0"):
        make_source("a", 2, -1.0)
    with pytest.raises(ValueError, match="n >= 0"):
        PromptIterator([make_source("a", 2)]).next_batch(-1)


@pytest.mark.smoke("data")
def test_build_from_config_with_length_filter(tmp_path, tiny_tokenizer):
    rows = [{"prompt": "short " * k, "ground_truth": "1", "verifier": "math"} for k in (2, 200, 3)]
    synthetic.write_jsonl(rows, tmp_path / "p.jsonl")
    synthetic.write_jsonl(synthetic.generate("test", 6, seed=0), tmp_path / "held.jsonl")
    tok = tiny_tokenizer
    cfg = DataConfig(
        sources=[SourceConfig(path=str(tmp_path / "p.jsonl"))],
        eval_sources=[SourceConfig(path=str(tmp_path / "held.jsonl"))],
        prompt_template="plain",
        max_prompt_len=50,
        seed=4,
    )
    it = build_prompt_iterator(cfg, tokenizer=tok, known_verifiers={"math", "ifeval"})
    assert it.seed == 4 and [r.index for r in it.sources[0].rows] == [0, 2]
    assert it.sources[0].skipped == {"too_long": 1}
    held = load_eval_rows(cfg, known_verifiers={"math", "ifeval"})
    assert [r.index for r in held] == list(range(6)) and {r.source for r in held} == {"held"}
    with pytest.raises(DataError, match=r"data\.sources is empty"):
        build_prompt_iterator(DataConfig())
