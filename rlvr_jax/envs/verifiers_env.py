"""Environments written for the `verifiers` package (0.4, `import verifiers.v1 as vf`), run here
unchanged (`env.name: verifiers`).

A verifiers environment is an installed module exporting a `vf.Taskset` (tasks with their
data, `vf.Toolset` tools and weighted `@vf.reward` rubric) and optionally its own `vf.Env`,
whose `run(task, agents)` drives the agent turn by turn through `agents.<role>.interaction`.
The package's `Env`, tasks and rubric run as they are, in-process on one asyncio loop; the
policy is the agent (its turns decoded in the engine's slots) and this module its harness, a
chat loop like verifiers' `null` harness (Hermes tool calls run the toolset, a reply without
calls ends the segment). Each finished trace is scored by `Task.score`; the episode's reward
is the sum of the traces' `vf.Trace.reward`.

`env.kwargs`: `taskset` (an id, or a mapping of the taskset's config: `{id: ..., ...}`), `env`
(an `Env` id to pair with the taskset; default the taskset's own, else `SingleAgentEnv`). A
data row's index (its line in its source) is the position of its task in the taskset:
`python -m rlvr_jax.envs.verifiers_env --taskset ID --out rows.jsonl` writes one row per task,
in order, verified by `rubric_only` (0: the reward is the rubric's, added as the
environment's).

Not here: environments with more than one agent seat (a simulated user played by another
model), harnesses that run programs in sandboxes, judges that call a model, and rewards that
need a runtime (skipped, as verifiers skips them without one).
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import inspect
import itertools
import json
import queue
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rlvr_jax.envs.base import Message, Step
from rlvr_jax.envs.chat import ToolCall, parse_tool_calls
from rlvr_jax.envs.tools import make_tool

TURN_TIMEOUT_S = 300.0
"""Longest wait for the environment's next model call or its end (its tools and rubric)."""
VERIFIER = "rlvr_jax.envs.verifiers_env:rubric_only"


def rubric_only(response: str, ground_truth: Any = None, **_: Any) -> float:
    """The verifier of a verifiers environment's rows: 0. The reward is the rubric's, which
    the environment adds to the episode (`Step.reward`)."""
    return 0.0


class _Stopped(Exception):
    """The episode was closed (a limit ended it) while the environment waited for a turn."""


_LOOP: asyncio.AbstractEventLoop | None = None
_LOOP_LOCK = threading.Lock()


def _loop() -> asyncio.AbstractEventLoop:
    """The process's asyncio loop for verifiers code (a daemon thread)."""
    global _LOOP
    with _LOOP_LOCK:
        if _LOOP is None:
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="verifiers", daemon=True).start()
            _LOOP = loop
    return _LOOP


def _run(coro: Any, timeout: float = TURN_TIMEOUT_S) -> Any:
    return asyncio.run_coroutine_threadsafe(coro, _loop()).result(timeout)


class _Loaded:
    """A taskset and its `Env`, loaded once per process and configuration."""

    def __init__(self, taskset: Mapping[str, Any], env_id: str):
        import verifiers.v1 as vf
        from verifiers.v1.configs.agent import agent_config_fields

        if not taskset.get("id"):
            raise ValueError("env.kwargs.taskset: give the taskset's id (its module)")
        config = vf.resolve_env_config({"id": env_id, "taskset": dict(taskset)})
        self.env = vf.load_environment(config)
        roles = list(agent_config_fields(config))
        if len(roles) != 1:
            raise ValueError(
                f"verifiers environment {config.env_id!r} has agent seats {roles}: rlvr_jax "
                "runs environments whose one agent is the policy"
            )
        self.role, self.taskset = roles[0], self.env.taskset
        self.task_cls = type(self.taskset).task_type()
        self._tasks: list[Any] = []
        self._iter = iter(self.taskset)
        self._lock = threading.Lock()
        self.shared = _run(_start_servers(type(self.taskset).toolsets(self.taskset.config)))

    def task(self, i: int) -> Any:
        """The taskset's task `i` (its position in `load()`), loaded up to it."""
        with self._lock:
            self._tasks.extend(itertools.islice(self._iter, max(0, i + 1 - len(self._tasks))))
            if i >= len(self._tasks):
                raise ValueError(
                    f"task {i} is past the end of taskset {self.taskset.config.id!r} "
                    f"({len(self._tasks)} tasks)"
                )
            return self._tasks[i]


_LOADED: dict[str, _Loaded] = {}
_LOAD_LOCK = threading.Lock()


