"""An OpenEnv environment built here (no download): a sum posed by the environment, two tries.

`rlvr train --environment openenv:examples.environments.openenv_sums:SumsEnv ...` serves it and
trains on it (docs/environments.md). rlvr calls `reset` with a seed shared by the samples of one
prompt's group, so the whole group gets the same sum. A right first reply earns 1 and ends the
episode; a wrong one gets "Not quite." and one more try, worth 0.5.
"""

import random
import re

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State


class SumsAction(Action):
    message: str


class SumsObservation(Observation):
    text: str = ""


def last_number(text: str) -> int | None:
    numbers = re.findall(r"-?\d+", text.replace(",", ""))
    return int(numbers[-1]) if numbers else None


class SumsEnv(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        self._state, self._answer = State(episode_id="", step_count=0), 0

    def reset(self, seed=None, episode_id=None, **kw) -> SumsObservation:
        rng = random.Random(seed)
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        self._state, self._answer = State(episode_id=episode_id or "", step_count=0), a + b
        return SumsObservation(text=f"What is {a} + {b}? Reply with the number only.", done=False, reward=0.0)

    def step(self, action: SumsAction, timeout_s=None, **kw) -> SumsObservation:
        self._state.step_count += 1
        right = last_number(action.message) == self._answer
        if right or self._state.step_count >= 2:
            reward = (1.0 if self._state.step_count == 1 else 0.5) if right else 0.0
            return SumsObservation(text="", done=True, reward=reward)
        return SumsObservation(text="Not quite. Try once more: the number only.", done=False, reward=0.0)

    @property
    def state(self) -> State:
        return self._state
