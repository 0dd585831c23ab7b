"""EnvMixture: groups drawn by weight, reproducibly, every sample of a group in one environment."""

import collections

import pytest

from agentrl import AgentEnv
from agentrl.engine_pool import SamplingParams
from agentrl.rollout import EnvMixture, EpisodeRunner, group_tasks


class OneTurn(AgentEnv):
    """Any reply ends the episode with reward 0."""

    async def areset(self, *, seed=None, options=None):
        await super().areset(seed=seed, options=options)
        return [{"role": "user", "content": "Say something."}], {}

    async def astep(self, action):
        return [], 0.0, True, False, {}


def runners(engine, tokenizer, names):
    sampling = SamplingParams(temperature=1.0, max_new_tokens=2, seed=0)
    return [EpisodeRunner(OneTurn, engine, tokenizer, sampling, env_id=name) for name in names]


def test_groups_are_drawn_by_weight_and_reproducibly():
    names = ["a", "b", "c"]
    mixture = EnvMixture([None] * 3, [6, 3, 1], seed=7)  # index() never touches the runners
    counts = collections.Counter(mixture.index(g) for g in range(6000))
    assert counts[0] / 6000 == pytest.approx(0.6, abs=0.03)
    assert counts[1] / 6000 == pytest.approx(0.3, abs=0.03)
    assert counts[2] / 6000 == pytest.approx(0.1, abs=0.02)
    again = EnvMixture([None] * len(names), [6, 3, 1], seed=7)
    assert [again.index(g) for g in range(50)] == [mixture.index(g) for g in range(50)]
    other = EnvMixture([None] * len(names), [6, 3, 1], seed=8)
    assert [other.index(g) for g in range(50)] != [mixture.index(g) for g in range(50)]


@pytest.mark.slow
async def test_every_sample_of_a_group_meets_the_same_environment(engine, tokenizer):
    mixture = EnvMixture(runners(engine, tokenizer, ["a", "b"]), [1, 1], seed=0)
    tasks = group_tasks(12, group_size=3)
    trajectories = [await mixture.run(task) for task in tasks]
    by_group = collections.defaultdict(set)
    for t in trajectories:
        assert t.error is None and t.turns
        by_group[t.group].add(t.env_id)
    assert all(len(names) == 1 for names in by_group.values())
    assert {next(iter(n)) for n in by_group.values()} == {"a", "b"}
    assert all(by_group[g] == {"ab"[mixture.index(g)]} for g in by_group)


def test_bad_weights_are_refused():
    with pytest.raises(ValueError, match="one weight per runner"):
        EnvMixture([None], [1, 2])
    with pytest.raises(ValueError, match="> 0"):
        EnvMixture([None, None], [1, 0])
