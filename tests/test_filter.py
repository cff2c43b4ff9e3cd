"""`rlvr-filter` (offline difficulty filtering): the selection rule on hand-made pass counts,
the report, rows written back exactly, argument errors, and the CLI end to end on a tiny
random policy checked against an independent count from `rollout.generate`."""

import json
import math
from pathlib import Path

import numpy as np
import pytest

from rlvr_jax.data.rows import DataError
from rlvr_jax.eval import difficulty
from rlvr_jax.eval.filter_cli import main


def byte_sum_below(response: str, ground_truth, **_) -> float:
    """Test verifier: 1 when the response's UTF-8 byte sum mod 8 is below `ground_truth`.
    On a random policy's text the residue is about uniform, so a row with ground truth t is
    solved about t/8 of the time: rows spread over the pass-rate bins."""
    return float(sum(response.encode("utf-8")) % 8 < int(ground_truth))


VERIFIER = f"{__name__}:byte_sum_below"


# -- the selection rule on hand-made counts -----------------------------------------------


def test_keep_mask_hand_counts():
    # n = 8, threshold 0.625 = 5/8: 0/8, 3/8 and 5/8 (equal) kept; 6/8 = 0.75, 8/8 dropped
    counts = np.array([0, 5, 6, 8, 3])
    assert difficulty.keep_mask(counts, 8, 0.625).tolist() == [True, True, False, False, True]
    # threshold 0.375 = 3/8: 3/8 kept, 4/8 = 0.5 dropped
    assert difficulty.keep_mask(np.array([3, 4]), 8, 0.375).tolist() == [True, False]
    # n = 3, threshold 2/3: 2/3 kept exactly, 3/3 dropped
    assert difficulty.keep_mask(np.array([2, 3]), 3, 2 / 3).tolist() == [True, False]
    # 0 keeps only the unsolved, 1 keeps everything
    assert difficulty.keep_mask(np.arange(9), 8, 0.0).tolist() == [True] + [False] * 8
    assert difficulty.keep_mask(np.arange(9), 8, 1.0).all()


def test_keep_mask_rejects_bad_settings():
    with pytest.raises(ValueError, match="max_pass_rate must be in"):
        difficulty.keep_mask(np.array([1]), 8, 1.5)
    with pytest.raises(ValueError, match=r"\[0, 8\]"):
        difficulty.keep_mask(np.array([9]), 8, 0.625)
    with pytest.raises(ValueError, match="must be >= 1"):
        difficulty.pass_rates(np.array([0]), 0)


def test_pass_histogram_counts_each_bin():
    # counts 0, 5, 6, 8, 3, 5 -> bin 0: 1, bin 3: 1, bin 5: 2, bin 6: 1, bin 8: 1
    hist = difficulty.pass_histogram(np.array([0, 5, 6, 8, 3, 5]), 8)
    assert hist.tolist() == [1, 0, 0, 1, 0, 2, 1, 0, 1]


def test_report_json_from_hand_counts():
    report = difficulty.FilterReport(
        input="in.jsonl",
        output="out.jsonl",
        model="m",
        num_samples=8,
        max_pass_rate=0.625,
        counts_P=np.array([0, 5, 6, 8, 3, 5]),
        kept_P=difficulty.keep_mask(np.array([0, 5, 6, 8, 3, 5]), 8, 0.625),
        domains=("a", "a", "b", "b", "a", "b"),
        skipped={"bad_json": 2, "too_long": 1},
        extra={"time_s": 1.5},
    )
    j = report.to_json()
    # scored 6, kept 4 (0, 5, 3, 5), dropped 2 (6, 8); rows = 6 scored + 3 skipped
    assert j["counts"] == {"rows": 9, "skipped": 3, "scored": 6, "kept": 4, "dropped": 2}
    assert j["kept_fraction"] == pytest.approx(4 / 6)
    # mean pass rate (0 + 5 + 6 + 8 + 3 + 5) / 48 = 27/48
    assert j["mean_pass_rate"] == pytest.approx(27 / 48)
    assert [b["prompts"] for b in j["histogram"]] == [1, 0, 0, 1, 0, 2, 1, 0, 1]
    assert [b["kept"] for b in j["histogram"]] == [True] * 6 + [False] * 3
    assert j["histogram"][5]["pass_rate"] == 0.625
    # a: counts 0, 5, 3 -> all kept, mean 8/24; b: 6, 8, 5 -> one kept, mean 19/24
    assert j["per_domain"]["a"] == {"scored": 3, "kept": 3, "mean_pass_rate": 8 / 24}
    assert j["per_domain"]["b"] == {"scored": 3, "kept": 1, "mean_pass_rate": 19 / 24}
    assert j["time_s"] == 1.5
    assert "kept 4 (66.7%)" in report.summary()
    json.dumps(j)  # serialisable as is


