"""The demo's task cut, pretraining corpus, base-model bootstrap and the shipped artifacts."""

import dataclasses
import importlib.util
import json
from pathlib import Path

import jax
import numpy as np
import pytest

from rlvr_jax import models
from rlvr_jax.config.schema import Config, DataConfig, ModelConfig
from rlvr_jax.data import load_tokenizer
from rlvr_jax.data.tasks_arithmetic import parse, steps
from rlvr_jax.demo import base_model, corpus
from rlvr_jax.rewards import get_verifier
from rlvr_jax.training.sft import sft_loss

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = base_model.SHIPPED_DIR
DATA = ROOT / "data" / "demo"

TINY = dataclasses.replace(
    base_model.DEMO_RECIPE,
    problems=120,
    vocab_size=300,
    d_model=32,
    n_layers=1,
    n_heads=2,
    n_kv_heads=1,
    d_ff=64,
    steps=3,
    batch_rows=4,
    seq_len=256,
    tokenizer_documents=120,
)


# A qwen2 architecture: transformers loads a tokenizer beside a qwen2 config.json with Qwen2's
# own pre-tokenizer, so this also checks that the corpus is encoded as later loads will see it.
TINY_QWEN2 = {**TINY.hf_config(), "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"]}


def _cfg(path, *, template="plain", hf_config=None):
    return Config(
        model=ModelConfig(path=str(path), hf_config=hf_config),
        data=DataConfig(prompt_template=template),
    )


def test_worked_lines_with_a_slip_by_hand():
    tree = parse("3 + 4 * 5")
    # innermost first: 4 * 5 = 20, then 3 + 20 = 23
    assert corpus.worked_lines(tree) == (["4 * 5 = 20", "3 + 20 = 23"], 23)
    # a slip of +1 in step 0 is carried: 4 * 5 = 21, 3 + 21 = 24
    assert corpus.worked_lines(tree, 0, 1) == (["4 * 5 = 21", "3 + 21 = 24"], 24)
    assert corpus.worked_lines(tree, 1, -2) == (["4 * 5 = 20", "3 + 20 = 21"], 21)
    # left to right among innermost operations: (6 - 1) before (2 + 2)
    lines, value = corpus.worked_lines(parse("(6 - 1) * (2 + 2)"))
    assert (lines, value) == (["6 - 1 = 5", "2 + 2 = 4", "5 * 4 = 20"], 20)
    # without a slip: the lines of the reference solution (the `worked` style)
    assert lines == steps(parse("(6 - 1) * (2 + 2)"))


def test_styles_are_right_or_wrong_as_the_verifiers_say():
    rows = corpus.demo_rows("train", 80, seed=3)
    mix = corpus.StyleMix()
    rng = np.random.default_rng(0)
    wrong = {s: [] for s in ("slipped", "ignore", "misread")}
    for row in rows:
        verify = get_verifier(row["verifier"])
        if row["domain"] == "arithmetic":
            for style in ("worked", "direct"):
                text = corpus.arithmetic_response(row, style, rng, mix)
                assert verify(text, row["ground_truth"]) == 1.0, (row["prompt"], text)
            text = corpus.arithmetic_response(row, "slipped", rng, mix)
            wrong["slipped"].append(verify(text, row["ground_truth"]) == 0.0)
        else:
            text = corpus.ifeval_response(row, "follow", rng)
            assert verify(text, row["ground_truth"]) == 1.0, (row["prompt"], text)
            for style in ("ignore", "misread"):
                text = corpus.ifeval_response(row, style, rng)
                wrong[style].append(verify(text, row["ground_truth"]) == 0.0)
    # a slip can vanish (a later "* 0"); a misread keyword set can contain the right one
    for style, flags in wrong.items():
        assert len(flags) >= 25 and np.mean(flags) >= 0.85, (style, np.mean(flags))


