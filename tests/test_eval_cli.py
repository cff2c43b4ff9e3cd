"""`rlvr-eval`: the pass@k report against hand-derived numbers, few-shot prompts, argument
errors, and the CLI end to end on a tiny random policy, checked against an independent count
from `rollout.generate` and `math.comb`."""

import json
from math import comb
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from rlvr_jax.data import DataError, format_prompt, row_from_record, synthetic
from rlvr_jax.eval import fewshot
from rlvr_jax.eval.cli import EvalRequest, main
from rlvr_jax.eval.evaluate import format_pass_at_k_table, pass_at_k_report


def byte_sum_below(response: str, ground_truth, **_) -> float:
    """Test verifier: 1 when the response's UTF-8 byte sum mod 8 is below `ground_truth`
    (a random policy solves a row with ground truth t about t/8 of the time)."""
    return float(sum(response.encode("utf-8")) % 8 < int(ground_truth))


VERIFIER = f"{__name__}:byte_sum_below"


# -- the sampling mesh -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "num_devices, actor_devices, expected",
    [(1, 0, [0]), (0, 0, list(range(8))), (4, 0, [0, 1, 2, 3]), (4, 1, [3]), (0, 2, [6, 7])],
)
def test_actor_mesh_takes_the_run_s_devices(num_devices, actor_devices, expected):
    # rlvr-eval, rlvr-filter and the experiments sample on the devices a training run of the
    # same config would use (the first mesh.num_devices; the actors' share of them), not on
    # every device present: a `num_devices: 1` config sampled on all 8 simulated devices before
    import jax

    from rlvr_jax.config.schema import MeshConfig
    from rlvr_jax.eval.evaluate import actor_mesh

    cfg = SimpleNamespace(mesh=MeshConfig(num_devices=num_devices, actor_devices=actor_devices))
    assert len(jax.devices()) == 8
    assert [d.id for d in actor_mesh(cfg).devices.flat] == expected


# -- the pass@k report ----------------------------------------------------------------------


def test_pass_at_k_report_hand_derived():
    # n = 4; counts 0, 1, 4; pass@k = 1 - C(n-c, k) / C(n, k) per prompt:
    #   k=1: 0, 1/4, 1                      -> mean 1.25/3
    #   k=2: 0, 1 - C(3,2)/C(4,2) = 1/2, 1  -> mean 1.5/3
    #   k=4: 0, 1 - C(3,4)/C(4,4) = 1, 1    -> mean 2/3
    # domain a = counts 0, 1: k=1 1/8, k=2 1/4, k=4 1/2; domain b = count 4: 1, 1, 1
    report = pass_at_k_report(np.array([0, 1, 4]), ["a", "a", "b"], 4, [1, 2, 4])
    assert report["pass@k"] == pytest.approx({"1": 1.25 / 3, "2": 0.5, "4": 2 / 3})
    assert report["per_domain"]["a"] == pytest.approx({"1": 0.125, "2": 0.25, "4": 0.5})
    assert report["per_domain"]["b"] == pytest.approx({"1": 1.0, "2": 1.0, "4": 1.0})
    table = format_pass_at_k_table(report, {"a": 2, "b": 1})
    lines = table.splitlines()
    assert lines[0].split() == ["domain", "prompts", "pass@1", "pass@2", "pass@4"]
    assert lines[2].split() == ["a", "2", "0.1250", "0.2500", "0.5000"]
    assert lines[-1].split() == ["all", "3", "0.4167", "0.5000", "0.6667"]


def test_pass_at_k_report_rejects_bad_input():
    with pytest.raises(ValueError, match=r"k=\[8\] needs 1 <= k <= n=4"):
        pass_at_k_report(np.array([1]), ["a"], 4, [1, 8])
    with pytest.raises(ValueError, match="no prompts"):
        pass_at_k_report(np.array([], np.int64), [], 4, [1])
    with pytest.raises(ValueError, match="2 counts but 1 domains"):
        pass_at_k_report(np.array([1, 2]), ["a"], 4, [1])


# -- few-shot examples ----------------------------------------------------------------------


