"""Math verifier end to end: the hand-judged corpus, the failure modes named in issue 4, safety
(no eval of model text), hard timeouts (also off the main thread) and argument validation."""

import ast
import builtins
import json
import pathlib
import threading
import time

import pytest

from rlvr_jax.rewards import math as math_verifier
from rlvr_jax.rewards.math import reward, verify
from rlvr_jax.rewards.math.compare import symbolic_match_any
from rlvr_jax.rewards.timeout import shared_pool

CORPUS = pathlib.Path(__file__).parent / "data" / "math_corpus.jsonl"
PACKAGE = pathlib.Path(math_verifier.__file__).parent

# Equal in value (x+1)^3000, but proving it means expanding a degree-3000 polynomial: SymPy
# takes far longer than any timeout used here, so only the hard kill can end the call.
SLOW_GOLD = "(x+1)^{3000}"
SLOW_RESPONSE = r"\boxed{(x^2+2x+1)^{1500}}"


def _corpus():
    return [json.loads(line) for line in CORPUS.read_text().splitlines() if line.strip()]


def test_corpus_agreement_is_total():
    rows = _corpus()
    assert len(rows) >= 150
    assert {r["expected"] for r in rows} == {0, 1}
    agree, disagreements, known = 0, [], []
    for i, row in enumerate(rows):
        got = verify(row["response"], row["gold"])
        if got == row["expected"]:
            agree += 1
        elif "known_disagreement" in row:
            known.append((i, row["note"], row["known_disagreement"]))
        else:
            disagreements.append((i, row["note"], row["gold"], row["response"][:80], got))
    print(
        f"\nmath corpus: {agree}/{len(rows)} agree with the hand labels ({agree / len(rows):.1%})"
    )
    for i, note, reason in known:
        print(f"  known disagreement #{i} ({note}): {reason}")
    assert not disagreements, disagreements
    # every documented disagreement is real (the verifier still disagrees) and has a reason
    assert all(reason for _, _, reason in known)
    assert len(known) == sum("known_disagreement" in r for r in rows) == 4


def test_corpus_covers_the_named_failure_modes():
    notes = " ".join(r["note"] for r in _corpus())
    for topic in ("thousands", "dfrac", "left/right", "unit", "degrees", "text", "dollar",
                  "percent", "prefix", "mcq", "interval", "set", "tuple", "matrix", "pm",
                  "infinity", "tiny values", "power tower", "injection"):  # fmt: skip
        assert topic in notes, topic


def test_tiny_values_are_compared_exactly():
    # 1/2004! and 1/2006! differ by a factor 2005*2006; both are < 1e-5000, so any float
    # tolerance would call them equal.
    assert verify(r"\boxed{\frac{1}{2006!}}", r"\frac{1}{2004!}") == 0.0
    assert verify(r"\boxed{\frac{2005 \cdot 2006}{2006!}}", r"\frac{1}{2004!}") == 1.0


def test_power_tower_returns_zero_fast():
    start = time.perf_counter()
    assert verify(r"\boxed{2^{2^{2^{2^{2^{2}}}}}}", "2", timeout_s=5.0) == 0.0
    assert verify(r"\boxed{9^{9^{9^{9}}}}", "1", timeout_s=5.0) == 0.0
    assert time.perf_counter() - start < 5.0


def test_code_in_the_answer_is_never_executed(tmp_path):
    marker = tmp_path / "pwned"
    response = rf"\boxed{{__import__('os').system('touch {marker}')}}"
    assert verify(response, "0") == 0.0
    assert verify(r"\boxed{eval('2+2')}", "4") == 0.0
    assert not marker.exists()


def test_symbolic_path_calls_no_eval_or_exec(monkeypatch):
    calls = []

    def spy(name, real):
        def wrapper(*args, **kwargs):
            if args and isinstance(args[0], str | bytes):  # text, not an imported module's code
                calls.append((name, args[0]))
            return real(*args, **kwargs)

        return wrapper

    monkeypatch.setattr(builtins, "eval", spy("eval", builtins.eval))
    monkeypatch.setattr(builtins, "exec", spy("exec", builtins.exec))
    for row in _corpus():
        symbolic_match_any(row["response"], (row["gold"],))
    assert symbolic_match_any(r"__import__('os').getcwd()", ("0",)) is False
    assert calls == []