def _load(taskset: str | Mapping[str, Any], env_id: str) -> _Loaded:
    """The loaded taskset of this configuration (once per process)."""
    spec = {"id": taskset} if isinstance(taskset, str) else dict(taskset)
    key = json.dumps([spec, env_id], sort_keys=True, default=str)
    with _LOAD_LOCK:
        if key not in _LOADED:
            _LOADED[key] = _Loaded(spec, env_id)
        return _LOADED[key]


def _tool_methods(servers: Sequence[Any]) -> dict[str, tuple]:
    """Tool name (as MCP advertises it: `<server>_<tool>`) → (server, its bound method)."""
    from verifiers.v1.utils.decorators import discover_decorated

    out: dict[str, tuple] = {}
    for server in servers:
        for fn in discover_decorated(server, "tool"):
            name = getattr(fn, "tool_name", None) or fn.__name__
            full = f"{server.server_name}_{name}" if server.server_name else name
            if full in out:
                raise ValueError(f"duplicate tool name {full!r} in the verifiers environment")
            out[full] = (server, fn)
    return out


async def _start_servers(servers: Sequence[Any], task: Any = None) -> dict[str, tuple]:
    """`_tool_methods` of `servers`, each set up first (and given `task`, per task)."""
    for server in servers:
        await server.setup()
        if task is not None:
            await server.setup_task(task)
    return _tool_methods(servers)


def _text(content: Any) -> str:
    from verifiers.v1.types import content_text

    return content_text(content)


def _as_chat(message: Any) -> Message:
    """A verifiers message as the chat template's dict."""
    if message.role == "tool":
        return {"role": "tool", "name": message.name or "", "content": _text(message.content)}
    if message.role == "assistant":
        return {"role": "assistant", "content": message.content or ""}
    return {"role": message.role, "content": _text(message.content)}


