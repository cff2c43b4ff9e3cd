"""Test harness: 8 simulated CPU devices, strict rank promotion, the shared tiny models, and the
two test tiers.

The tiers
---------
`bash scripts/test.sh` (what CI runs) runs every test. `bash scripts/test.sh --fast` (pytest
`--fast`) runs the fast tier, what a developer runs between edits (under 5 minutes on two
cores with two xdist workers):

- every test not marked `@pytest.mark.slow`: the unit tests, and
- one smoke test per subsystem (`@pytest.mark.smoke("<subsystem>")`, one of `SUBSYSTEMS`):
  the subsystem end to end at the tiniest size (`pytest -m smoke --collect-only -q` lists
  them). `pytest --fast` refuses to start when a subsystem has none (in a run over the whole
  of tests/), and a smoke test may not be slow.

A test that needs more than a second or two is marked `slow`; the full suite still runs it. In
the fast tier each test is held to a time limit, and one over it fails with its time and what to
do (mark it `slow` or make it faster):

- a test's own time is its set-up plus its call, less the set-up of the module-, class- and
  session-scoped fixtures it was the first to request; that set-up is shared by every test
  that uses the fixture, so each shared fixture's set-up is checked on its own (a fixture over
  its limit fails the test that built it, naming the fixture). Teardown is not counted (the
  module teardown below is shared cost).
- limits, for an idle machine: 5 s for a test (`--fast-limit`); 30 s for a smoke test and for
  a shared fixture's set-up (`--smoke-limit`), which compile a whole subsystem's programs.
- other processes on the cores slow every test down alike, so a limit is multiplied by the
  1-minute load average per core when that is above 1 (two xdist workers on two cores are a
  load of 2: no change).
- with `--fast`, torch and transformers are imported before the first test, so that their
  import (seconds) is not charged to whichever test first builds a reference model.

The run's summary lists the fast-tier tests above 60% of their limit: the next candidates for
`slow`. Compiled XLA programs are kept on disk in `.cache/jax` (`JAX_CACHE` below), so a second
run of either tier compiles little: the fast tier took ~185 CPU-seconds with an empty cache and
~110 with a warm one (load average 8-11, where that was 330 s and 175 s of wall time). The
processes the tests start (rlvr-train, the experiment scripts' runs, the workers) share that
cache through JAX_COMPILATION_CACHE_DIR, and every test process compiles with XLA's LLVM
backend at -O0 (`helpers_cli.FAST_COMPILE`): the tests' programs are tiny, compile time is
most of the slow tests' time.

Shared fixtures: `qwen` (a tiny Qwen2 `Model`), `tiny_tokenizer_dir` / `tiny_tokenizer` and
`chat_model_dir` (a tiny checkpoint with that tokenizer) are built once per worker; their
definitions, and the JAX-native `tiny_arch()` / `micro_arch()`, live in helpers_models.py.
"""

import gc
import os
import shutil
import time
from pathlib import Path

# Must happen before jax is imported anywhere.
from helpers_cli import load_factor, xla_flags

os.environ.setdefault("XLA_FLAGS", xla_flags(8))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

# jax is imported only after the environment above is set
import helpers_models as H
import jax
import pytest

pytest_plugins = ["helpers_crash"]  # a worker's native crash: its dump, and one rerun alone

JAX_CACHE = Path(
    os.environ.get("RLVR_TEST_JAX_CACHE", Path(__file__).resolve().parents[1] / ".cache" / "jax")
)
"""JAX's persistent compilation cache for the tests: compiled XLA programs on disk, shared by
the xdist workers and by every test module (`jax.clear_caches()` below drops only the programs
in memory), kept between runs. Measured on six compile-heavy test files (kv_cache,
models_parity, losses_reference, rollout_engine, ppo, sft_packing; 163 tests, one process): 243
CPU-seconds without it (two runs), 198 with a cold cache (CI's fresh clone: programs recompiled
after each module's clear come from disk), 56 with a warm one (a developer's next run).
Emptied at the start of a run once it holds over `JAX_CACHE_MAX_BYTES`."""
JAX_CACHE_MAX_BYTES = 2 << 30

