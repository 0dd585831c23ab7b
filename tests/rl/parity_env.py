"""``test/Parity-v0``: reward 1 when the reply has an even number of characters.

A random policy scores on about half its replies, so every GRPO group of a tiny random model has
non-zero advantages and training really changes the weights. Runs import it through gymnasium's
``module:id`` form: ``env.id=parity_env:test/Parity-v0`` with this directory on ``PYTHONPATH``.
"""

from agentrl import AgentEnv, register_env


class ParityEnv(AgentEnv):
    async def areset(self, *, seed=None, options=None):
        await super().areset(seed=seed, options=options)
        return [{"role": "user", "content": "Reply with an even number of characters."}], {}

    async def astep(self, action):
        return [], float(len(action) % 2 == 0), True, False, {}


register_env("test/Parity-v0", ParityEnv)
