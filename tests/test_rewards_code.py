"""The code verifier: test kinds, scoring modes, program extraction, ground-truth validation.

Unit tests of the pure parts run everywhere; tests that execute programs need the strict
sandbox (or, for the weak-mode test, the weak one) and are skipped with the reason otherwise.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import sysconfig
import time

import pytest

from rlvr_jax.rewards.code import (
    SandboxError,
    SandboxLimits,
    SandboxUnavailableError,
    TestOutcome,
    check_program,
    extract_program,
    plain,
    reward,
    run_tests,
)
from rlvr_jax.rewards.code.cases import (
    AssertEqualTest,
    AssertTest,
    CallTest,
    StdioTest,
    normalize_stdout,
    parse_test,
    parse_tests,
)
from rlvr_jax.rewards.code.sandbox import (
    _read_until,
    collect_outcomes,
    parse_frames,
    run_sandboxed,
)
from rlvr_jax.rewards.code.verifier import parse_ground_truth


def _strict_unavailable_reason() -> str | None:
    try:
        run_sandboxed("pass", [{"kind": "exec", "source": "pass"}])
    except SandboxUnavailableError as err:
        return str(err)
    return None


_REASON = _strict_unavailable_reason() if sys.platform.startswith("linux") else "not Linux"
needs_sandbox = pytest.mark.skipif(_REASON is not None, reason=f"strict sandbox: {_REASON}")

ADD_STDIO = "a, b = map(int, input().split())\nprint(a + b)\n"
ADD_FUNCTION = "def add(a, b):\n    return a + b\n"


# ---------------------------------------------------------------- pure parts (no sandbox) ----


def test_canonical_json_normalizes_containers_and_numbers():
    # tuples are lists; integral floats are ints; dict keys follow json.dumps; sets sort.
    assert plain.canonical_json((1, 2.0, [3.5])) == "[1,2,[3.5]]"
    assert plain.canonical_json({2: "b", "a": None, True: 1}) == '{"2":"b","a":null,"true":1}'
    assert plain.canonical_json({3, 1, 2}) == '{"__set__":[1,2,3]}'
    assert plain.canonical_json(1 + 2j) == '{"__complex__":[1,2]}'
    assert plain.canonical_json(b"\x01\xff") == '{"__bytes__":"01ff"}'
    # A real dict shaped like a tag cannot pass for a set.
    assert plain.canonical_json({"__set__": [1]}) == '{"__dict__":{"__set__":[1]}}'
    assert plain.canonical_json(float("inf")) == "Infinity"


@pytest.mark.parametrize(
    "value",
    [
        type("Liar", (), {"__eq__": lambda self, other: True})(),
        type("LyingInt", (int,), {"__eq__": lambda self, other: True})(3),
        type("MyList", (list,), {})([1]),
        [object()],
        {(1, 2): "tuple key"},
        10**5000,  # more digits than int->str allows
    ],
    ids=["lying-eq", "int-subclass", "list-subclass", "object", "tuple-key", "huge-int"],
)
def test_canonical_json_refuses_non_plain_values(value):
    with pytest.raises(plain.NotPlainError):
        plain.canonical_json(value)


def test_canonical_json_refuses_cycles_and_trusted_accepts_them():
    cyclic: list = []
    cyclic.append(cyclic)
    with pytest.raises(plain.NotPlainError, match="deeper"):
        plain.canonical_json(cyclic)
    assert plain.trusted(cyclic) is cyclic
    assert plain.trusted({"a": [1, (2.5, {3})], "b": int}) is not None
    with pytest.raises(plain.NotPlainError, match="Liar"):
        plain.trusted([1, {"k": type("Liar", (), {})()}])


def test_normalize_stdout_ignores_trailing_whitespace_only():
    assert normalize_stdout("1 2  \r\n3\n\n\n") == ["1 2", "3"]
    assert normalize_stdout("1 2\n3") == normalize_stdout("1 2\n3\n")
    assert normalize_stdout(" 3") != normalize_stdout("3")  # leading spaces count
    assert normalize_stdout("1\n\n2") != normalize_stdout("1\n2")  # inner blank lines count


def test_parse_test_kinds_and_requests_never_carry_expected_values():
    secret = "EXPECTED-7f3a"
    stdio = parse_test({"stdin": "1 2\n", "stdout": secret})
    call = parse_test({"call": "f", "args": [1, (2, 3)], "kwargs": {"k": 4}, "expected": secret})
    equal = parse_test(f"assert f(1) == {secret!r}")
    reverse = parse_test(f"assert {secret!r} == f(1)")
    both = parse_test("assert f(1) == g(2)")
    generic = parse_test(f"assert f(1).startswith({secret[:3]!r}) or f(2) != 3")
    assert isinstance(stdio, StdioTest) and isinstance(call, CallTest)
    assert isinstance(equal, AssertEqualTest) and equal.exprs == ("f(1)",)
    assert isinstance(reverse, AssertEqualTest) and reverse.exprs == ("f(1)",)
    assert isinstance(both, AssertEqualTest) and both.exprs == ("f(1)", "g(2)")
    assert both.expected_json is None
    assert isinstance(generic, AssertTest)
    for case in (stdio, call, equal, reverse, both):
        assert secret not in json.dumps(case.request())
    assert call.request() == {"kind": "call", "name": "f", "args": [1, [2, 3]], "kwargs": {"k": 4}}
    guarded = generic.request()["source"]
    assert guarded.count(plain.TRUSTED_NAME) == 5  # assert test, 2 or-operands, 2 compare sides
    assert guarded.startswith(f"assert {plain.TRUSTED_NAME}(")


@pytest.mark.parametrize(
    ("test", "message"),
    [
        (42, "code test 0: expected a dict or an assert string, got int"),
        ({"stdin": "1"}, r"missing key\(s\) \['stdout'\]"),
        ({"stdin": 1, "stdout": "2"}, "'stdin' must be a string"),
        ({"stdin": "", "stdout": "", "extra": 1}, r"unknown key\(s\) \['extra'\]"),
        ({"call": "f"}, r"missing key\(s\) \['expected'\]"),
        ({"call": "f(x)", "expected": 1}, "'call' must be a name"),
        ({"call": "f", "args": "12", "expected": 1}, "'args' must be a list"),
        ({"call": "f", "kwargs": {1: 2}, "expected": 1}, "'kwargs' must be a dict"),
        ({"call": "f", "expected": object()}, "must be JSON data"),
        ({"input": "1", "output": "2"}, "needs 'stdin'/'stdout' or 'call'"),
        ("assert f(1) ==", "does not parse"),
        ("   ", "test code is empty"),
    ],
)
def test_malformed_tests_raise_clear_errors(test, message):
    with pytest.raises(ValueError, match=message):
        parse_tests([test])


@pytest.mark.parametrize(
    ("ground_truth", "message"),
    [
        ([], "code tests list is empty"),
        ("not json", "not JSON"),
        ({"cases": []}, "needs a 'tests' key"),
        ({"tests": ["assert 1"], "mode": "best"}, "mode must be one of"),
        ({"tests": "assert f()"}, "tests must be a list"),
        (7, "tests must be a list, got int"),
    ],
)
def test_malformed_ground_truth_raises_value_error(ground_truth, message):
    with pytest.raises(ValueError, match=message):
        reward("```python\nx = 1\n```", ground_truth)


def test_parse_ground_truth_forms():
    tests = ["assert f() == 1"]
    assert parse_ground_truth(tests) == (tests, None)
    assert parse_ground_truth({"tests": tests, "mode": "all"}) == (tests, "all")
    assert parse_ground_truth(json.dumps({"tests": tests})) == (tests, None)


def test_extract_program():
    assert extract_program("Here:\n```python\nx = 1\n```\nthen\n```py\ny = 2\n```\n") == "y = 2\n"
    assert extract_program("```python\nx = 1\n```\n```\nplain = 1\n```") == "x = 1\n"
    assert extract_program("```cpp\nint x;\n```\nprose\n```\nz = 3\n```") == "z = 3\n"
    thinking = "<think>\n```python\ndraft = 1\n```\n</think>\n```python\nfinal = 1\n```"
    assert extract_program(thinking) == "final = 1\n"
    assert extract_program("cut off:\n```python\nx = 1\ny =") == "x = 1\ny ="
    assert extract_program("print(1)") == "print(1)"


def test_frames_need_the_run_token():
    token = "ab" * 16
    data = (
        f'{token} {{"ready": true}}\n'
        '00000000000000000000000000000000 {"index": 0, "status": "ok"}\n'
        f"{token} not json\n"
        f'{token} {{"index": 0, "status": "ok", "values": ["1"]}}\n'
    ).encode()
    frames = parse_frames(data, token)
    assert frames == [{"ready": True}, {"index": 0, "status": "ok", "values": ["1"]}]
    outcomes = collect_outcomes(frames, 2, "strict", 0, b"")
    assert outcomes[0] == TestOutcome("ok", values=("1",))
    assert outcomes[1].status == "missing"


def test_collect_outcomes_raises_on_setup_error_or_no_start():
    with pytest.raises(SandboxUnavailableError, match="strict sandbox isolation is unavailable"):
        collect_outcomes([{"setup_error": "unshare failed"}], 1, "strict", 3, b"")
    with pytest.raises(SandboxError, match=r"launcher failed \(exit status 1\): Traceback"):
        collect_outcomes([], 1, "strict", 1, b"Traceback (most recent call last)")


def test_parent_reads_launcher_output_under_a_cap_and_a_deadline():
    flood = "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n"
    sleeper = "import time\ntime.sleep(60)\n"
    for source, cap, deadline_s in ((flood, 200_000, 30.0), (sleeper, 10, 0.3)):
        proc = subprocess.Popen(
            [sys.executable, "-c", source], stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        start = time.monotonic()
        try:
            stdout, stderr = _read_until(proc, start + deadline_s, {"stdout": cap, "stderr": cap})
        finally:
            proc.kill()
            proc.wait()
        assert time.monotonic() - start < min(deadline_s, 10.0) + 1.0
        assert len(stdout) <= cap + 65536 and stderr == b""
        assert len(stdout) > cap if source is flood else stdout == b""


@pytest.mark.parametrize(
    "kwargs",
    [{"timeout_s": 0}, {"memory_mb": 10}, {"max_processes": 2.5}, {"tmpfs_mb": True}],
)
def test_sandbox_limits_validation(kwargs):
    with pytest.raises(ValueError, match=f"SandboxLimits.{next(iter(kwargs))}"):
        SandboxLimits(**kwargs)


def test_unknown_isolation_and_mode_are_rejected():
    with pytest.raises(ValueError, match="isolation must be one of"):
        run_sandboxed("pass", [], isolation="none")
    with pytest.raises(ValueError, match="mode must be one of"):
        run_tests(ADD_FUNCTION, ["assert add(1, 2) == 3"], mode="most")


# ------------------------------------------------------------- programs in the sandbox ----


@needs_sandbox
def test_stdio_tests_score_the_fraction_passed():
    tests = [
        {"stdin": "1 2\n", "stdout": "3\n"},
        {"stdin": "10 -4\n", "stdout": "6"},  # no trailing newline: still equal
        {"stdin": "2 2\n", "stdout": "5\n"},  # wrong expectation: fails
    ]
    assert run_tests(ADD_STDIO, tests) == pytest.approx(2 / 3)
    assert run_tests(ADD_STDIO, tests, mode="all") == 0.0
    assert run_tests(ADD_STDIO, tests[:2], mode="all") == 1.0


@needs_sandbox
def test_stdio_programs_may_exit_and_use_the_standard_library():
    program = (
        "import sys, heapq, collections, itertools, fractions, re\n"
        "data = sys.stdin.read().split()\n"
        "values = sorted(map(int, data))\n"
        "print(*heapq.nsmallest(2, values), collections.Counter(values).most_common(1)[0][0])\n"
        "exit()\n"
        "print('unreachable')\n"
    )
    assert run_tests(program, [{"stdin": "5 3 3 9\n", "stdout": "3 3 3\n"}]) == 1.0
    failing = "import sys\nprint(42)\nsys.exit(1)\n"
    (result,) = check_program(failing, [{"stdin": "", "stdout": "42\n"}])
    assert not result.passed and result.outcome.status == "error"


@needs_sandbox
def test_call_tests_compare_json_values():
    program = (
        "def pair(a, b=0):\n    return (a, b * 1.0)\n"
        "def boom():\n    raise ValueError('no')\n"
        "class Solution:\n    def twice(self, xs):\n        return [2 * x for x in xs]\n"
    )
    tests = [
        {"call": "pair", "args": [1], "kwargs": {"b": 2}, "expected": [1, 2]},  # tuple, 2.0
        {"call": "pair", "args": [1, 2], "expected": [1, 3]},
        {"call": "Solution.twice", "args": [[1, 2]], "expected": [2, 4]},
        {"call": "boom", "expected": None},
        {"call": "missing", "expected": None},
    ]
    results = check_program(program, tests)
    assert [r.passed for r in results] == [True, False, True, False, False]
    assert results[3].outcome.detail == "ValueError: no"
    assert results[4].outcome.detail.startswith("NameError")
    assert run_tests(program, tests) == pytest.approx(2 / 5)


@needs_sandbox
def test_assert_tests_equal_and_generic():
    program = ADD_FUNCTION + "import math\ndef root(x):\n    return math.sqrt(x)\n"
    tests = [
        "assert add(1, 2) == 3",
        "assert 5 == add(2, 3)",
        "assert add(1, 1) == add(0, 2)",
        "assert add([1], [2]) == [1, 2]",
        "assert abs(root(2) - 1.41421) < 1e-4",
        "x = add(2, 2)\nassert x == 4, 'message'\nassert not x == 5",
        "assert add(1, 2) == 4",  # wrong
        "assert root(-1) > 0",  # raises ValueError
    ]
    results = check_program(program, tests)
    assert [r.passed for r in results] == [True] * 6 + [False, False]
    assert run_tests(program, tests) == pytest.approx(6 / 8)


@needs_sandbox
def test_reward_end_to_end():
    response = (
        "<think>\n```python\ndef add(a, b):\n    return a - b\n```\n</think>\n"
        "The answer:\n```python\n" + ADD_FUNCTION + "```\n"
    )
    tests = ["assert add(1, 2) == 3", {"call": "add", "args": [2, 2], "expected": 5}]
    assert reward(response, tests) == 0.5
    assert reward(response, {"tests": tests, "mode": "all"}) == 0.0
    assert reward(response, json.dumps({"tests": tests[:1]})) == 1.0
    assert reward(response, tests, mode="all") == 0.0
    assert reward(response, {"tests": tests, "mode": "fraction"}, mode="all") == 0.5


@needs_sandbox
@pytest.mark.parametrize(
    "response",
    ["", "I don't know.", "```python\ndef add(a, b) return\n```", "\x00\ud800", None],
)
def test_reward_of_bad_model_text_is_zero(response):
    assert reward(response, ["assert add(1, 2) == 3"]) == 0.0


def _python_library_world_readable() -> bool:
    for path in (sysconfig.get_path("stdlib"), sysconfig.get_path("platstdlib")):
        parts = os.path.realpath(path).split("/")
        for depth in range(1, len(parts) + 1):
            mode = os.stat("/".join(parts[:depth]) or "/").st_mode
            if not mode & stat.S_IXOTH:
                return False
    return True


def test_weak_isolation_is_an_explicit_opt_in():
    """Weak mode runs the tests with limits only; as root it drops to a sandbox uid, and refuses
    when that uid could not read the Python library (the strict mode's new root exposes it)."""
    program = ADD_FUNCTION + "import os\ndef uid():\n    return os.getuid()\n"
    tests = ["assert add(1, 2) == 3", "assert add(1, 2) == 4", {"call": "uid", "expected": 0}]
    if os.geteuid() == 0 and not _python_library_world_readable():
        with pytest.raises(SandboxUnavailableError, match="cannot read the Python library"):
            run_tests(program, tests, isolation="weak")
        return
    results = check_program(program, tests, isolation="weak")
    assert [r.passed for r in results[:2]] == [True, False]
    uid = json.loads(results[2].outcome.values[0])
    assert uid != 0 if os.geteuid() == 0 else uid == os.geteuid()
