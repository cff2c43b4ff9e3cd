"""`rlvr-bench all` and the shared bench helpers: skipping missing modules, recording failures,
the summary table, JSON writing, and a real quick run of two benchmarks."""

import json
import math
import sys
import textwrap

import numpy as np
import pytest

from rlvr_jax.bench import all as bench_all
from rlvr_jax.bench import common

FAKES = {
    "fake_bench_ok": """
        import argparse, json
        def main(argv):
            p = argparse.ArgumentParser()
            p.add_argument("--json"); p.add_argument("--quick", action="store_true")
            a = p.parse_args(argv)
            json.dump({"tokens_per_s": {"a": 2.5, "b": 4}, "ratios": {"x": 0.5},
                       "quick": a.quick, "other": 1.0}, open(a.json, "w"))
            print("fake table")
            return 0
    """,
    "fake_bench_raises": """
        def main(argv):
            raise RuntimeError("out of memory in fake")
    """,
    "fake_bench_badargs": """
        import argparse
        def main(argv):
            argparse.ArgumentParser().parse_args(argv)  # --quick is unknown: exits with 2
            return 0
    """,
    "fake_bench_nojson": """
        def main(argv):
            return 0
    """,
}


@pytest.fixture
def fake_suite(tmp_path, monkeypatch):
    for name, src in FAKES.items():
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(src))
    monkeypatch.syspath_prepend(str(tmp_path))
    suite = {
        "ok": bench_all.Subcommand("fake_bench_ok", headlines=("tokens_per_s", "ratios/x")),
        "missing": bench_all.Subcommand("fake_bench_not_written_yet"),
        "raises": bench_all.Subcommand("fake_bench_raises"),
        "badargs": bench_all.Subcommand("fake_bench_badargs"),
        "nojson": bench_all.Subcommand("fake_bench_nojson"),
    }
    monkeypatch.setattr(bench_all, "SUBCOMMANDS", suite)
    yield
    for name in FAKES:
        sys.modules.pop(name, None)


def test_all_runs_what_exists_skips_what_does_not_and_records_failures(
    fake_suite, tmp_path, capsys
):
    out = tmp_path / "all.json"
    assert bench_all.main(["--quick", "--json", str(out)]) == 1  # some failed
    printed = capsys.readouterr()
    assert "fake table" in printed.out and "failed: raises, badargs, nojson" in printed.err
    r = json.loads(out.read_text())
    status = r["status"]
    assert status["ok"]["status"] == "ok"
    assert status["missing"] == {
        "status": "skipped",
        "note": "module fake_bench_not_written_yet is not built yet",
    }
    assert status["raises"]["note"] == "RuntimeError: out of memory in fake"
    assert status["badargs"]["note"] == "exit code 2"
    assert status["nojson"]["note"] == "finished without writing its --json file"
    assert r["benchmarks"] == {
        "ok": {
            "tokens_per_s": {"a": 2.5, "b": 4},
            "ratios": {"x": 0.5},
            "quick": True,
            "other": 1.0,
        }
    }
    assert r["summary"] == {"ok": {"tokens_per_s/a": 2.5, "tokens_per_s/b": 4, "ratios/x": 0.5}}
    table = printed.out.split("rlvr-bench all (quick)")[1]
    assert "tokens_per_s/a" in table and "skipped" in table and "exit code 2" in table
    assert "other" not in table  # not a headline