jax.config.update("jax_numpy_rank_promotion", "raise")
jax.config.update("jax_platforms", "cpu")
if JAX_CACHE.name:  # RLVR_TEST_JAX_CACHE="" turns it off
    jax.config.update("jax_compilation_cache_dir", str(JAX_CACHE))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
    # ... and for the processes the tests start (rlvr-train, the experiment scripts' runs, the
    # workers): JAX reads these variables, so a program one test's process compiled is loaded
    # from disk by the next process that needs it (a resumed run, the next arm, the next test
    # file on the tiny setup). A test that sets its own cache keeps it.
    os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(JAX_CACHE))
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "-1")

SUBSYSTEMS = (
    "models",
    "losses",
    "rewards",
    "data",
    "rollout",
    "serve",
    "training",
    "eval",
    "config",
    "checkpoint",
    "bench",
    "envs",
)
"""Each has one smoke test in the fast tier."""
NEAR_LIMIT = 0.6  # the summary lists fast-tier tests above this fraction of their limit
LONGEST_FILES = (
    "test_multihost.py",
    "test_gpu_check.py",
    "test_experiment_harness.py",
    "test_cli_bench_subprocess.py",
    "test_ledger.py",
    "test_cli_subprocess.py",
    "test_ppo_train.py",
    "test_checkpoint.py",
    "test_lora_train.py",
    "test_train_loop.py",
    "test_bench_mismatch.py",
    "test_envs_train.py",
    "test_experiment_dpo_script.py",
    "test_experiment_script.py",
    "test_experiment_ppo.py",
)
"""The test files of a minute or more (one to three, each its own processes), longest first:
collected first, in this order, and handed out first. `--dist loadfile` gives a worker the next
file in collection order when it is almost out of tests; by default (xdist's
`--loadscope-reorder`, turned off in `pytest_configure`) the files with the most tests come
first, which left these few-test files for the end of the run, one worker on a 2-minute file
while the other idled."""


def pytest_addoption(parser):
    group = parser.getgroup("rlvr_jax test tiers")
    group.addoption(
        "--fast",
        action="store_true",
        help="the fast tier: deselect tests marked slow and fail any test over --fast-limit",
    )
    group.addoption(
        "--fast-limit",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="with --fast: the most seconds a test (set-up + call) may take (default 5)",
    )
    group.addoption(
        "--smoke-limit",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="with --fast: the same for a smoke test and a shared fixture's set-up (default 30)",
    )


def pytest_configure(config):
    if hasattr(config.option, "loadscopereorder"):  # xdist: hand files out in collection order
        config.option.loadscopereorder = False
    if JAX_CACHE.name and not hasattr(config, "workerinput"):  # the controller, before workers
        size = sum(f.stat().st_size for f in JAX_CACHE.rglob("*") if f.is_file())
        if size > JAX_CACHE_MAX_BYTES:
            shutil.rmtree(JAX_CACHE, ignore_errors=True)
    if config.getoption("fast"):
        import torch  # noqa: F401
        import transformers

        transformers.AutoModelForCausalLM  # noqa: B018  (its import is lazy)


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: files stay whole
    for item in items:
        if item.get_closest_marker("smoke") and item.get_closest_marker("slow"):
            raise pytest.UsageError(f"{item.nodeid}: a smoke test may not be marked slow")
    if not config.getoption("fast"):
        return
    whole_suite = config.args_source == pytest.Config.ArgsSource.TESTPATHS
    covered = {m.args[0] for item in items for m in item.iter_markers("smoke")}
    missing = [s for s in SUBSYSTEMS if s not in covered]
    if whole_suite and missing:
        raise pytest.UsageError(f"the fast tier has no smoke test for: {', '.join(missing)}")
    slow = [item for item in items if item.get_closest_marker("slow")]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if not item.get_closest_marker("slow")]


# ---- the fast tier's time limit ---------------------------------------------------------