def test_style_draws_follow_the_mix():
    rows = corpus.demo_rows("train", 40, seed=0)
    mix = corpus.StyleMix(worked=1.0, slipped=0.0, direct=3.0, follow=0.0, ignore=1.0, misread=0.0)
    rng = np.random.default_rng(1)
    drawn = [corpus.styled_response(rows[i % 40], rng, mix)[0] for i in range(4000)]
    arithmetic = [s for s in drawn if s in corpus.ARITHMETIC_STYLES]
    assert {s for s in drawn if s in corpus.IFEVAL_STYLES} == {"ignore"}
    assert set(arithmetic) == {"worked", "direct"}
    # P(direct) = 3 / (1 + 3) = 0.75; with ~2000 draws the std is ~0.01
    assert abs(arithmetic.count("direct") / len(arithmetic) - 0.75) < 0.04


def test_style_mix_rejects_bad_weights():
    with pytest.raises(ValueError, match="arithmetic weights"):
        corpus.StyleMix(worked=0.0, slipped=0.0, direct=0.0)
    with pytest.raises(ValueError, match="ifeval weights"):
        corpus.StyleMix(follow=-1.0)
    with pytest.raises(ValueError, match="max_slip"):
        corpus.StyleMix(max_slip=0)
    with pytest.raises(ValueError, match="no styles for domain 'code'"):
        corpus.StyleMix().probabilities("code")
    with pytest.raises(ValueError, match="unknown arithmetic style 'guess'"):
        corpus.arithmetic_response(
            {"expression": "1 + 2"}, "guess", np.random.default_rng(0), corpus.StyleMix()
        )


def test_packed_batches_keep_every_example_in_order():
    rng = np.random.default_rng(0)
    examples = [
        (
            rng.integers(3, 50, rng.integers(1, 20)).tolist(),
            rng.integers(3, 50, rng.integers(1, 30)).tolist(),
        )
        for _ in range(200)
    ]
    for loss_on_prompt in (False, True):
        batches = corpus.packed_batches(
            iter(examples), rows=4, seq_len=64, pad_id=0, loss_on_prompt=loss_on_prompt
        )
        seen, targets = [], 0
        for batch in batches:  # the last, partial batch is never emitted
            ids = np.concatenate([batch.input_ids_BxT, batch.target_ids_BxT[:, -1:]], axis=1)
            seg = np.concatenate([batch.segment_ids_BxT, batch.segment_ids_BxT[:, -1:]], axis=1)
            for r in range(4):
                for s in range(1, seg[r].max() + 1):
                    # the appended last column may be padding (id 0; examples use 3..49)
                    seen.append([t for t in ids[r][seg[r] == s].tolist() if t != 0])
            targets += int(batch.mask_BxT.sum())
        assert len(seen) > 150
        assert seen == [p + r for p, r in examples[: len(seen)]]
        # trained-on tokens: the response, or everything but the first token
        expect = sum(
            len(r) + (len(p) - 1 if loss_on_prompt else 0) for p, r in examples[: len(seen)]
        )
        assert targets == expect


def test_shipped_splits_come_from_the_documented_command():
    # python -m rlvr_jax.demo.corpus --out data/demo --train 2000 --test 256 (seed 0)
    for split, n in (("train", 2000), ("test", 256)):
        lines = (DATA / f"{split}.jsonl").read_text(encoding="utf-8").splitlines()
        assert [json.loads(line) for line in lines] == corpus.demo_rows(split, n, seed=0)
    total = sum((DATA / f"{s}.jsonl").stat().st_size for s in ("train", "test"))
    assert total <= 2 * 2**20
    train = {json.loads(line)["prompt"] for line in (DATA / "train.jsonl").open()}
    test = {json.loads(line)["prompt"] for line in (DATA / "test.jsonl").open()}
    assert not train & test


def test_demo_problems_fit_the_generation_budget():
    # every held-out prompt within the demo's data.max_prompt_len, and every style's answer
    # (separator and EOS included) within its rollout.max_new_tokens, so that a correct answer
    # is never cut off
    from rlvr_jax import config

    demo = config.load(ROOT / "configs" / "demo.yaml")
    tokenizer = load_tokenizer(SHIPPED)
    rows = [json.loads(line) for line in (DATA / "test.jsonl").open()]
    prompt_lengths = [len(corpus.encode_prompt(r, tokenizer, "plain")) for r in rows]
    assert max(prompt_lengths) <= demo.data.max_prompt_len
    budget = demo.rollout.max_new_tokens
    rng = np.random.default_rng(0)
    for row in rows:
        # the correct styles (a wrong answer cut short stays wrong)
        styles = ("worked", "direct") if row["domain"] == "arithmetic" else ("follow",)
        for style in styles:
            text = (
                corpus.arithmetic_response(row, style, rng, corpus.StyleMix())
                if row["domain"] == "arithmetic"
                else corpus.ifeval_response(row, style, rng)
            )
            assert len(corpus.encode_response(text, tokenizer, "plain")) <= budget, text