def test_only_and_skip_select_benchmarks(fake_suite, tmp_path, capsys):
    out = tmp_path / "a.json"
    assert bench_all.main(["--only", "ok,missing", "--skip", "missing", "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    assert list(r["status"]) == ["ok"] and r["benchmarks"]["ok"]["quick"] is False
    with pytest.raises(SystemExit):
        bench_all.main(["--only", "ok,nope"])
    assert "--only: unknown benchmark(s) ['nope']" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench_all.main(["--only", "ok", "--skip", "ok"])
    assert "no benchmark left to run" in capsys.readouterr().err


def test_every_known_subcommand_is_wired_in_the_cli():
    from rlvr_jax import cli

    assert set(bench_all.SUBCOMMANDS) | {"all"} == set(cli._BENCH)
    for name, sub in bench_all.SUBCOMMANDS.items():
        assert sub.module == cli._BENCH[name][0]


def test_headline_figures_take_leaves_and_subtrees():
    result = {"a": {"b": 1.5, "c": {"d": 2, "e": "text"}}, "f": True, "g": None, "ab": 9}
    assert bench_all.headline_figures(result, ["a/c", "f", "g", "a/b"]) == {
        "a/c/d": 2,
        "g": None,
        "a/b": 1.5,
    }
    assert bench_all.headline_figures(result, ["a"]) == {"a/b": 1.5, "a/c/d": 2}
    assert bench_all.headline_figures(result, ["zz"]) == {}


def test_json_table_and_flatten_helpers(tmp_path):
    value = {
        "x": np.float32(0.5),
        "y": (1, np.int64(2)),
        "z": float("nan"),
        "w": {"v": np.arange(2)},
    }
    path = common.write_json(tmp_path / "sub" / "r.json", value)
    assert json.loads(path.read_text()) == {"x": 0.5, "y": [1, 2], "z": None, "w": {"v": [0, 1]}}
    assert common.flatten({"a": {"b": {"c": 1}}, "d": 2}) == {"a/b/c": 1, "d": 2}
    assert common.lookup({"a": {"b": 3}}, "a/b") == 3 and common.lookup({"a": 1}, "a/b") is None
    table = common.format_table(["name", "value"], [["alpha", 1234567.0], ["b", 0.5], ["c", None]])
    lines = table.splitlines()
    assert lines[0] == "name       value" and lines[1] == "-----  ---------"
    assert lines[2] == "alpha  1.235e+06" and lines[3] == "b            0.5"
    assert lines[4] == "c              -"
    with pytest.raises(ValueError, match="every row needs 2 cells"):
        common.format_table(["a", "b"], [[1]])
    assert common.format_value(math.inf) == "inf" and common.format_value(7) == "7"


def test_cpu_info_reads_the_model_and_the_widest_isa_first(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(
        "processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz\n"
        "flags\t\t: fpu sse2 avx2 fma avx512f amx_tile amx_bf16 avx512_bf16\n\n"
        "processor\t: 1\nmodel name\t: other\nflags\t\t: fpu\n"
    )
    info = common.cpu_info(cpuinfo)
    assert info["cpu_model"] == "Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz"
    assert info["cpu_isa"] == ["avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "avx2", "fma"]
    cpuinfo.write_text("model name\t: AMD EPYC\nflags\t\t: sse2 fma avx2\n")
    assert common.cpu_info(cpuinfo) == {"cpu_model": "AMD EPYC", "cpu_isa": ["avx2", "fma"]}
    assert common.cpu_info(tmp_path / "absent") == {}  # not Linux: nothing to say


def test_plots_are_png_and_panels_are_checked(tmp_path):
    lines = {"s": ([1, 2], [0.1, 0.2])}
    path = common.save_plot(tmp_path / "p.png", [common.Panel("t", "y", lines=lines)], "title")
    assert path.read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(ValueError, match="exactly one of bars or lines"):
        common.Panel("t", "y")
    with pytest.raises(ValueError, match=r"should end in \.png"):
        common.save_plot(tmp_path / "p.jpg", [common.Panel("t", "y", bars={"a": 1.0})], "x")


@pytest.mark.slow  # ~15 s: the real roofline and waste benchmarks at quick sizes
def test_real_quick_run(tmp_path, capsys):
    out = tmp_path / "all.json"
    plots = tmp_path / "plots"
    argv = ["--quick", "--only", "roofline,waste", "--json", str(out), "--plot-dir", str(plots)]
    assert bench_all.main(argv) == 0
    r = json.loads(out.read_text())
    assert {s["status"] for s in r["status"].values()} == {"ok"}
    summary = r["summary"]
    assert summary["roofline"]["matmul_gflops/float32"] > 0
    waste = r["benchmarks"]["waste"]["measured"]
    assert summary["waste"]["measured/static_waste"] == waste["static_waste"]
    assert summary["waste"]["measured/continuous_waste"] < waste["static_waste"]
    assert (plots / "waste.png").exists()
    assert "measured/continuous_waste" in capsys.readouterr().out