_shared_setups: list[tuple[str, str, float]] = []  # (fixture, scope, seconds) in this set-up
_OWN_SETUP = pytest.StashKey[tuple[float, list]]()
_near_limit: list[tuple[float, float, str]] = []  # on the controller: (seconds, limit, test)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    _shared_setups.clear()


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef, request):
    """Times the set-up of shared fixtures (their own dependencies are set up before)."""
    start = time.perf_counter()
    try:
        return (yield)
    finally:
        if fixturedef.scope != "function":
            _shared_setups.append(
                (fixturedef.argname, fixturedef.scope, time.perf_counter() - start)
            )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if not item.config.getoption("fast"):
        return report
    if report.when == "setup":
        shared = list(_shared_setups)
        item.stash[_OWN_SETUP] = (report.duration - sum(s for *_, s in shared), shared)
    elif report.when == "call" and report.passed:
        own_setup, shared = item.stash.get(_OWN_SETUP, (0.0, []))
        own = own_setup + report.duration
        load = load_factor()
        smoke = item.get_closest_marker("smoke") is not None
        limit = load * item.config.getoption("smoke_limit" if smoke else "fast_limit")
        shared_limit = load * item.config.getoption("smoke_limit")
        report.user_properties.append(("fast_tier", (own, limit)))
        problems = [
            f"its {scope}-scoped fixture `{name}` took {seconds:.1f} s to set up "
            f"(limit {shared_limit:.1f} s)"
            for name, scope, seconds in shared
            if seconds > shared_limit
        ]
        if own > limit:
            kind = "smoke test" if smoke else "test"
            problems.insert(
                0,
                f"the {kind} took {own:.1f} s (set-up {own_setup:.1f} s + call "
                f"{report.duration:.1f} s; limit {limit:.1f} s)",
            )
        if problems:
            report.outcome = "failed"
            report.longrepr = (
                f"{item.nodeid} is over the fast tier's time limit: {'; '.join(problems)}. "
                f"(Limits on an idle machine, here x{load:.1f} for the load average.)\n"
                "Mark the test @pytest.mark.slow (the full suite still runs it) or make it "
                "faster; tests/conftest.py explains the tiers."
            )
    return report


def pytest_runtest_logreport(report):
    for key, value in report.user_properties:
        if key == "fast_tier":
            _near_limit.append((*value, report.nodeid))


def pytest_terminal_summary(terminalreporter, config):
    if not config.getoption("fast"):
        return
    near = sorted((t for t in _near_limit if t[0] > NEAR_LIMIT * t[1]), reverse=True)
    if near:
        terminalreporter.section(f"fast tier: tests above {NEAR_LIMIT:.0%} of their limit")
        for seconds, limit, nodeid in near:
            terminalreporter.write_line(f"{seconds:5.1f} s of {limit:4.1f} s  {nodeid}")


# ---- harness ------------------------------------------------------------------------------


MAX_MAPS = 16_000
"""Memory mappings of the process above which the module teardown also runs `gc.collect()`."""


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    """Drops every compiled XLA program after each test module. Each CPU executable keeps a
    few memory mappings; over the whole suite (thousands of programs) one process reached
    Linux's `vm.max_map_count` (65,530) and XLA aborted mid-compile (CI: SIGABRT in
    test_sft after 30 min, SIGSEGV in sharded decode before). A full `gc.collect()` (for
    programs held in reference cycles) takes ~0.5 s in a process holding torch, TF and the
    suite's modules, and mostly finds nothing, so it runs only once the process holds over
    `MAX_MAPS` mappings (a quarter of Linux's default limit)."""
    yield
    jax.clear_caches()
    with open("/proc/self/maps") as maps:
        if sum(1 for _ in maps) > MAX_MAPS:
            gc.collect()


# ---- the shared tiny models (definitions in helpers_models.py) ---------------------------


@pytest.fixture(scope="session")
def qwen(tmp_path_factory):
    """The tiny Qwen2 (`helpers_models.BASE["qwen2"]`, seed 5) as an `rlvr_jax.models.Model`;
    the rollout engine tests' model."""
    from rlvr_jax import models

    path = tmp_path_factory.mktemp("qwen2")
    H.build_hf_checkpoint("qwen2", path, seed=5)
    return models.load_pretrained(path)


@pytest.fixture(scope="session")
def tiny_tokenizer_dir(tmp_path_factory):
    """The tiny tokenizer's HF directory (`helpers_models.train_tiny_tokenizer`)."""
    return H.train_tiny_tokenizer(tmp_path_factory.mktemp("tiny_tokenizer"))


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_tokenizer_dir):
    """The tiny tokenizer, loaded (`rlvr_jax.data.tokenizer.load_tokenizer`)."""
    from rlvr_jax.data.tokenizer import load_tokenizer

    return load_tokenizer(tiny_tokenizer_dir)


@pytest.fixture(scope="session")
def chat_model_dir(tmp_path_factory):
    """`helpers_models.build_chat_model` (seed 4): what the rlvr-serve tests serve. Read only."""
    return H.build_chat_model(tmp_path_factory.mktemp("chat_model"))