class VerifiersEnv:
    """One episode of a verifiers environment (`env.kwargs` in the module docstring)."""

    def __init__(self, taskset: str | Mapping[str, Any], *, env: str = ""):
        self._loaded = _load(taskset, env)
        config = self._loaded.taskset.config.task
        self._servers = list(self._loaded.task_cls.toolsets(config))
        self._tools: dict[str, tuple] = {}
        schemas = {**self._loaded.shared, **_tool_methods(self._servers)}
        self.tools = [make_tool(fn, name).schema for name, (_, fn) in schemas.items()]
        self._events: queue.Queue = queue.Queue()
        self._reply: asyncio.Future | None = None
        self._episode: concurrent.futures.Future | None = None
        self._seen = 0
        self._closed = self._waiting = False
        self._counts = {"tool_calls": 0, "tool_errors": 0, "tool_latency_s": 0.0}

    # -- the Environment protocol (worker threads) ----------------------------------------

    def reset(self, row: Mapping[str, Any]) -> list[Message]:
        task = self._loaded.task(int(row.get("index", 0)))
        self._episode = asyncio.run_coroutine_threadsafe(self._play(task), _loop())
        kind, payload, _ = self._next()
        if kind != "call":
            raise RuntimeError("the verifiers environment ended before its first model turn")
        self._seen = len(payload)
        return [_as_chat(m) for m in payload]

    def step(self, assistant_text: str) -> Step:
        if not self._waiting:
            raise RuntimeError("the verifiers environment is not waiting for a turn")
        _loop().call_soon_threadsafe(self._answer, assistant_text, None)
        kind, payload, info = self._next()
        if kind == "done":
            return Step(None, float(payload), True, info)
        if payload[self._seen].role != "assistant":
            raise RuntimeError("the verifiers environment did not keep the assistant's turn")
        observation = [_as_chat(m) for m in payload[self._seen + 1 :]]
        self._seen = len(payload)
        if not observation:
            raise RuntimeError("the verifiers environment asked for a turn with nothing new")
        return Step(observation, 0.0, False, info)

    def close(self) -> None:
        """Stops the episode's coroutine when it is not over (a limit ended the episode, or
        its group never ran): at its pending turn, or at its next one."""
        if self._episode is not None:
            _loop().call_soon_threadsafe(self._answer, None, _Stopped())

    def _next(self) -> tuple[str, Any, dict]:
        self._waiting = False
        try:
            kind, payload, info = self._events.get(timeout=TURN_TIMEOUT_S)
        except queue.Empty:
            raise RuntimeError(
                f"the verifiers environment gave no turn within {TURN_TIMEOUT_S:g} s"
            ) from None
        if kind == "error":
            raise payload
        self._waiting = kind == "call"
        return kind, payload, info

    def _answer(self, text: str | None, error: BaseException | None) -> None:
        """On the loop: the pending model call's reply (or a stop, which also stops any
        later call)."""
        if error is not None:
            self._closed = True
        reply, self._reply = self._reply, None
        if reply is not None and not reply.done():
            if error is not None:
                reply.set_exception(error)
            else:
                reply.set_result(text)

    # -- the episode (the asyncio loop) ----------------------------------------------------

    async def _play(self, task: Any) -> None:
        import verifiers.v1 as vf

        env = self._loaded.env
        try:
            self._tools = {**self._loaded.shared, **await _start_servers(self._servers, task)}
            agent = _PolicyAgent(self, self._loaded.role)
            agents = vf.Agents(env.config, make=lambda name, spec: agent)
            await env.setup(agents)
            await env.run(task, agents)
            traces = agent.traces
            if not traces:
                raise ValueError(f"{type(env).__name__}.run() ran no turn of the policy")
            if type(env).finalize is not vf.Env.finalize:
                episode = vf.Episode(
                    env=vf.EnvInfo(id=env.config.env_id), task=traces[0].task, traces=traces
                )
                await env.finalize(task, episode)
                traces = episode.traces
            reward = sum(t.reward for t in traces if t.agent.trainable)
            self._events.put(("done", reward, self._take_counts()))
        except _Stopped:
            pass
        except BaseException as e:  # reported on the worker thread: the episode fails
            self._events.put(("error", e, {}))

    async def model(self, messages: list[Any]) -> str:
        """The policy's next turn on `messages`: handed to the engine, awaited (on the loop,
        like `_answer`: the two never race)."""
        if self._closed:
            raise _Stopped
        reply = asyncio.get_running_loop().create_future()
        self._reply = reply
        self._events.put(("call", list(messages), self._take_counts()))
        return await reply

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> tuple[str, bool]:
        """(result text, ok): the tool's value as MCP returns it (text; JSON for other
        values), or an `error: ...` text."""
        start = time.perf_counter()
        self._counts["tool_calls"] += 1
        try:
            if name not in self._tools:
                raise ValueError(f"no tool named {name!r} (tools: {sorted(self._tools)})")
            fn = self._tools[name][1]
            inspect.signature(fn).bind(**arguments)
            value = fn(**arguments)
            if inspect.isawaitable(value):
                value = await value
            text, ok = value if isinstance(value, str) else json.dumps(value, default=str), True
        except Exception as e:  # reported to the model, as a tool server's error would be
            text, ok = f"error: {type(e).__name__}: {e}", False
            self._counts["tool_errors"] += 1
        self._counts["tool_latency_s"] += time.perf_counter() - start
        return text, ok

    def _take_counts(self) -> dict[str, float]:
        counts = dict(self._counts)
        self._counts = {"tool_calls": 0, "tool_errors": 0, "tool_latency_s": 0.0}
        return counts


class _PolicyAgent:
    """The agent seat the policy plays (what `vf.Agents` hands the `Env`)."""

    def __init__(self, episode: VerifiersEnv, name: str):
        self.episode, self.name, self.trainable = episode, name, True
        self.traces: list[Any] = []

    @contextlib.asynccontextmanager
    async def interaction(self, task: Any, **_: Any):
        it = _Interaction(self, task)
        try:
            yield it
        finally:
            await it.close()

    async def run(self, task: Any, **_: Any) -> Any:
        """One segment on the task's prompt (what a harness run is), scored."""
        if task.data.prompt is None:
            raise ValueError("a task without a prompt needs an Env that opens the exchange")
        async with self.interaction(task) as it:
            await it.turn()
        return it.trace


