"""Environments and tools (`rlvr_jax.envs`): Hermes tool-call parsing, JSON schemas from
typed functions, bounded tool calls (errors and timeouts come back as text), the built-in
calculator and python tools, the chat template with tools, episodes driven turn by turn
(the engine's hook: observation tokens, budgets, max_turns, failing environments), the
gymnasium adapter, the registry and the config checks."""

from __future__ import annotations

import string
import time
from pathlib import Path
from typing import Literal

import gymnasium
import pytest

import rlvr_jax
from rlvr_jax.config import ConfigError, load
from rlvr_jax.config.schema import EnvConfig
from rlvr_jax.data import load_tokenizer
from rlvr_jax.envs import (
    ChatFormat,
    EnvRunner,
    ToolCall,
    ToolEnv,
    calculator,
    env_factory,
    episode_metrics,
    make_tool,
    parse_tool_calls,
)
from rlvr_jax.envs.tools import call_tool

DEMO_TOKENIZER = Path(rlvr_jax.__file__).parent / "demo" / "assets" / "base"
CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "48213 + 90877"}}</tool_call>'


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(DEMO_TOKENIZER)


def test_parse_hermes_tool_calls():
    text = f'Let me compute. {CALL} and <tool_call>{{"name": "python", "arguments": "{{\\"code\\": \\"print(1)\\"}}"}}</tool_call>'
    assert parse_tool_calls(text) == [
        ToolCall("calculator", {"expression": "48213 + 90877"}),
        ToolCall("python", {"code": "print(1)"}),  # arguments given as a JSON string
    ]
    assert parse_tool_calls("The answer is \\boxed{3}.") == []
    bad = parse_tool_calls('<tool_call>{"name": 3}</tool_call><tool_call>{oops</tool_call>')
    assert "name" in bad[0] and "not valid JSON" in bad[1]
    assert parse_tool_calls('<tool_call>{"name": "f", "arguments": [1]}</tool_call>')[0].endswith(
        "must be a JSON object"
    )
    # a model that never closes its call: the error is reported, the closed ones still run
    unclosed = parse_tool_calls(f'{CALL} <tool_call>{{"name": "calculator", "argu')
    assert unclosed[0] == ToolCall("calculator", {"expression": "48213 + 90877"})
    assert "never closed" in unclosed[1]


def lookup(city: str, days: int, unit: Literal["C", "F"] = "C", tags: list[str] | None = None):
    """Weather forecast for a city.

    A longer description that is not part of the summary.

    Args:
      city: the city's name.
      days: how many days
        ahead.
      unit: temperature unit.
    """
    return {"city": city, "days": days, "unit": unit}


def test_schema_from_a_typed_function():
    tool = make_tool(lookup)
    f = tool.schema["function"]
    assert tool.schema["type"] == "function" and f["name"] == "lookup"
    assert f["description"] == "Weather forecast for a city."
    props = f["parameters"]["properties"]
    assert props["city"] == {"type": "string", "description": "the city's name."}
    assert props["days"] == {"type": "integer", "description": "how many days ahead."}
    assert props["unit"]["enum"] == ["C", "F"] and props["unit"]["type"] == "string"
    assert props["tags"] == {"type": "array", "items": {"type": "string"}}
    assert f["parameters"]["required"] == ["city", "days"]

    def untyped(x):
        return x

    with pytest.raises(TypeError, match="'x' needs a type annotation"):
        make_tool(untyped)


def test_tool_calls_never_raise():
    tool = make_tool(lookup)
    assert call_tool(tool, {"city": "Oslo", "days": 2}, 1.0)[:2] == (
        '{"city": "Oslo", "days": 2, "unit": "C"}',
        True,
    )
    text, ok, _ = call_tool(tool, {"city": "Oslo"}, 1.0)
    assert not ok and text.startswith("error: bad arguments for lookup")

    def boom(x: int) -> int:
        """Fails."""
        raise KeyError("nope")

    def slow(x: int) -> int:
        """Hangs."""
        time.sleep(5)
        return x

    assert call_tool(make_tool(boom), {"x": 1}, 1.0)[:2] == ("error: KeyError: 'nope'", False)
    start = time.perf_counter()
    text, ok, seconds = call_tool(make_tool(slow), {"x": 1}, 0.2)
    assert not ok and text == "error: slow timed out after 0.2 s"
    assert time.perf_counter() - start < 2.0 and seconds >= 0.2


