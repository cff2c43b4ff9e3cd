"""Multi-turn environments and tools, their turns run inside the rollout engine's slots.

    runner = EnvRunner(cfg.env, tokenizer, max_new_tokens=..., stop_token_ids=...)
    group = runner.group(row)                 # the request's hook: EnvGroup
    rollout.submit(rid, group.prompt_ids, num_samples=G, seed=s, meta=row, turns=group)
    # completions carry `episode` (EpisodeRecord); appended tokens are sampled=False

- `base`: the `Environment` protocol (`reset(row) -> messages`, `step(text) -> Step`, an
  optional `close()`), its registry (`env.name`: `tools`, `gym`, `verifiers`, `openenv`, a
  registered name or `module:function`).
- `tool_env.ToolEnv`: tools as typed functions (`tools`: JSON schema from the signature,
  built-in `python` in the code sandbox, `calculator` and `lookup`), Hermes `<tool_call>`
  parsing and the chat template with `tools=` (`chat`).
- `gym.GymTextEnv`: gymnasium-style text environments, unchanged.
- `verifiers_env.VerifiersEnv`, `openenv_env.OpenEnvEnv`: environments written for the
  `verifiers` (0.4) and `openenv-core` (0.3) packages, unchanged (their tools and rubric).
- `lookup`: the tool-use task's hidden table and its `lookup` tool.
- `episode`: per-sample episodes on a worker pool, the engine's hook, `env/*` metrics.

The engine's side (parking a sequence between turns, appending in place) is
`rlvr_jax.rollout.host.turns`.
"""

from rlvr_jax.envs.base import Environment, Step, env_factory, register_env
from rlvr_jax.envs.chat import ChatFormat, ToolCall, parse_tool_calls
from rlvr_jax.envs.episode import (
    EnvGroup,
    EnvRunner,
    EpisodeRecord,
    answer_text,
    episode_metrics,
)
from rlvr_jax.envs.tool_env import ToolEnv
from rlvr_jax.envs.tools import BUILTIN_TOOLS, Tool, calculator, make_tool, python

__all__ = [
    "BUILTIN_TOOLS",
    "ChatFormat",
    "EnvGroup",
    "EnvRunner",
    "Environment",
    "EpisodeRecord",
    "Step",
    "Tool",
    "ToolCall",
    "ToolEnv",
    "answer_text",
    "calculator",
    "env_factory",
    "episode_metrics",
    "make_tool",
    "parse_tool_calls",
    "python",
    "register_env",
]
