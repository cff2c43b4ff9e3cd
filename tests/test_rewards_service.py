"""RewardService, the verifier registry and the killable worker pool.

The misbehaving verifiers below are user verifiers: registered by name with
`register_verifier` or named as "module:function". Worker processes import this module by name
to run them.
"""

import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from rlvr_jax.config.schema import RewardsConfig
from rlvr_jax.rewards import registry
from rlvr_jax.rewards.math import verify
from rlvr_jax.rewards.registry import register_verifier, verifier_target
from rlvr_jax.rewards.service import RewardService
from rlvr_jax.rewards.timeout import WorkerPool, in_worker, resolve_target

HERE = __name__  # the module name worker processes import ("test_rewards_service")


@register_verifier("always_half")
def always_half(response, ground_truth, **kwargs):
    return 0.5


@register_verifier("crashes")
def crashes(response, ground_truth, **kwargs):
    raise RuntimeError("verifier bug")


@register_verifier("hangs")
def hangs(response, ground_truth, **kwargs):
    while True:
        time.sleep(0.05)


def exits_process(response, ground_truth, **kwargs):
    os._exit(3)


def out_of_range(response, ground_truth, **kwargs):
    return 1.5


def not_a_number(response, ground_truth, **kwargs):
    return "1.0"


def keyword_count(response, ground_truth, *, keyword, per_hit=0.25):
    """Counts `keyword` in the response (exercises verifier_kwargs)."""
    return min(1.0, per_hit * response.count(keyword))