def test_calculator_is_exact_and_bounded():
    assert calculator("48213 + 90877") == "139090"
    assert calculator("123456789 * 987654321") == str(123456789 * 987654321)
    assert calculator("(7 - 10) ** 3 // 2") == "-14" and calculator("6 / 4") == "1.5"
    assert calculator("8 / 4") == "2"
    for bad in ("9 ** 9 ** 9", "__import__('os')", "x + 1", "1 +"):
        with pytest.raises(ValueError):
            calculator(bad)


def test_tool_env_runs_tools_and_reports_errors():
    env = ToolEnv(["calculator", "python"], timeout_s=20.0)
    assert [t["function"]["name"] for t in env.tools] == ["calculator", "python"]
    assert env.reset({"prompt": "Add."}) == [{"role": "user", "content": "Add."}]
    step = env.step(CALL)
    assert not step.done and step.observation == [
        {"role": "tool", "name": "calculator", "content": "139090"}
    ]
    assert step.info["tool_calls"] == 1 and step.info["tool_errors"] == 0
    step = env.step(
        '<tool_call>{"name": "python", "arguments": {"code": "print(sum(range(10)))"}}</tool_call>'
        '<tool_call>{"name": "nope", "arguments": {}}</tool_call>'
        '<tool_call>{"name": "calculator", "arguments": {"expression": "1/0"}}</tool_call>'
    )
    contents = [m["content"] for m in step.observation]
    if "SandboxUnavailable" not in contents[0]:
        assert contents[0] == "45\n"
    assert contents[1].startswith("error: no tool named 'nope'")
    assert contents[2] == "error: ZeroDivisionError: division by zero"
    assert step.info["tool_errors"] == 2 and not step.done
    assert env.step("So the answer is \\boxed{139090}.").done