# -- rows written back as they were ---------------------------------------------------------


def test_jsonl_rows_come_back_byte_for_byte(tmp_path):
    lines = [
        '{"verifier": "math", "prompt": "Ünïcode 2+2?",   "ground_truth": 4, "extra": [1, 2]}',
        "",
        '{"prompt":"x","verifier":"math","ground_truth":"1"}',
    ]
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join(lines) + "\r\n", encoding="utf-8")  # CRLF ending on the last
    got = difficulty.original_lines(path, "jsonl", [0, 2])
    assert got == {0: lines[0], 2: lines[2]}


def test_parquet_rows_come_back_as_their_json_objects(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from rlvr_jax.config.schema import SourceConfig
    from rlvr_jax.data import load_source

    records = [
        {"prompt": "a?", "verifier": "math", "ground_truth": "1", "domain": None},
        {"prompt": "b?", "verifier": "math", "ground_truth": "2", "domain": "alg"},
    ]
    pq.write_table(pa.Table.from_pylist(records), tmp_path / "in.parquet")
    got = difficulty.original_lines(tmp_path / "in.parquet", "parquet", [1, 0])
    assert [json.loads(got[i]) for i in (0, 1)] == records
    # what is written back, the loader reads as the same rows
    out = difficulty.write_lines([got[0], got[1]], tmp_path / "out.jsonl")
    back = load_source(SourceConfig(path=str(out)))
    assert [(r.prompt, r.ground_truth, r.domain) for r in back.rows] == [
        ("a?", "1", "math"),
        ("b?", "2", "alg"),
    ]


def test_output_and_input_paths_are_checked(tmp_path):
    with pytest.raises(ValueError, match=r"out\.csv.*must end in"):
        difficulty.check_output_path(tmp_path / "out.csv")
    assert difficulty.check_output_path("kept.jsonl") == Path("kept.jsonl")
    with pytest.raises(DataError, match=r"input file not found.*nope\.jsonl"):
        difficulty.check_input_path(tmp_path / "nope.jsonl")
    (tmp_path / "rows.csv").write_text("a,b\n")
    with pytest.raises(DataError, match=r"rows\.csv.*cannot tell the format"):
        difficulty.check_input_path(tmp_path / "rows.csv")


# -- command-line errors: exit 2, message naming the problem ----------------------------


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--max-pass-rate", "1.5"], "--max-pass-rate must be in [0, 1]"),
        (["--samples", "0"], "--samples must be >= 1"),
        (["--chunk-prompts", "0"], "--chunk-prompts must be >= 1"),
        (["--histogram", "h.bmp"], "--histogram 'h.bmp' must end in"),
    ],
)
def test_bad_arguments_exit_2(tmp_path, capsys, extra, message):
    argv = ["--model", str(tmp_path), "--input", "a.jsonl", "--output", "k.jsonl", *extra]
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_usage_errors_exit_2(tmp_path, capsys):
    assert main(["--model", str(tmp_path), "--output", "k.jsonl"]) == 2  # no --input
    assert "--input" in capsys.readouterr().err
    assert main(["--input", "a.jsonl", "--output", "k.jsonl"]) == 2
    assert "give --config FILE" in capsys.readouterr().err
    assert main(["--model", "m", "--input", "a.jsonl", "--output", "kept.parquet"]) == 2
    assert "must end in one of ('.jsonl', '.ndjson')" in capsys.readouterr().err
    assert main(["--model", "m", "--input", "a.jsonl", "--output", "a.jsonl"]) == 2
    assert "must not be the --input" in capsys.readouterr().err
    assert main(["--help"]) == 0


