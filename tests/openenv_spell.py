"""A multi-turn tool environment written against `openenv-core`'s own API (0.3): an
`MCPEnvironment` with a FastMCP tool, typed `Action` / `Observation` models and a `Rubric`.

Spell a word backwards: the first observation asks for it, the `length` tool gives the
word's length, a wrong answer gets one more try (feedback, reward None), and the episode's
reward is the rubric's: 1 for the exact reversal, 0.25 for the right letters in another
order, else 0."""

from __future__ import annotations

from uuid import uuid4

from fastmcp import FastMCP
from openenv.core.env_server.mcp_environment import MCPEnvironment
from openenv.core.env_server.types import Action, Observation, State
from openenv.core.rubrics import Rubric
from pydantic import Field

WORDS = ("stone", "water", "light", "green")


class SpellAction(Action):
    answer: str = Field(..., description="the word spelled backwards")


class SpellObservation(Observation):
    prompt: str = ""


class Reversal(Rubric):
    def __init__(self, word: str):
        super().__init__()
        self.word = word

    def forward(self, action, observation) -> float:
        answer = action.answer.strip().lower()
        if answer == self.word[::-1]:
            return 1.0
        return 0.25 if sorted(answer) == sorted(self.word) else 0.0


class SpellEnv(MCPEnvironment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, tries: int = 2):
        mcp = FastMCP("spell")

        @mcp.tool()
        def length(word: str) -> int:
            """The number of letters of a word."""
            return len(word)

        super().__init__(mcp)
        self.tries, self.word, self.left = tries, "", 0
        self._state = State(episode_id=str(uuid4()), step_count=0)

    def reset(self, seed=None, episode_id=None, **kwargs) -> SpellObservation:
        self.word, self.left = WORDS[(seed or 0) % len(WORDS)], self.tries
        self.rubric = Reversal(self.word)
        self._state = State(episode_id=episode_id or str(uuid4()), step_count=0)
        return SpellObservation(prompt=f"Spell {self.word!r} backwards.")

    def _step_impl(self, action, timeout_s=None, **kwargs) -> SpellObservation:
        self._state.step_count += 1
        self.left -= 1
        score = self.rubric(action, None)
        if score == 1.0 or self.left == 0:
            return SpellObservation(done=True, reward=score)
        return SpellObservation(prompt=f"Not {action.answer.strip()!r}. Try again.")

    @property
    def state(self) -> State:
        return self._state


def expected_reward(word: str, answers: list[str]) -> float:
    """The rubric by hand: the last answer's score once the episode is over."""
    last = answers[-1].strip().lower()
    return 1.0 if last == word[::-1] else 0.25 if sorted(last) == sorted(word) else 0.0