def test_chat_template_with_tools(tokenizer):
    env = ToolEnv(["calculator"], system="Use tools.")
    chat = ChatFormat(tokenizer, env.tools)
    messages = env.reset({"prompt": "Compute 48213 + 90877."})
    text = tokenizer.decode(chat.prompt_ids(messages))
    assert text == (
        "<|im_start|>system\nUse tools.\n<tools>\ncalculator(expression): Evaluate an arithmetic "
        "expression exactly.\n</tools><|im_end|>\n<|im_start|>user\nCompute 48213 + 90877."
        "<|im_end|>\n<|im_start|>assistant\n"
    )
    history = [*messages, {"role": "assistant", "content": CALL}]
    observation = env.step(CALL).observation
    ids = chat.observation_ids(history, observation, "<|im_end|>")
    assert tokenizer.decode(ids) == (
        "\n<|im_start|>user\n<tool_response>\n139090\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    # prompt + the model's turn + the appended ids = the template's rendering of it all
    full = chat.prompt_ids(messages) + tokenizer.encode(CALL + "<|im_end|>") + ids
    assert tokenizer.decode(full) == chat.render(
        [*history, *observation], add_generation_prompt=True
    )


def test_a_tool_template_in_another_format_is_refused(tokenizer):
    class Other:
        chat_template = "{% for t in tools %}{{ t }}{% endfor %}<function=...>"
        name_or_path = "other"

    with pytest.raises(ValueError, match="Hermes <tool_call>"):
        ChatFormat(Other(), [])


def _runner(tokenizer, *, name="tools", max_turns=3, budget=200, **kwargs):
    cfg = EnvConfig(name=name, tools=["calculator"], max_turns=max_turns, kwargs=kwargs)
    return EnvRunner(cfg, tokenizer, max_new_tokens=budget, stop_token_ids=[tokenizer.eos_token_id])


def _say(tokenizer, text):
    return [*tokenizer.encode(text, add_special_tokens=False), tokenizer.eos_token_id]


def test_an_episode_turn_by_turn(tokenizer):
    runner = _runner(tokenizer)
    group = runner.group({"prompt": "Compute 48213 + 90877.", "index": 0})
    tokens = _say(tokenizer, CALL)
    appended = group.next_turn(1, tokens, "stop").result()
    assert tokenizer.decode(appended).startswith("\n<|im_start|>user\n<tool_response>\n139090")
    tokens += appended + _say(tokenizer, "\\boxed{139090}")
    assert group.next_turn(1, tokens, "stop").result() is None
    record = group.episode(1)
    assert record.final_text == "\\boxed{139090}" and record.turns == 2
    assert record.tool_calls == 1 and record.tool_errors == 0 and not record.truncated
    assert [m["role"] for m in record.messages] == ["user", "assistant", "tool", "assistant"]
    metrics = episode_metrics([record])
    assert metrics["env/turns"] == 2.0 and metrics["env/tool_calls"] == 1.0
    assert metrics["env/truncated_episodes"] == 0.0 and metrics["env/tool_latency_s"] >= 0
    runner.close()


def test_a_model_that_never_closes_its_tool_call(tokenizer):
    runner = _runner(tokenizer)
    group = runner.group({"prompt": "Add.", "index": 0})
    tokens = _say(tokenizer, '<tool_call>{"name": "calculator", "arguments": {"expression": "1"}')
    appended = group.next_turn(0, tokens, "stop").result()  # the turn ended, the call did not
    assert "error: the <tool_call> is never closed" in tokenizer.decode(appended)
    record = group.episode(0)
    assert record.tool_errors == 1 and record.tool_calls == 1 and not record.truncated
    tokens += appended + _say(tokenizer, "\\boxed{1}")  # and the episode goes on
    assert group.next_turn(0, tokens, "stop").result() is None
    assert group.episode(0).final_text == "\\boxed{1}"
    runner.close()


def test_episode_limits_and_failures(tokenizer):
    runner = _runner(tokenizer, max_turns=1)
    group = runner.group({"prompt": "Add.", "index": 0})
    assert group.next_turn(0, _say(tokenizer, CALL), "stop").result() is None
    assert group.episode(0).truncated  # still calling tools after max_turns
    runner = _runner(tokenizer, budget=60)  # the tool response does not fit
    group = runner.group({"prompt": "Add.", "index": 0})
    assert group.next_turn(0, _say(tokenizer, CALL), "stop").result() is None
    assert group.episode(0).truncated
    cut = _say(tokenizer, CALL)[:20]  # the budget ran out mid-call: a "length" turn
    assert group.next_turn(1, cut, "length").result() is None
    assert group.episode(1).truncated and group.episode(1).tool_calls == 0

    runner = _runner(tokenizer, name="test_envs:Broken")
    group = runner.group({"prompt": "Add.", "index": 0})
    assert group.next_turn(0, _say(tokenizer, "hi"), "stop").result() is None
    assert group.episode(0).error == "RuntimeError: the environment broke"
    assert episode_metrics([group.episode(0)])["env/failed_episodes"] == 1.0


class Broken:
    tools = []

    def reset(self, row):
        return [{"role": "user", "content": row["prompt"]}]

    def step(self, text):
        raise RuntimeError("the environment broke")


class GuessNumber(gymnasium.Env):
    """A gymnasium text environment: guess a number in [0, 9], told higher or lower."""

    observation_space = gymnasium.spaces.Text(64, charset=string.printable)
    action_space = gymnasium.spaces.Text(256, charset=string.printable)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.target, self.tries = (seed or 0) % 10, 0
        return "Guess a number from 0 to 9.", {}

    def step(self, action):
        self.tries += 1
        guess = int("".join(c for c in action if c.isdigit()) or -1)
        if guess == self.target:
            return "correct", 1.0, True, False, {}
        hint = "higher" if guess < self.target else "lower"
        return hint, -0.1, False, self.tries >= 3, {}


def make_guess_number():
    return GuessNumber()


def test_gymnasium_text_env_runs_unchanged(tokenizer):
    env_id = "rlvr-test/GuessNumber-v0"
    if env_id not in gymnasium.registry:
        gymnasium.register(env_id, entry_point="test_envs:make_guess_number")
    for kwargs in ({"id": env_id}, {"entry_point": "test_envs:make_guess_number"}):
        runner = _runner(tokenizer, name="gym", **kwargs)
        group = runner.group({"prompt": "Play.", "index": 7})
        assert "Guess a number" in tokenizer.decode(group.prompt_ids)
        tokens = _say(tokenizer, "3")
        appended = group.next_turn(0, tokens, "stop").result()
        assert "higher" in tokenizer.decode(appended)
        tokens += appended + _say(tokenizer, "7")
        assert group.next_turn(0, tokens, "stop").result() is None
        record = group.episode(0)
        assert record.reward == pytest.approx(0.9) and record.turns == 2
    with pytest.raises(ValueError, match="exactly one of"):
        env_factory("gym")()


def test_registry_and_config_checks(tmp_path):
    assert env_factory("tools") is ToolEnv
    with pytest.raises(ValueError, match=r"env.name 'nope' is not one of"):
        env_factory("nope")
    with pytest.raises(ValueError, match="cannot import"):
        env_factory("no_such_module:Env")
    base = Path(rlvr_jax.__file__).parents[1] / "configs" / "demo.yaml"
    for overrides, message in (
        (["env.name=tools", "rollout.backend=vllm"], "rollout.backend: jetstream"),
        (["env.name=tools", "rollout.interrupt.thinking_budget=8"], "cannot be combined"),
        (["env.name=tools", "algorithm=sft"], "needs algorithm: rl"),
        (["env.max_turns=0"], "max_turns and workers must be >= 1"),
    ):
        with pytest.raises(ConfigError, match=message):
            load(base, overrides)
    cfg = load(base, ["env.name=tools", "env.tools=[calculator]", "env.max_turns=2"])
    assert cfg.env.tools == ["calculator"] and cfg.env.max_turns == 2


class ScriptedCalculator(ToolEnv):
    """The calculator environment whose first assistant turn is taken to be `CALL` (a small
    policy never writes one): every step after it is the policy's own text."""

    def __init__(self, **kwargs):
        super().__init__(tools=["calculator"], **kwargs)
        self.turn = 0

    def step(self, assistant_text):
        self.turn += 1
        return super().step(CALL if self.turn == 1 else assistant_text)


@pytest.mark.smoke("envs")
def test_tool_episodes_run_in_the_engine_slots(tokenizer):
    """The shipped demo policy (2 layers) decodes two samples of a calculator episode through
    the rollout engine: the tool's response is appended in the slot (not sampled), the turns
    go on to the budget, and each completion carries its episode."""
    from rlvr_jax import models
    from rlvr_jax.envs import answer_text
    from rlvr_jax.rollout import EngineCore, GroupRequest, Scheduler

    eos, budget = tokenizer.eos_token_id, 96
    runner = _runner(tokenizer, name="test_envs:ScriptedCalculator", budget=budget)
    group = runner.group({"prompt": "Compute 48213 + 90877.", "index": 0})
    core = EngineCore(models.load_pretrained(DEMO_TOKENIZER), max_slots=2, max_len=256, chunk=8)
    sched = Scheduler(core)
    prompt = tuple(group.prompt_ids)
    sched.add(GroupRequest(0, 0, prompt, 2, seed=3, max_new_tokens=budget, turns=group,
                           stop_token_ids=(eos,)))  # fmt: skip
    ((_, completions),) = sched.run()
    runner.close()
    records = []
    for i, c in enumerate(completions):
        record = c.episode
        assert record is group.episode(i) and record.error is None
        assert record.tool_calls == 1 and record.tool_errors == 0 and record.turns >= 2
        assert [m["role"] for m in record.messages[:3]] == ["user", "assistant", "tool"]
        assert len(c.tokens) <= budget and len(c.sampled) == len(c.tokens)
        appended = [t for t, sampled in zip(c.tokens, c.sampled) if not sampled]
        assert "<tool_response>\n139090\n</tool_response>" in tokenizer.decode(appended)
        assert c.logprobs[c.sampled.index(False)] == 0.0  # an appended token: never trained on
        assert answer_text(c, tokenizer) == record.final_text
        records.append(record)
    metrics = episode_metrics(records)
    assert metrics["env/tool_calls"] == 1.0 and metrics["env/turns"] >= 2.0
    assert metrics["env/failed_episodes"] == 0.0