def test_console_entry_point_is_wired(capsys):
    from rlvr_jax import cli

    assert cli.filter_main(["--model", "m", "--input", "a.jsonl", "--output", "k.txt"]) == 2
    assert "--output 'k.txt' must end in" in capsys.readouterr().err


def test_missing_input_and_bad_config_exit_2(tmp_path, capsys):
    missing = tmp_path / "nope.jsonl"
    argv = ["--model", str(tmp_path), "--input", str(missing), "--output", "k.jsonl"]
    assert main(argv) == 2
    assert f"input file not found: '{missing}'" in capsys.readouterr().err
    cfg = tmp_path / "c.yaml"
    cfg.write_text("model: {path: m}\nrollout: {max_new_tokenz: 3}\n")
    assert main(["--config", str(cfg), "--input", str(missing), "--output", "k.jsonl"]) == 2
    err = capsys.readouterr().err
    assert "rollout.max_new_tokenz" in err and "c.yaml" in err


# -- end to end on a tiny random policy ---------------------------------------------------


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A tiny policy, 9 rows with verifier thresholds 0..8 over two domains plus one
    undecodable line, and a config (plain template, 8 new tokens)."""
    from helpers_train import build_policy

    d = tmp_path_factory.mktemp("filter")
    records = [
        {
            "prompt": f"Tell me about item {t}.",
            "ground_truth": t,
            "verifier": VERIFIER,
            "domain": "low" if t < 4 else "high",
            "note": f"kept as is {t}",
        }
        for t in range(9)
    ]
    lines = [json.dumps(r, indent=None, separators=(", ", ":")) for r in records]
    lines.insert(4, "{not json")
    (d / "rows.jsonl").write_text("\n".join(lines) + "\n")
    build_policy(d / "policy", [r["prompt"] for r in records])
    cfg = d / "filter.yaml"
    cfg.write_text(
        f"""# rlvr-filter --config {cfg} --input rows.jsonl --output kept.jsonl