class _Interaction:
    """`vf.Interaction`'s surface over the engine: `turn(message)` runs one segment (model
    turns and their tool calls until a reply without calls) and returns its `vf`
    `Segment`; `trace` is a real `vf.Trace` (its turns committed to the message graph);
    `close()` scores it with the task's rubric."""

    def __init__(self, agent: _PolicyAgent, task: Any):
        import verifiers.v1 as vf

        self.agent, self.task = agent, task
        self.trace = vf.Trace(
            task=vf.TraceTask(
                type=type(task).__name__, data=task.data, key=task.key, hash=task.hash
            ),
            agent=vf.AgentInfo(config=vf.AgentConfig(), name=agent.name, trainable=agent.trainable),
        )
        self.messages: list[Any] = []
        if task.data.system_prompt:
            self.messages.append(vf.SystemMessage(content=task.data.system_prompt))
        self._started = self._closed = False

    async def turn(self, message: str | Sequence[Any] | None = None) -> Any:
        import verifiers.v1 as vf
        from pydantic import TypeAdapter
        from verifiers.v1.agent import Segment

        if self._closed:
            raise RuntimeError("this interaction is closed")
        prompted = not self._started and self.task.data.prompt is not None
        if message is None and not prompted:
            raise ValueError("a bare turn() takes a prompted task's opening reply only")
        if message is not None and prompted:
            raise ValueError("the task's prompt opens this exchange: take its reply first")
        if prompted:
            prompt = self.task.data.prompt
            self.messages += (
                [vf.UserMessage(content=prompt)] if isinstance(prompt, str) else list(prompt)
            )
        if isinstance(message, str):
            self.messages.append(vf.UserMessage(content=message))
        elif message is not None:
            adapter = TypeAdapter(vf.Message)
            self.messages += [adapter.validate_python(m) if isinstance(m, dict) else m
                              for m in message]  # fmt: skip
        self._started = True
        segment: list[Any] = []
        while True:
            text = await self.agent.episode.model(self.messages)
            calls = [c for c in parse_tool_calls(text) if isinstance(c, ToolCall)]
            ids = [f"call_{uuid.uuid4().hex[:12]}" for _ in calls]
            assistant = vf.AssistantMessage(
                content=_strip_calls(text) if calls else text,
                tool_calls=[
                    vf.ToolCall(id=i, name=c.name, arguments=json.dumps(c.arguments))
                    for i, c in zip(ids, calls)
                ]
                or None,
            )
            self._commit(assistant, "tool_calls" if calls else "stop")
            segment.append(assistant)
            if not calls:
                return Segment(messages=segment)
            for i, c in zip(ids, calls):
                text, _ = await self.agent.episode.call_tool(c.name, c.arguments)
                result = vf.ToolMessage(tool_call_id=i, content=text, name=c.name)
                self.messages.append(result)
                segment.append(result)

    def _commit(self, assistant: Any, finish: str) -> None:
        import verifiers.v1 as vf
        from verifiers.v1.graph import prepare_turn

        tools = [
            vf.Tool(
                name=t["function"]["name"],
                description=t["function"]["description"],
                parameters=t["function"]["parameters"],
            )
            for t in self.agent.episode.tools
        ]
        response = vf.Response(
            id=uuid.uuid4().hex, created=int(time.time()), model="rlvr_jax",
            message=assistant, finish_reason=finish,
        )  # fmt: skip
        prepare_turn(self.trace, list(self.messages), tools).commit(response)
        self.messages.append(assistant)

    async def close(self) -> Any:
        """Ends the exchange and scores the trace (the task's rubric); idempotent."""
        if not self._closed:
            self._closed = True
            if self.trace.stop_condition is None:
                self.trace.stop("user_closed")
            await self.task.score(self.trace)
            self.trace.is_completed = self.trace.ok = True
            self.agent.traces.append(self.trace)
        return self.trace


def _strip_calls(text: str) -> str:
    import re

    return re.sub(r"<tool_call>.*?</tool_call>", "", text, flags=re.DOTALL).strip()


def task_rows(taskset: str | Mapping[str, Any], limit: int, env: str = "") -> list[dict]:
    """One data row per task of the taskset, in order (the first `limit`): its prompt text
    (for the logs; the environment renders the task itself) and the `rubric_only` verifier."""
    loaded = _load(taskset, env)
    domain = loaded.taskset.config.id
    rows = []
    for i in range(limit):
        try:
            task = loaded.task(i)
        except ValueError:
            break
        rows.append({"prompt": task.data.prompt_text or f"task {i}", "ground_truth": "",
                     "verifier": VERIFIER, "domain": domain})  # fmt: skip
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Write data rows for a verifiers taskset's tasks.")
    p.add_argument("--taskset", required=True, help="the taskset's id (its module)")
    p.add_argument("--env", default="", help="an Env id to pair with it")
    p.add_argument("--limit", type=int, default=1000, help="at most this many tasks")
    p.add_argument("--out", required=True, help="the JSONL file to write")
    args = p.parse_args(argv)
    rows = task_rows(args.taskset, args.limit, args.env)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"{len(rows)} rows: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