def shot(prompt: str, domain: str, **extra) -> dict:
    return {"prompt": prompt, "verifier": "math", "ground_truth": "1", "domain": domain, **extra}


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_fewshot_pool_solutions_and_skips(tmp_path):
    arith = synthetic.generate("train", 1, domains=["arithmetic"])[0]
    rows = [
        shot("Q1", "x", solution="A1"),
        shot("Q2", "x", response="A2"),
        shot("Q3", "x", solution="   ", response="A3"),  # blank solution: the response
        arith,  # synthetic: its reference response
        shot("Q5", "x"),  # no solution
        {"prompt": "Q6", "solution": "A6"},  # the row loader rejects it (no verifier)
    ]
    pool = fewshot.load_fewshot_pool(str(write_jsonl(tmp_path / "s.jsonl", rows)), seed=0)
    solutions = {e.turns[0][1]: e.solution for e in pool.examples}
    assert solutions == {
        "Q1": "A1",
        "Q2": "A2",
        "Q3": "A3",
        arith["prompt"]: synthetic.reference_response(arith),
    }
    assert pool.skipped == {"no_solution": 1, "missing_field": 1}
    # the order is a permutation fixed by the seed
    again = fewshot.load_fewshot_pool(str(tmp_path / "s.jsonl"), seed=0)
    assert again.examples == pool.examples
    orders = {
        tuple(
            e.turns for e in fewshot.load_fewshot_pool(str(tmp_path / "s.jsonl"), seed=s).examples
        )
        for s in range(8)
    }
    assert len(orders) > 1  # other seeds, other orders of the same examples
    assert all(sorted(o) == sorted(e.turns for e in pool.examples) for o in orders)


def test_fewshot_selection_prefers_domain_and_skips_self(tmp_path):
    rows = [shot(f"X{i}", "x", solution=f"x{i}") for i in range(3)]
    rows += [shot(f"Y{i}", "y", solution=f"y{i}") for i in range(2)]
    pool = fewshot.load_fewshot_pool(str(write_jsonl(tmp_path / "s.jsonl", rows)), seed=1)
    x_order = [e.solution for e in pool.examples if e.domain == "x"]
    y_order = [e.solution for e in pool.examples if e.domain == "y"]
    target = row_from_record(shot("X1", "x"), source="t", index=7, where="t")
    picked = [e.solution for e in pool.for_row(target, 4)]
    own_domain = [s for s in x_order if s != "x1"]  # its own prompt is never an example
    assert picked == own_domain + y_order[:2]
    with pytest.raises(ValueError, match=r"4 usable examples.*'t' row 7; 5 were asked"):
        pool.for_row(target, 5)


def test_with_fewshot_renders_turns_under_each_template(tmp_path):
    pool = fewshot.load_fewshot_pool(
        str(write_jsonl(tmp_path / "s.jsonl", [shot("Q1", "x", solution="A1")])), seed=0
    )
    target = row_from_record(
        {
            "prompt": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Q"},
            ],
            "verifier": "math",
            "ground_truth": "2",
            "domain": "x",
        },
        source="t",
        index=0,
        where="t",
    )
    row = fewshot.with_fewshot(target, pool.for_row(target, 1))
    assert row.messages() == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Q1"},
        {"role": "assistant", "content": "A1"},
        {"role": "user", "content": "Q"},
    ]
    assert (row.ground_truth, row.domain, row.index) == ("2", "x", 0)

    class Chars:  # a tokenizer that spells the text, to read the template's rendering back
        def encode(self, text, add_special_tokens=True):
            return [ord(c) for c in text]

    def text(template):
        return "".join(map(chr, format_prompt(row, Chars(), template)))

    assert text("plain") == "Be brief.\n\nQ1\n\nA1\n\nQ"
    assert text("r1").endswith("Be brief.\nUser: Q1\nAssistant: A1\nUser: Q\nAssistant:")
    assert fewshot.with_fewshot(target, []) is target


def test_fewshot_source_errors(tmp_path):
    with pytest.raises(DataError, match=r"not found.*nope\.jsonl"):
        fewshot.load_fewshot_pool(str(tmp_path / "nope.jsonl"), seed=0)
    path = write_jsonl(tmp_path / "unsolved.jsonl", [shot("Q", "x")])
    with pytest.raises(DataError, match=r"unsolved\.jsonl.*no solved example.*no_solution: 1"):
        fewshot.load_fewshot_pool(str(path), seed=0)