def test_package_source_has_no_eval_exec_or_sympify():
    banned_names = {"eval", "exec", "compile", "__import__", "sympify", "parse_expr"}
    banned_attrs = {"eval", "exec", "sympify", "parse_expr", "parse_latex", "S"}
    for path in PACKAGE.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                assert node.func.id not in banned_names, f"{path.name}:{node.lineno}"
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                assert node.func.attr not in banned_attrs, f"{path.name}:{node.lineno}"


@pytest.mark.slow
def test_pathological_input_is_killed_within_the_timeout():
    verify(r"\boxed{x+1}", "1+x")  # warm the shared pool
    start = time.perf_counter()
    assert verify(SLOW_RESPONSE, SLOW_GOLD, timeout_s=1.0) == 0.0
    elapsed = time.perf_counter() - start
    assert 1.0 <= elapsed < 1.0 + 3.0, elapsed  # the kill, not SymPy, ended the call
    assert shared_pool().timeouts >= 1


@pytest.mark.slow
def test_timeout_works_off_the_main_thread():
    verify(r"\boxed{x+1}", "1+x")  # warm the shared pool
    results = {}

    def run(key, response, gold):
        start = time.perf_counter()
        results[key] = (verify(response, gold, timeout_s=1.0), time.perf_counter() - start)

    threads = [
        threading.Thread(target=run, args=("slow", SLOW_RESPONSE, SLOW_GOLD)),
        threading.Thread(target=run, args=("fine", r"\boxed{\sqrt{8}}", r"2\sqrt{2}")),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert results["slow"][0] == 0.0 and results["slow"][1] < 1.0 + 3.0
    assert results["fine"][0] == 1.0


@pytest.mark.parametrize(
    "response",
    [
        "\\boxed{" * 20_000,  # unclosed boxes: a naive brace matcher is quadratic
        "</think>" * 50_000,
        "<think>" * 50_000,
        "The answer is " + "\\text{" * 20_000,
        "The answer is 5" + " " * 200_000 + "cm",
        "The final answer is " + "1 and " * 50_000,
    ],
)
def test_adversarial_text_is_handled_in_linear_time(response):
    start = time.perf_counter()
    verify(response, "5")
    assert time.perf_counter() - start < 3.0


def test_list_of_golds_accepts_any():
    assert verify(r"\boxed{0.5}", ["1/3", r"\frac{1}{2}"]) == 1.0
    assert verify(r"\boxed{0.25}", ["1/3", r"\frac{1}{2}"]) == 0.0


def test_boxed_gold_solution_is_reduced_to_its_answer():
    assert verify(r"\boxed{7}", r"so the answer is $\boxed{7}$.") == 1.0


def test_fallback_none_requires_an_explicit_answer():
    text = "so we get 48 + 24 = 72"
    assert verify(text, "72", fallback="last_number") == 1.0
    assert verify(text, "72", fallback="none") == 0.0


@pytest.mark.parametrize("gold", [None, "", "   ", [], [""], 42, {"answer": "1"}])
def test_malformed_gold_raises(gold):
    with pytest.raises(ValueError, match="ground truth"):
        verify(r"\boxed{1}", gold)


def test_bad_arguments_raise_clearly():
    with pytest.raises(ValueError, match="fallback"):
        verify("1", "1", fallback="first_number")
    with pytest.raises(ValueError, match="timeout_s"):
        verify("1", "1", timeout_s=0)


def test_non_string_response_scores_zero():
    assert verify(None, "1") == 0.0  # type: ignore[arg-type]


def test_reward_is_the_registry_entry_point():
    assert reward(r"\boxed{\frac{1}{2}}", "0.5") == 1.0
    assert reward(r"I think 7", "7", fallback="none") == 0.0
