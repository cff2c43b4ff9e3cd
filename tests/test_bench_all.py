"""`rlvr-bench` as one table (`rlvr_jax.bench.table`) and `rlvr-bench all`: flags from the config
fields, every subcommand declared and wired, failures recorded, the one formatter, JSON writing
and plots. (A real `all --quick` run: test_cli_bench_subprocess.py.)"""

import dataclasses
import json
import math
import os

import numpy as np
import pytest

from rlvr_jax.bench import common, table


@dataclasses.dataclass(frozen=True)
class FakeConfig:
    size: int = 3
    """The fake's size."""
    broken: bool = False
    """Refuse every run."""

    def __post_init__(self) -> None:
        if self.broken:
            raise ValueError("broken by its preset")


def _ok(cfg):
    return {"tokens_per_s": {"a": 2.5, "b": 4}, "ratios": {"x": 0.5}, "size": cfg.size}


def _raises(cfg):
    raise RuntimeError("out of memory in fake")


def _exits(cfg):
    raise SystemExit(2)  # as argparse does on a bad flag


FAKES = {
    "ok": table.Bench(FakeConfig, _ok, {"default": FakeConfig(), "quick": FakeConfig(size=1)},
                      headlines=("tokens_per_s", "ratios/x")),
    "raises": table.Bench(FakeConfig, _raises, {"default": FakeConfig(), "quick": FakeConfig()},
                          headlines=()),
    "badargs": table.Bench(FakeConfig, _exits, {"default": FakeConfig(), "quick": FakeConfig()},
                           headlines=()),
}  # fmt: skip


@pytest.fixture
def fake_suite(monkeypatch):
    monkeypatch.setattr(table, "SUBCOMMANDS", {name: f"the {name} fake" for name in FAKES})
    monkeypatch.setattr(table, "bench", FAKES.__getitem__)


def test_all_runs_every_subcommand_and_records_failures(fake_suite, tmp_path, capsys):
    out = tmp_path / "all.json"
    assert table.main_all(["--quick", "--json", str(out)]) == 1  # some failed
    printed = capsys.readouterr()
    assert "tokens_per_s/a" in printed.out and "failed: raises, badargs" in printed.err
    r = json.loads(out.read_text())
    status = r["status"]
    assert status["ok"]["status"] == "ok"
    assert status["raises"]["note"] == "RuntimeError: out of memory in fake"
    assert status["badargs"]["note"] == "exit code 2"
    ok = r["benchmarks"]["ok"]  # with where and how it ran
    assert (ok["size"], ok["config"]) == (1, {"size": 1, "broken": False})
    assert (
        ok["machine"]["cpu_count"] == os.cpu_count() and len(ok["machine"]["loadavg_before"]) == 3
    )
    assert r["summary"] == {"ok": {"tokens_per_s/a": 2.5, "tokens_per_s/b": 4, "ratios/x": 0.5}}
    summary = printed.out.split("rlvr-bench all (quick)")[1]
    assert "tokens_per_s/a" in summary and "RuntimeError" in summary and "size" not in summary


def test_flags_come_from_the_config_fields(fake_suite, capsys):
    args, cfg = table.parse("ok", ["--size", "7", "--json", "x.json"])
    assert cfg == FakeConfig(size=7) and args.json == "x.json"
    assert table.parse("ok", ["--quick"])[1] == FakeConfig(size=1)
    with pytest.raises(SystemExit):  # the config checks the flags' result
        table.parse("ok", ["--broken"])
    assert "broken by its preset" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        table.parse("ok", ["--help"])
    assert "The fake's size. (default: 3)" in capsys.readouterr().out


def test_only_and_skip_select_benchmarks(fake_suite, tmp_path, capsys):
    out = tmp_path / "a.json"
    assert table.main_all(["--only", "ok,raises", "--skip", "raises", "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    assert list(r["status"]) == ["ok"] and r["benchmarks"]["ok"]["size"] == 3
    with pytest.raises(SystemExit):
        table.main_all(["--only", "ok,nope"])
    assert "--only: unknown benchmark(s) ['nope']" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        table.main_all(["--only", "ok", "--skip", "ok"])
    assert "no benchmark left to run" in capsys.readouterr().err


def test_every_subcommand_is_declared_and_wired_in_the_cli(capsys):
    from rlvr_jax import cli

    assert cli.bench_main(["--help"]) == 0
    listed = capsys.readouterr().out
    for name, summary in table.SUBCOMMANDS.items():
        b = table.bench(name)
        assert f"  {name} " in listed and summary in listed
        assert "quick" in b.presets and b.headlines
        for preset in b.presets.values():
            assert isinstance(preset, b.config)
        with pytest.raises(SystemExit) as e:  # every flag of every subcommand parses
            table.parse(name, ["--help"])
        assert e.value.code == 0 and "--json" in capsys.readouterr().out


def test_headline_figures_take_leaves_and_subtrees():
    result = {"a": {"b": 1.5, "c": {"d": 2, "e": "text"}}, "f": True, "g": None, "ab": 9}
    assert table.headline_figures(result, ["a/c", "f", "g", "a/b"]) == {
        "a/c/d": 2,
        "a/c/e": "text",
        "f": True,
        "g": None,
        "a/b": 1.5,
    }
    assert table.headline_figures(result, ["a"]) == {"a/b": 1.5, "a/c/d": 2, "a/c/e": "text"}
    assert table.headline_figures(result, ["zz"]) == {}
    assert table.headline_figures({"h": [1, 2]}, ["h"]) == {}  # lists are not figures


def test_one_formatter_shows_figures_and_tables_of_rows():
    result = {
        "tokens_per_s": {"a": 2.5, "b": 4},
        "rows": {"x": {"loss": 1.0, "note": "n"}, "y": {"loss": 2.0, "tis": {"mean": 0.5}}},
        "machine": {"cpu_model": "CPU", "cpu_isa": ["avx2"], "cpu_count": 2, "device_kind": "cpu",
                    "loadavg_before": [0.5, 0, 0], "loadavg_after": [1.25, 0, 0]},
        "roofline": {"peak_gflops_fp32": 100.0, "memory_gbps": 20.0},
    }  # fmt: skip
    text = table.format_result(result, ["tokens_per_s", "rows"]).splitlines()
    assert text[:4] == ["figure          value", "--------------  -----",
                        "tokens_per_s/a    2.5", "tokens_per_s/b      4"]  # fmt: skip
    assert text[5:9] == ["rows  loss  note  tis/mean", "----  ----  ----  --------",
                         "x        1  n            -", "y        2  -          0.5"]  # fmt: skip
    assert text[-1] == (
        "machine: CPU (avx2, 2 cores, cpu); roofline fp32 100.0 GFLOP/s, 20.0 GB/s; "
        "load 0.50 -> 1.25"
    )
    loud = {"quiet": False, "load": {"threshold": 1.5, "by_side": {"a": [2.0, 1.0]}}}
    assert "NOT QUIET: 1-minute load above 1.5 around a (2.00)" in table.machine_line(loud)
    assert table.machine_line({}) == "machine: ? (ISA unknown, ? cores, ?)"


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
