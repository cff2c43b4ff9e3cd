"""A multi-turn tool environment written against the `verifiers` package's own API (0.4,
`verifiers.v1`), as a taskset package: the taskset id is this module's name (`vf_guess`).

The player guesses a secret word. Its `Env.run` answers each wrong guess with a hint as the
next user turn (at most two), its task's tool server offers `hints_letter(i)` (the secret's
i-th letter), and its rubric is the task's two weighted rewards: `guessed` (1 when the last
reply names the secret) and `brief` (0.5 × [the last reply is under 40 characters]). After the
exchange `run` also records `hints_used`, −0.1 per hint given."""

from __future__ import annotations

from collections.abc import Iterator

import verifiers.v1 as vf

SECRETS = ("apple", "table", "water", "stone", "light", "green")


class GuessData(vf.TaskData):
    secret: str


class Hints(vf.Toolset[vf.ToolsetConfig]):
    """Letters of the secret word."""

    def __init__(self, config: vf.ToolsetConfig, secret: str = ""):
        super().__init__(config)
        self.secret = secret

    async def setup_task(self, task) -> None:
        self.secret = task.data.secret

    @vf.tool
    def letter(self, i: int) -> str:
        """The secret word's i-th letter (from 0).

        Args:
          i: the letter's position.
        """
        return self.secret[i]


class GuessTask(vf.Task[GuessData, vf.State, vf.TaskConfig]):
    @vf.reward
    async def guessed(self, trace) -> float:
        return float(self.data.secret in trace.last_reply.lower())

    @vf.reward(weight=0.5)
    async def brief(self, trace) -> float:
        return float(len(trace.last_reply) < 40)

    @classmethod
    def toolsets(cls, config):
        return [Hints(vf.ToolsetConfig())]


class GuessTaskset(vf.Taskset[GuessTask, vf.TasksetConfig]):
    def load(self) -> Iterator[GuessTask]:
        for s in SECRETS:
            yield GuessTask(
                GuessData(
                    prompt=f"Guess my {len(s)}-letter word.",
                    system_prompt="Answer with one word.",
                    secret=s,
                ),
                self.config.task,
            )


class GuessEnvConfig(vf.EnvConfig):
    player: vf.AgentConfig = vf.AgentConfig()


class GuessEnv(vf.Env[GuessEnvConfig]):
    async def run(self, task, agents):
        hints = 0
        async with agents.player.interaction(task) as it:
            segment = await it.turn()
            while task.data.secret not in segment.last_reply.lower() and hints < 2:
                hints += 1
                segment = await it.turn(f"No. It starts with {task.data.secret[:hints]!r}.")
        it.trace.record_reward("hints_used", -0.1 * hints)


def expected_reward(secret: str, last_reply: str, hints: int) -> float:
    """The rubric by hand (what the test checks the trainer's reward against)."""
    last = last_reply.strip()
    return float(secret in last.lower()) + 0.5 * float(len(last) < 40) - 0.1 * hints


__all__ = ["GuessEnv", "GuessTaskset"]