def test_recipe_json_round_trip_and_validation():
    recipe = dataclasses.replace(TINY, styles=corpus.StyleMix(worked=0.7))
    assert base_model.PretrainRecipe.from_json(json.loads(json.dumps(recipe.to_json()))) == recipe
    with pytest.raises(ValueError, match=r"unknown keys \['width'\]"):
        base_model.PretrainRecipe.from_json({"width": 3})
    with pytest.raises(ValueError, match="template must be one of"):
        dataclasses.replace(TINY, template="alpaca")
    with pytest.raises(ValueError, match="d_model=30 is not a multiple of n_heads=4"):
        dataclasses.replace(TINY, d_model=30, n_heads=4)
    with pytest.raises(ValueError, match="steps must be >= 1"):
        dataclasses.replace(TINY, steps=0)


def test_packed_batches_reject_a_document_longer_than_a_row():
    batches = corpus.packed_batches(
        iter([([1] * 10, [2] * 7)]), rows=2, seq_len=16, pad_id=0, loss_on_prompt=True
    )
    with pytest.raises(ValueError, match="a corpus document has 17 tokens > seq_len 16"):
        next(batches)


@pytest.fixture(scope="module")
def tiny_base(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny") / "base"
    cfg = _cfg(path, hf_config=TINY_QWEN2)
    assert base_model.build_demo_base(path, cfg, recipe=TINY, shipped_dir=None) == path
    return path


def _check_tokenizer_probe(path):
    probe = json.loads((path / base_model.RECIPE_FILE).read_text())["tokenizer_probe"]
    assert probe["text"] == base_model.TOKENIZER_PROBE
    assert load_tokenizer(path).encode(probe["text"]) == probe["ids"]


@pytest.mark.slow
def test_build_demo_base_pretrains_a_loadable_model(tiny_base):
    model = models.load_pretrained(tiny_base)
    tokenizer = load_tokenizer(tiny_base)
    assert model.config.arch == "qwen2"
    assert model.config.d_model == 32 and model.config.n_layers == 1
    assert model.config.vocab_size == 300 >= len(tokenizer)
    assert model.config.eos_token_id == (tokenizer.eos_token_id,)
    assert model.config.pad_token_id == tokenizer.pad_token_id
    report = json.loads((tiny_base / base_model.RECIPE_FILE).read_text())
    assert base_model.PretrainRecipe.from_json(report["recipe"]) == TINY
    assert report["n_params"] == model.config.n_params()
    assert report["skipped_steps"] == 0 and np.isfinite(report["final_loss"])
    assert report["tokens_trained"] > 3 * 4 * 128  # 3 steps of 4 rows, rows over half full
    _check_tokenizer_probe(tiny_base)


@pytest.mark.slow
def test_build_demo_base_copies_a_fitting_shipped_model(tiny_base, tmp_path):
    shipped_config = json.loads((tiny_base / "config.json").read_text())
    cfg = _cfg(tmp_path / "copy", hf_config={"model_type": "qwen2", "hidden_size": 32})
    assert base_model.shipped_mismatch(tiny_base, cfg) is None
    base_model.build_demo_base(tmp_path / "copy", cfg, shipped_dir=tiny_base)
    for item in tiny_base.iterdir():
        assert (tmp_path / "copy" / item.name).read_bytes() == item.read_bytes(), item.name
    assert json.loads((tmp_path / "copy" / "config.json").read_text()) == shipped_config


def test_shipped_mismatch_names_the_reason(tmp_path):
    assert "no shipped base model" in base_model.shipped_mismatch(tmp_path, _cfg(tmp_path))
    assert base_model.shipped_mismatch(SHIPPED, _cfg(tmp_path)) is None
    reason = base_model.shipped_mismatch(SHIPPED, _cfg(tmp_path, template="chat"))
    assert "prompt template 'plain'" in reason and "'chat'" in reason
    reason = base_model.shipped_mismatch(SHIPPED, _cfg(tmp_path, hf_config={"hidden_size": 7}))
    assert "['hidden_size']" in reason


def test_shipped_model_loads_records_its_recipe_and_has_learned_the_corpus():
    model = models.load_pretrained(SHIPPED)
    tokenizer = load_tokenizer(SHIPPED)
    recipe_md = (SHIPPED / "RECIPE.md").read_text()
    report = json.loads((SHIPPED / base_model.RECIPE_FILE).read_text())
    assert f"seed: {base_model.DEMO_RECIPE.seed}" in recipe_md
    assert "python scripts/pretrain_tiny.py --out rlvr_jax/demo/assets/base" in recipe_md
    assert report["command"] in recipe_md
    assert base_model.PretrainRecipe.from_json(report["recipe"]) == base_model.DEMO_RECIPE
    assert model.config == models.ArchConfig.from_hf(report["hf_config"])
    assert model.config.eos_token_id == (tokenizer.eos_token_id,)
    _check_tokenizer_probe(SHIPPED)
    # held-out problems answered in the corpus's correct styles: far below the ln 512 = 6.2
    # nats of an untrained model
    rows = [json.loads(line) for line in (DATA / "test.jsonl").open()][:16]
    rng = np.random.default_rng(0)
    prompts = [corpus.encode_prompt(r, tokenizer, "plain") for r in rows]
    responses = [
        corpus.encode_response(
            corpus.arithmetic_response(r, "worked", rng, corpus.StyleMix())
            if r["domain"] == "arithmetic"
            else corpus.ifeval_response(r, "follow", rng),
            tokenizer,
            "plain",
        )
        for r in rows
    ]
    from rlvr_jax.training.sft import collate_sft

    batch = collate_sft(prompts, responses, rows=16, seq_len=128, pad_id=tokenizer.pad_token_id)
    loss, metrics = jax.jit(sft_loss, static_argnums=1)(model.params, model.config, batch)
    assert float(loss) < 1.0 and float(metrics["sft/token_accuracy"]) > 0.7


def _script():
    spec = importlib.util.spec_from_file_location(
        "pretrain_tiny", ROOT / "scripts" / "pretrain_tiny.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_script_overrides_parse_into_the_recipe():
    script = _script()
    recipe = script.recipe_with_overrides(["steps=7", "styles.worked=0.9", "loss_on_prompt=false"])
    assert recipe == dataclasses.replace(
        base_model.DEMO_RECIPE, steps=7, loss_on_prompt=False, styles=corpus.StyleMix(worked=0.9)
    )
    for bad, message in (
        ("steps", "key=value"),
        ("depth=3", "unknown recipe key 'depth'"),
        ("styles.guess=1", "unknown key 'styles.guess'"),
        ("steps=0", "steps must be >= 1"),
    ):
        with pytest.raises(SystemExit, match=message):
            script.recipe_with_overrides([bad])


@pytest.mark.slow
def test_script_pretrains_evaluates_and_writes_recipe_md(tmp_path):
    out = tmp_path / "base"
    sets = [f"--set={k}={v}" for k, v in dataclasses.asdict(TINY).items() if k not in ("styles",)]
    argv = [
        "--out",
        str(out),
        *sets,
        "--eval-prompts",
        "3",
        "--eval-samples",
        "2",
        "--eval-data",
        str(DATA / "test.jsonl"),
    ]
    assert _script().main(argv) == 0
    report = json.loads((out / base_model.RECIPE_FILE).read_text())
    evaluation = report["evaluation"]
    assert evaluation["prompts"] == 3.0 and evaluation["n"] == 2
    assert 0.0 <= evaluation["pass@1"] <= evaluation["pass@2"] <= 1.0
    md = (out / "RECIPE.md").read_text()
    assert "seed: 0" in md and report["command"] in md and "| all |" in md
    assert models.load_pretrained(out).config.d_model == 32