def spawn_child_then_hang(response, pid_file):
    """Starts a long-lived child (as a code sandbox would), records its pid, then hangs."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    with open(pid_file, "w") as f:
        f.write(str(child.pid))
    while True:
        time.sleep(0.05)


def report_in_worker():
    return in_worker()


def _pid_alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie is dead too
    except FileNotFoundError:
        return False


@pytest.fixture(scope="module")
def service():
    with RewardService(RewardsConfig(timeout_s=2.0), workers=2) as svc:
        yield svc


# -- the service -----------------------------------------------------------------------------
@pytest.mark.smoke("rewards")
def test_weights_domains_and_format_term_by_hand():
    config = RewardsConfig(
        domain_weights={"algebra": 2.0, "misc": 0.5}, format_weight=0.25, timeout_s=5.0
    )
    rows = [
        {"verifier": "math", "ground_truth": "4", "domain": "algebra"},
        {"verifier": "math", "ground_truth": "4", "domain": "algebra"},
        {"verifier": "math", "ground_truth": r"\frac{1}{2}"},
        {"verifier": "always_half", "ground_truth": None, "domain": "misc"},
    ]
    responses = [
        "<think>2+2</think><answer>4</answer>",  # correct, formatted
        r"\boxed{5}",  # wrong, unformatted
        r"<think>half</think><answer>\boxed{0.5}</answer>",  # correct, formatted
        "anything",
    ]
    with RewardService(config, workers=2) as svc:
        result = svc.score(rows, responses)
    # r = w·score + 0.25·format:
    #   row 0: 2.0·1 + 0.25·1 = 2.25     row 1: 2.0·0 + 0.25·0 = 0
    #   row 2: 1.0·1 + 0.25·1 = 1.25     row 3: 0.5·0.5 + 0.25·0 = 0.25
    np.testing.assert_allclose(result.rewards, [2.25, 0.0, 1.25, 0.25])
    assert result.rewards.dtype == np.float32
    np.testing.assert_allclose(result.verifier_scores, [1.0, 0.0, 1.0, 0.5])
    assert result.domains == ("algebra", "algebra", "math", "misc")
    assert result.verifiers == ("math", "math", "math", "always_half")
    m = result.metrics
    assert m["reward/algebra"] == pytest.approx((2.25 + 0.0) / 2)
    assert m["reward/math"] == pytest.approx(1.25)
    assert m["reward/misc"] == pytest.approx(0.25)
    assert m["reward/mean"] == pytest.approx((2.25 + 0 + 1.25 + 0.25) / 4)
    assert m["rewards/math/mean"] == pytest.approx(2 / 3)
    assert m["rewards/math/count"] == 3 and m["rewards/always_half/count"] == 1
    assert m["rewards/format/mean"] == pytest.approx(0.5)
    assert m["rewards/timeouts"] == 0 and m["rewards/errors"] == 0


@pytest.mark.slow
def test_crashing_and_hanging_verifiers_cost_one_sample_each(service):
    rows = [
        {"verifier": "crashes", "ground_truth": 1},
        {"verifier": "hangs", "ground_truth": 1},
        {"verifier": f"{HERE}:exits_process", "ground_truth": 1},
        {"verifier": f"{HERE}:out_of_range", "ground_truth": 1},
        {"verifier": f"{HERE}:not_a_number", "ground_truth": 1},
        {"verifier": "math", "ground_truth": "3"},
        {"verifier": "always_half", "ground_truth": None},
    ]
    responses = ["x"] * 5 + [r"\boxed{3}", "y"]
    start = time.perf_counter()
    result = service.score(rows, responses)
    elapsed = time.perf_counter() - start
    assert elapsed < 2.0 + 6.0, elapsed  # one 2 s timeout, not a hang
    np.testing.assert_allclose(result.rewards, [0, 0, 0, 0, 0, 1.0, 0.5])
    assert result.statuses == ("error", "timeout", "error", "error", "error", "ok", "ok")
    assert "RuntimeError: verifier bug" in result.errors[0]
    assert "timed out" in result.errors[1]
    assert "exit code 3" in result.errors[2]
    assert "outside [0, 1]" in result.errors[3]
    assert "not a number" in result.errors[4]
    assert result.metrics["rewards/timeouts"] == 1
    assert result.metrics["rewards/errors"] == 4
    assert result.metrics["rewards/hangs/timeouts"] == 1
    assert result.metrics["rewards/crashes/errors"] == 1
    # the pool replaced the killed workers: the next batch is scored normally
    again = service.score([{"verifier": "math", "ground_truth": "2"}] * 3, [r"\boxed{2}"] * 3)
    np.testing.assert_allclose(again.rewards, [1, 1, 1])


def test_module_function_verifier_with_kwargs(service):
    rows = [
        {"verifier": f"{HERE}:keyword_count", "ground_truth": None,
         "verifier_kwargs": {"keyword": "cat"}},
        {"verifier": f"{HERE}:keyword_count", "ground_truth": None,
         "verifier_kwargs": {"keyword": "cat", "per_hit": 0.5}},
    ]  # fmt: skip
    result = service.score(rows, ["cat cat cat", "cat cat cat"])
    # 3 hits · 0.25 = 0.75; 3 hits · 0.5 = 1.5, capped at 1.0
    np.testing.assert_allclose(result.rewards, [0.75, 1.0])


def test_soft_overlong_penalty_is_added():
    rows = [{"verifier": "always_half", "ground_truth": None}] * 4
    with RewardService(RewardsConfig(), workers=1, overlong_buffer=4) as svc:
        result = svc.score(rows, ["r"] * 4, lengths=[10, 17, 20, 21], max_len=20)
    # 0.5 + penalty(L_max=20, L_c=4): 0, (16-17)/4 = -0.25, (16-20)/4 = -1, -1
    np.testing.assert_allclose(result.rewards, [0.5, 0.25, -0.5, -0.5])
    assert result.metrics["rewards/overlong/fraction"] == pytest.approx(0.75)
    assert result.metrics["rewards/overlong/mean"] == pytest.approx(-2.25 / 4)


def test_score_from_a_non_main_thread(service):
    out = {}

    def run():
        out["result"] = service.score([{"verifier": "math", "ground_truth": "9"}], [r"\boxed{9}"])

    t = threading.Thread(target=run)
    t.start()
    t.join(60)
    np.testing.assert_allclose(out["result"].rewards, [1.0])


def test_bad_batches_are_refused_with_the_row_named(service):
    with pytest.raises(ValueError, match=r"row 1: unknown verifier 'nope'"):
        service.score([{"verifier": "math", "ground_truth": "1"},
                       {"verifier": "nope", "ground_truth": "1"}], ["1", "1"])  # fmt: skip
    with pytest.raises(ValueError, match="row 0: missing field 'ground_truth'"):
        service.score([{"verifier": "math"}], ["1"])
    with pytest.raises(ValueError, match="row 0: verifier_kwargs"):
        service.score([{"verifier": "math", "ground_truth": "1", "verifier_kwargs": [1]}], ["1"])
    with pytest.raises(ValueError, match="2 rows but 1 responses"):
        service.score([{"verifier": "math", "ground_truth": "1"}] * 2, ["1"])
    with pytest.raises(ValueError, match="lengths and max_len together"):
        service.score([{"verifier": "math", "ground_truth": "1"}], ["1"], lengths=[3])
    with pytest.raises(ValueError, match=r"lengths has shape \(2,\), expected \(1,\)"):
        service.score([{"verifier": "math", "ground_truth": "1"}], ["1"], lengths=[3, 4], max_len=8)
    with pytest.raises(ValueError, match="judge verifier needs"):
        service.score([{"verifier": "judge", "ground_truth": None}], ["hi"])


def test_malformed_ground_truth_is_one_error_not_a_crash(service):
    result = service.score([{"verifier": "math", "ground_truth": ""}], [r"\boxed{1}"])
    assert result.statuses == ("error",)
    assert "ValueError" in result.errors[0] and "ground truth" in result.errors[0]


def test_empty_batch(service):
    result = service.score([], [])
    assert result.rewards.shape == (0,) and result.metrics["reward/mean"] == 0.0


def test_constructor_validation_and_close():
    with pytest.raises(ValueError, match="workers"):
        RewardService(workers=0)
    with pytest.raises(ValueError, match="timeout_s"):
        RewardService(timeout_s=0, workers=1)
    with pytest.raises(ValueError, match="overlong_buffer"):
        RewardService(workers=1, overlong_buffer=-1)
    svc = RewardService(RewardsConfig(workers=1))
    assert svc.num_workers == 1 and svc.timeout_s == 5.0
    pids = [w.process.pid for w in svc._pool._all]
    svc.close()
    svc.close()  # idempotent
    assert not any(_pid_alive(pid) for pid in pids)
    with pytest.raises(RuntimeError, match="closed"):
        svc.score([], [])


class _JudgeHandler(BaseHTTPRequestHandler):
    """/v1/chat/completions: scores 7/10 when the response mentions Paris, else replies
    without a score (a parse failure); keeps what it was asked (`seen`)."""

    seen: list[str] = []

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        text = body["messages"][-1]["content"]
        self.seen.append(text)
        reply = "Correct. SCORE: 7" if "Paris" in text.split("[Response]")[-1] else "no idea"
        payload = json.dumps({"choices": [{"message": {"content": reply}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass


def test_judge_rows_use_the_batch_api():
    pytest.importorskip("rlvr_jax.rewards.judge")
    server = ThreadingHTTPServer(("127.0.0.1", 0), _JudgeHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        config = RewardsConfig(
            judge_url=f"http://127.0.0.1:{server.server_port}/v1", judge_model="tiny-judge"
        )
        rows = [
            {"verifier": "judge", "ground_truth": "Paris", "prompt": "Capital of France?"},
            {"verifier": "judge", "ground_truth": None, "prompt": "Capital of France?"},
            {"verifier": "math", "ground_truth": "2"},
        ]
        with RewardService(config, workers=1) as svc:
            result = svc.score(rows, ["It is Paris.", "Lyon", r"\boxed{2}"])
    finally:
        server.shutdown()
    np.testing.assert_allclose(result.rewards, [0.7, 0.0, 1.0])
    assert result.metrics["rewards/judge/parse_failures"] == 1
    assert result.metrics["rewards/judge/request_errors"] == 0
    assert result.metrics["reward/judge"] == pytest.approx(0.35)


def test_prompt_rows_are_scored_as_loaded():
    """The trainer's `PromptRow`s go to the verifiers as they were loaded (validated then):
    the rewards of their data-row mappings, and a chat prompt reaches the judge's batch."""
    pytest.importorskip("rlvr_jax.rewards.judge")
    from rlvr_jax.data.rows import row_from_record

    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Capital?"}]
    records = [
        {"verifier": "judge", "ground_truth": "Paris", "prompt": chat, "domain": "geo"},
        {"verifier": "math", "ground_truth": "2", "prompt": "1 + 1?"},
    ]
    rows = [row_from_record(r, source="t", index=i, where="t") for i, r in enumerate(records)]
    server = ThreadingHTTPServer(("127.0.0.1", 0), _JudgeHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _JudgeHandler.seen = []
    try:
        config = RewardsConfig(
            judge_url=f"http://127.0.0.1:{server.server_port}/v1", judge_model="tiny-judge"
        )
        with RewardService(config, workers=1) as svc:
            result = svc.score(rows, ["It is Paris.", r"\boxed{2}"])
            as_dicts = svc.score(records, ["It is Paris.", r"\boxed{2}"])
    finally:
        server.shutdown()
    np.testing.assert_allclose(result.rewards, [0.7, 1.0])
    np.testing.assert_array_equal(result.rewards, as_dicts.rewards)
    assert result.domains == ("geo", "math") and result.verifiers == ("judge", "math")
    assert len(_JudgeHandler.seen) == 2
    assert all("system: Be brief.\n\nuser: Capital?" in text for text in _JudgeHandler.seen)


@pytest.mark.slow
def test_code_rows_run_their_sandbox_inside_a_worker(service):
    code = pytest.importorskip("rlvr_jax.rewards.code")
    if not hasattr(code, "reward"):
        pytest.skip("rlvr_jax.rewards.code.reward is not built yet")
    tests = [{"call": "add", "args": [1, 2], "expected": 3}, "assert add(2, 2) == 4"]
    rows = [{"verifier": "code", "ground_truth": tests}] * 2
    responses = ["```python\ndef add(a, b):\n    return a + b\n```",
                 "```python\ndef add(a, b):\n    return a - b\n```"]  # fmt: skip
    with RewardService(RewardsConfig(timeout_s=30.0), workers=2) as svc:
        result = svc.score(rows, responses)
    if any("SandboxUnavailable" in e for e in result.errors.values()):
        pytest.skip(f"no sandbox on this machine: {result.errors}")
    assert result.statuses == ("ok", "ok"), result.errors
    np.testing.assert_allclose(result.rewards, [1.0, 0.0])  # a - b passes neither test


# -- the worker pool ---------------------------------------------------------------------------
def test_pool_runs_targets_and_reports_failures():
    with WorkerPool(1) as pool:
        ok = pool.call("operator:add", (2, 3), timeout_s=5)
        assert ok.ok and ok.value == 5
        assert pool.call(f"{HERE}:report_in_worker", timeout_s=5).value is True
        err = pool.call(f"{HERE}:crashes", ("r", None), timeout_s=5)
        assert err.status == "error" and "verifier bug" in err.error
        missing = pool.call("no_such_module_xyz:f", timeout_s=5)
        assert missing.status == "error" and "cannot import" in missing.error
        unpicklable = pool.call("operator:add", (threading.Lock(), 1), timeout_s=5)
        assert unpicklable.status == "error" and "cannot send" in unpicklable.error
        assert pool.call("operator:mul", (4, 5), timeout_s=5).value == 20  # still healthy


@pytest.mark.slow
def test_timeout_kills_the_worker_and_everything_it_started(tmp_path):
    pid_file = tmp_path / "child.pid"
    with WorkerPool(1) as pool:
        pool.call("operator:add", (1, 1), timeout_s=5)  # wait for the worker to be up
        start = time.perf_counter()
        result = pool.call(f"{HERE}:spawn_child_then_hang", ("r", str(pid_file)), timeout_s=1.5)
        assert result.status == "timeout"
        assert 1.5 <= time.perf_counter() - start < 1.5 + 3.0
        child = int(pid_file.read_text())
        deadline = time.time() + 5
        while _pid_alive(child) and time.time() < deadline:
            time.sleep(0.05)
        assert not _pid_alive(child), "the verifier's child process outlived the timeout"
        assert pool.timeouts == 1
        assert pool.call("operator:add", (1, 2), timeout_s=5).value == 3  # respawned


def test_memory_limit_turns_a_memory_bomb_into_an_error():
    with WorkerPool(1, memory_mb=512) as pool:
        bomb = pool.call("builtins:bytearray", (2 << 30,), timeout_s=10)  # 2 GiB
        assert bomb.status == "error" and "MemoryError" in bomb.error
        assert len(pool.call("builtins:bytearray", (1 << 20,), timeout_s=10).value) == 1 << 20


def test_pool_argument_validation():
    with pytest.raises(ValueError, match="num_workers"):
        WorkerPool(0)
    with pytest.raises(ValueError, match="memory_mb"):
        WorkerPool(1, memory_mb=1)
    with WorkerPool(1) as pool, pytest.raises(ValueError, match="timeout_s"):
        pool.call("operator:add", (1, 2), timeout_s=0)
    with pytest.raises(RuntimeError, match="closed"):
        pool.call("operator:add", (1, 2), timeout_s=1)


# -- the registry ------------------------------------------------------------------------------
def test_builtin_names_resolve_lazily():
    assert verifier_target("math") == "rlvr_jax.rewards.math:reward"
    assert verifier_target("code") == "rlvr_jax.rewards.code:reward"
    assert verifier_target("ifeval") == "rlvr_jax.rewards.ifeval:reward"
    assert verifier_target("judge") == "rlvr_jax.rewards.judge:reward"
    assert verifier_target("pkg.mod:fn") == "pkg.mod:fn"
    assert registry.get_verifier("math")(r"\boxed{2}", "2") == 1.0
    assert {"math", "code", "ifeval", "judge", "always_half"} <= set(registry.known_verifiers())


def test_registered_verifier_target_is_importable():
    target = verifier_target("always_half")
    assert target == f"{HERE}:always_half"
    assert resolve_target(target) is always_half


def test_registry_refuses_bad_registrations():
    with pytest.raises(ValueError, match="unknown verifier 'nope'"):
        verifier_target("nope")
    with pytest.raises(ValueError, match="module-level function"):
        register_verifier("lambda_v")(lambda r, g: 1.0)

    def nested(response, ground_truth):
        return 1.0

    with pytest.raises(ValueError, match="module-level function"):
        register_verifier("nested_v")(nested)
    with pytest.raises(ValueError, match="already taken"):
        register_verifier("math")(always_half)
    with pytest.raises(ValueError, match="plain identifier"):
        register_verifier("a:b")
    assert register_verifier("always_half")(always_half) is always_half  # re-import is fine


def test_resolve_target_errors():
    with pytest.raises(ValueError, match="module:function"):
        resolve_target("no_colon")
    with pytest.raises(ValueError, match="has no attribute"):
        resolve_target("operator:no_such_fn")
    with pytest.raises(ValueError, match="not callable"):
        resolve_target("math:pi")


# -- the throughput benchmark (`rlvr-bench verifiers`) ----------------------------------------
def test_bench_verifiers_runs_and_writes_json(tmp_path, capsys):
    from rlvr_jax.bench import verifiers as bench

    cases = bench.math_mix(200, seed=0)
    correct = sum(verify(r, g) for r, g in cases[:40])
    assert 0 < correct < 40  # the mix holds right and wrong answers
    out = tmp_path / "bench.json"
    from rlvr_jax.cli import bench_main

    argv = ["verifiers", "--n", "30", "--workers", "1", "--code-n", "1", "--json", str(out)]
    assert bench_main(argv) == 0
    result = json.loads(out.read_text())
    rates = result["math"]["verifications_per_s"]
    assert set(rates) == {
        "sequential_verify",
        "sequential_verify_sympy_cases_only",
        "service_1_workers",
    }
    assert all(rate > 0 for rate in rates.values())
    assert 0 < result["math"]["inline_fraction"] < 1
    assert result["math"]["service_errors"] == 0
    assert "programs_per_s" in result["code"] or "skipped" in result["code"]
    assert "math/verifications_per_s/service_1_workers" in capsys.readouterr().out


@pytest.mark.slow
def test_workers_exit_when_their_parent_is_killed():
    code = (
        "from rlvr_jax.rewards.timeout import WorkerPool\n"
        "pool = WorkerPool(2)\n"
        "pool.call('operator:add', (1, 1), timeout_s=30)\n"
        "import threading, time\n"  # one worker busy (watchdog exit), one idle (EOF exit)
        "threading.Thread(target=pool.call, args=('time:sleep', (60,)), kwargs={'timeout_s': 90},"
        " daemon=True).start()\n"
        "time.sleep(0.5)\n"
        "print(' '.join(str(w.process.pid) for w in pool._all), flush=True)\n"
        "time.sleep(60)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    pids = [int(p) for p in parent.stdout.readline().split()]
    assert len(pids) == 2 and all(_pid_alive(p) for p in pids)
    parent.kill()  # SIGKILL: no atexit, no cleanup in the parent
    parent.wait()
    deadline = time.time() + 10
    while any(_pid_alive(p) for p in pids) and time.time() < deadline:
        time.sleep(0.1)
    assert not any(_pid_alive(p) for p in pids), "orphaned workers kept running"


def test_bench_verifiers_rejects_bad_arguments(capsys):
    from rlvr_jax.bench import table

    with pytest.raises(SystemExit) as exit_info:
        table.parse("verifiers", ["--n", "0"])
    assert exit_info.value.code == 2
    assert "must be >= 1" in capsys.readouterr().err