# -- command-line errors: exit 2, message naming the problem ----------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--ks", "1", "8", "--samples", "4"], "--samples 4 is smaller than the largest k (8)"),
        (["--ks", "0", "1"], "--ks must be integers >= 1"),
        (["--fewshot", "2"], "--fewshot N needs --fewshot-source FILE"),
        (["--fewshot-source", "s.jsonl"], "--fewshot-source is given but --fewshot is 0"),
        (["--max-prompts", "0"], "--max-prompts must be >= 1"),
        (["--temperature", "-1"], "--temperature must be >= 0"),
        (["--input", "missing.jsonl"], "--input file not found: 'missing.jsonl'"),
        (["--input", "a.jsonl", "--split", "train"], "not allowed with argument"),
        (["--split", "dev"], "invalid choice: 'dev'"),
        (["--ks", "one"], "invalid int value: 'one'"),
        ([], "give --config FILE"),
    ],
)
def test_bad_arguments_exit_2(capsys, argv, message):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_overrides_after_a_list_option_are_not_read_as_its_values(tmp_path, capsys):
    from rlvr_jax.eval.cli_common import overrides_last

    argv = ["--ks", "1", "4", "env.name=tools", "seed=3", "--json", "eval=1.json", "algorithm=rl"]
    assert overrides_last(argv) == [
        "--ks", "1", "4", "--json", "eval=1.json", "--", "env.name=tools", "seed=3",
        "algorithm=rl",
    ]  # fmt: skip
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"model: {{path: {tmp_path / 'absent'}}}\n")
    # the override reaches the config (its typo is named), --ks keeps its two values
    assert main(["--config", str(cfg), "--ks", "1", "4", "eval.temprature=1"]) == 2
    err = capsys.readouterr().err
    assert "unknown key 'eval.temprature'" in err and "invalid int" not in err


def test_a_run_directory_is_not_a_policy_and_the_error_says_what_is(tmp_path, capsys):
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    assert main(["--model", str(tmp_path / "run"), "--input", __file__]) == 2
    err = capsys.readouterr().err
    assert "has no config.json" in err and "checkpoints/<step>" in err and "rlvr-export" in err


def test_console_entry_point_is_wired(capsys):
    from rlvr_jax import cli

    assert cli.eval_main(["--ks", "0"]) == 2
    assert "--ks must be integers >= 1" in capsys.readouterr().err