model: {{path: {d / "policy"}}}
mesh: {{actor_devices: 0, learner: {{fsdp: -1}}, actor: {{data: -1}}}}
data: {{prompt_template: plain, max_prompt_len: 40}}
rollout: {{max_new_tokens: 8, max_slots: 16, decode_chunk: 4}}
rewards: {{workers: 1}}
seed: 3
"""
    )
    return d, records, lines


def reference_counts(policy: Path, prompts: list[str], n: int, seed: int, truths) -> list[int]:
    """Correct samples per prompt from one `rollout.generate` call on the plain model, scored
    in this process (independent of the CLI's chunking, seeding, engine and verification)."""
    from rlvr_jax import models, rollout
    from rlvr_jax.data import load_tokenizer

    tok = load_tokenizer(policy)
    model = models.load_pretrained(policy)
    ids = [tok.encode(p, add_special_tokens=True) for p in prompts]
    completions = rollout.generate(
        model, ids, max_new_tokens=8, num_samples=n, stop_token_ids=(1,), seed=seed, max_slots=16
    )
    counts = [0] * len(prompts)
    for c in completions:
        text = tok.decode(c.tokens, skip_special_tokens=True)
        counts[c.prompt_index] += int(byte_sum_below(text, truths[c.prompt_index]) == 1.0)
    return counts


@pytest.mark.slow
def test_filter_end_to_end_matches_reference(setup, tmp_path, capsys):
    d, records, lines = setup
    out, hist, stats = tmp_path / "kept.jsonl", tmp_path / "hist.png", tmp_path / "stats.json"
    argv = ["--config", str(d / "filter.yaml"), "--input", str(d / "rows.jsonl")]
    argv += ["--output", str(out), "--histogram", str(hist), "--json", str(stats)]
    assert main([*argv, "--chunk-prompts", "4"]) == 0
    printed = capsys.readouterr().out
    assert "10 rows read, 1 skipped by the loader, 9 scored" in printed

    counts = reference_counts(
        d / "policy", [r["prompt"] for r in records], 8, 3, [r["ground_truth"] for r in records]
    )
    keep = [c <= 5 for c in counts]  # pass rate c/8 <= 0.625
    assert not all(keep) and any(keep), counts  # the thresholds spread the rows over bins
    kept_lines = [line for line, k in zip([x for x in lines if x != "{not json"], keep) if k]
    assert out.read_text().splitlines() == kept_lines  # the original lines, in input order

    j = json.loads(stats.read_text())
    assert j["counts"] == {
        "rows": 10,
        "skipped": 1,
        "scored": 9,
        "kept": sum(keep),
        "dropped": 9 - sum(keep),
    }
    assert j["skipped"] == {"bad_json": 1}
    assert [b["prompts"] for b in j["histogram"]] == np.bincount(counts, minlength=9).tolist()
    assert [b["pass_rate"] for b in j["histogram"]] == [k / 8 for k in range(9)]
    assert j["kept_fraction"] == pytest.approx(sum(keep) / 9)
    low = [c for c, r in zip(counts, records) if r["domain"] == "low"]
    assert j["per_domain"]["low"]["mean_pass_rate"] == pytest.approx(sum(low) / (8 * len(low)))
    assert j["samples"] == 8 and j["temperature"] == 1.0 and j["top_p"] == 1.0
    assert j["time_s"] > 0 and j["generate_s"] > 0
    assert hist.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # rows solved always (t = 8) are dropped and never solved (t = 0) kept, whatever the policy
    assert counts[0] == 0 and keep[0] and counts[8] == 8 and not keep[8]
    # the same run with another chunking samples the same: same output
    out2 = tmp_path / "kept2.jsonl"
    assert main([*argv[:-6], "--output", str(out2), "--chunk-prompts", "16"]) == 0
    assert out2.read_text() == out.read_text()


@pytest.mark.slow
def test_filter_parquet_input_and_skip_reporting(setup, tmp_path, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    d, records, _ = setup
    long_row = {**records[0], "prompt": "word " * 200}  # over max_prompt_len: skipped
    pq.write_table(pa.Table.from_pylist([*records, long_row]), tmp_path / "rows.parquet")
    out, stats = tmp_path / "kept.jsonl", tmp_path / "s.json"
    argv = ["--config", str(d / "filter.yaml"), "--input", str(tmp_path / "rows.parquet")]
    assert main([*argv, "--output", str(out), "--json", str(stats), "--max-pass-rate", "1"]) == 0
    # --max-pass-rate 1 keeps every scored row: the 9 records, as their JSON objects
    assert [json.loads(x) for x in out.read_text().splitlines()] == records
    j = json.loads(stats.read_text())
    assert j["skipped"] == {"too_long": 1} and j["counts"]["kept"] == 9
    assert j["max_pass_rate"] == 1.0
    assert math.isclose(j["kept_fraction"], 1.0)

    (tmp_path / "bad.jsonl").write_text('{"prompt": "no verifier"}\n')
    argv = ["--config", str(d / "filter.yaml"), "--input", str(tmp_path / "bad.jsonl")]
    assert main([*argv, "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert "bad.jsonl" in err and "no usable rows" in err and "missing_field: 1" in err
