"""EchoEnv: the agent must say a secret word; a custom environment in ten lines of logic."""

from agentrl import AgentEnv

WORDS = ("apple", "river", "cobalt", "meadow", "lantern")


class EchoEnv(AgentEnv):
    def __init__(self, attempts: int = 3):
        self.attempts = attempts

    async def areset(self, *, seed=None, options=None):
        await super().areset(seed=seed, options=options)
        self.word, self.left = WORDS[self.np_random.integers(len(WORDS))], self.attempts
        return [{"role": "user", "content": f"Say the word {self.word!r}."}], {"tools": []}

    async def astep(self, action):
        self.left -= 1
        if self.word in action:
            return [], 1.0, True, False, {}
        feedback = [{"role": "user", "content": f"No. Say {self.word!r}."}]
        return feedback, 0.0, self.left == 0, False, {}