def test_config_problems_exit_2(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"model: {{path: {tmp_path / 'absent'}}}\neval: {{temprature: 1.0}}\n")
    assert main(["--config", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "eval.temprature" in err and "eval.temperature" in err
    cfg.write_text(f"model: {{path: {tmp_path / 'absent'}}}\n")
    assert main(["--config", str(cfg)]) == 2
    assert "has no config.json" in capsys.readouterr().err
    assert main(["--help"]) == 0
    assert EvalRequest(ks=(1, 8)).n == 8 and EvalRequest(ks=(1,), num_samples=5).n == 5


# -- end to end on a tiny random policy ---------------------------------------------------


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A tiny policy; 8 held-out rows with verifier thresholds 0..7 in two domains; a
    few-shot source with one solved example per domain; a config (plain template)."""
    from helpers_train import build_policy

    d = tmp_path_factory.mktemp("eval")
    records = [
        {
            "prompt": f"Name thing {t}.",
            "ground_truth": t,
            "verifier": VERIFIER,
            "domain": "low" if t < 4 else "high",
        }
        for t in range(8)
    ]
    write_jsonl(d / "test.jsonl", records)
    shots = [
        {**records[0], "prompt": "Name a low thing.", "solution": "A pebble."},
        {**records[7], "prompt": "Name a high thing.", "solution": "A peak."},
    ]
    write_jsonl(d / "shots.jsonl", shots)
    build_policy(d / "policy", [r["prompt"] for r in records + shots])
    cfg = d / "eval.yaml"
    cfg.write_text(
        f"""# rlvr-eval --config {cfg}
model: {{path: {d / "policy"}}}
mesh: {{actor_devices: 0, learner: {{fsdp: -1}}, actor: {{data: -1}}}}
data:
  eval_sources: [{{path: {d / "test.jsonl"}}}]
  prompt_template: plain
  max_prompt_len: 40
rollout: {{max_new_tokens: 8, max_slots: 16, decode_chunk: 4}}
rewards: {{workers: 1}}
seed: 5
"""
    )
    return d, records, shots


def reference(policy: Path, texts: list[str], truths: list, n: int, seed: int) -> list[int]:
    """Correct samples per prompt text from one `rollout.generate` call on the plain model,
    scored in this process."""
    from rlvr_jax import models, rollout
    from rlvr_jax.data import load_tokenizer

    tok = load_tokenizer(policy)
    ids = [tok.encode(t, add_special_tokens=True) for t in texts]
    completions = rollout.generate(
        models.load_pretrained(policy),
        ids,
        max_new_tokens=8,
        num_samples=n,
        stop_token_ids=(1,),
        seed=seed,
        max_slots=16,
    )
    counts = [0] * len(texts)
    for c in completions:
        text = tok.decode(c.tokens, skip_special_tokens=True)
        counts[c.prompt_index] += int(byte_sum_below(text, truths[c.prompt_index]) == 1.0)
    return counts


def hand_pass_at_k(counts: list[int], n: int, k: int) -> float:
    """Mean of 1 - C(n-c, k)/C(n, k) with exact binomials (the product form is the CLI's)."""
    return sum(1 - comb(n - c, k) / comb(n, k) for c in counts) / len(counts)


@pytest.mark.smoke("eval")
def test_one_prompt_end_to_end(setup, tmp_path):
    """`rlvr-eval` at the tiniest size: two prompts, two samples each, a JSON report."""
    d, _, _ = setup
    out = tmp_path / "eval.json"
    argv = ["--config", str(d / "eval.yaml"), "--ks", "1", "2", "--max-prompts", "2"]
    assert main([*argv, "--json", str(out)]) == 0
    j = json.loads(out.read_text())
    assert j["n"] == 2 and j["prompts"] == 2 and j["generated_tokens"] > 0
    assert 0.0 <= j["pass@k"]["1"] <= j["pass@k"]["2"] <= 1.0


@pytest.mark.slow
def test_eval_end_to_end_matches_reference(setup, tmp_path, capsys):
    d, records, _ = setup
    out = tmp_path / "eval.json"
    argv = ["--config", str(d / "eval.yaml"), "--ks", "1", "2", "4", "--json", str(out)]
    assert main([*argv, "--chunk-prompts", "3"]) == 0
    printed = capsys.readouterr().out
    j = json.loads(out.read_text())

    counts = reference(
        d / "policy", [r["prompt"] for r in records], [r["ground_truth"] for r in records], 4, 5
    )
    assert 0 < sum(counts) < 32, counts  # neither all wrong nor all right
    assert j["n"] == 4 and j["prompts"] == 8 and j["model"] == str(d / "policy")
    for k in (1, 2, 4):
        assert j["pass@k"][str(k)] == pytest.approx(hand_pass_at_k(counts, 4, k), abs=1e-12)
        for dom, sel in (("low", slice(0, 4)), ("high", slice(4, 8))):
            want = hand_pass_at_k(counts[sel], 4, k)
            assert j["per_domain"][dom][str(k)] == pytest.approx(want, abs=1e-12)
    assert j["mean_correct"] == pytest.approx(sum(counts) / 32)
    assert j["prompts_per_domain"] == {"high": 4, "low": 4}
    assert j["fewshot"] is None and j["temperature"] == 1.0 and j["seed"] == 5
    assert j["input"] == [str(d / "test.jsonl")] and j["skipped"] == {}
    assert j["time_s"] > 0 and j["generated_tokens"] > 0
    assert "pass@4" in printed and "all" in printed and "n = 4 samples per prompt" in printed


@pytest.mark.slow
def test_eval_fewshot_end_to_end(setup, tmp_path):
    d, records, shots = setup
    out = tmp_path / "eval.json"
    argv = ["--config", str(d / "eval.yaml"), "--input", str(d / "test.jsonl")]
    argv += ["--fewshot", "1", "--fewshot-source", str(d / "shots.jsonl"), "--max-prompts", "6"]
    assert main([*argv, "--ks", "1", "--samples", "2", "--seed", "9", "--json", str(out)]) == 0
    j = json.loads(out.read_text())
    assert j["prompts"] == 6 and j["n"] == 2 and j["seed"] == 9
    assert j["fewshot"] == {"n": 1, "source": str(d / "shots.jsonl"), "skipped": {}}

    # plain template: example prompt, its solution, the prompt, joined by blank lines; each
    # row gets the one example of its own domain
    by_domain = {s["domain"]: s for s in shots}
    texts = [
        f"{by_domain[r['domain']]['prompt']}\n\n{by_domain[r['domain']]['solution']}\n\n{r['prompt']}"
        for r in records[:6]
    ]
    counts = reference(d / "policy", texts, [r["ground_truth"] for r in records[:6]], 2, 9)
    assert j["pass@k"]["1"] == pytest.approx(sum(counts) / 12, abs=1e-12)
    assert j["per_domain"]["high"]["1"] == pytest.approx(sum(counts[4:]) / 4, abs=1e-12)
