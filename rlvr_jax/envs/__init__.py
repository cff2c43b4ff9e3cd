"""Multi-turn environments and tools, their turns run inside the rollout engine's slots.

    runner = EnvRunner(cfg.env, tokenizer, max_new_tokens=..., stop_token_ids=...)
    group = runner.group(row)                 # the request's hook: EnvGroup
    rollout.submit(rid, group.prompt_ids, num_samples=G, seed=s, meta=row, turns=group)
    # completions carry `episode` (EpisodeRecord); appended tokens are sampled=False

`base` holds the `Environment` protocol and its registry (`env.name`: `tools` =
`tool_env.ToolEnv`, `gym` = `gym.GymTextEnv`, `verifiers`, `openenv`, or `module:function`);
`tools` and `chat` the tool functions and Hermes chat format; `episode` the runner. The
engine's side (parking a sequence between turns) is `rlvr_jax.rollout.host.turns`.
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
