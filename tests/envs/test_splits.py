"""Held-out splits of the built-in task sets: disjoint by construction, whatever the size or seed."""

import gymnasium
import pytest

import agentrl  # noqa: F401  (registers the environments)
from agentrl.envs.math.generated import generate_problems
from agentrl.envs.search.qa import normalize_answer, read_questions
from agentrl.envs.splits import TEST_SHARE, answer_group_keys, split_of


def test_a_split_depends_only_on_the_content_and_holds_out_about_the_test_share():
    keys = [f"task {i}" for i in range(20000)]
    splits = [split_of(k) for k in keys]
    assert splits == [split_of(k) for k in keys]
    assert abs(splits.count("test") / len(keys) - TEST_SHARE) < 0.02


def test_tasks_that_share_an_answer_share_a_group_transitively():
    keys = answer_group_keys([["b"], ["c", "b"], ["d"], ["c"], ["e", "d"], ["a", "e"]])
    assert keys == ["b", "b", "a", "b", "a", "a"]


@pytest.mark.parametrize(("seed", "difficulty"), [(0, 1), (0, 2), (7, 3)])
def test_math_train_and_test_never_share_a_question(seed, difficulty):
    train = generate_problems(2000, seed, difficulty, "train")
    test = generate_problems(500, seed, difficulty, "test")
    assert len(test) == 500 and all(split_of(p.question) == "test" for p in test)
    assert not {p.question for p in train} & {p.question for p in test}
    assert generate_problems(5, seed, difficulty) == generate_problems(5, seed, difficulty, None)


def test_search_train_and_test_never_share_an_answer():
    train, test = read_questions(split="train"), read_questions(split="test")
    answers = [{normalize_answer(a) for q in qs for a in q.golden_answers} for qs in (train, test)]
    assert train and test and not answers[0] & answers[1]
    assert len(train) + len(test) == len(
        read_questions("agentrl/envs/search/data/wordnet_questions.jsonl")
    )


def test_every_built_in_environment_takes_a_split():
    counts = {}
    for env_id, kwargs in [
        ("agentrl/Math-v0", {"generated_count": 50}),
        ("agentrl/Search-v0", {}),
        ("agentrl/Code-v0", {}),
        ("agentrl/SWE-v0", {"sandbox": "bwrap"}),
    ]:
        for split in ("train", "test"):
            env = gymnasium.make(env_id, split=split, **kwargs)
            counts[env_id, split] = env.unwrapped.num_tasks
            env.close()
    assert counts["agentrl/Math-v0", "train"] == counts["agentrl/Math-v0", "test"] == 50
    assert counts["agentrl/Search-v0", "test"] < counts["agentrl/Search-v0", "train"]
    assert counts["agentrl/Code-v0", "train"] == counts["agentrl/Code-v0", "test"] == 164
    assert counts["agentrl/SWE-v0", "train"] + counts["agentrl/SWE-v0", "test"] == 33
    for env_id in ("agentrl/Math-v0", "agentrl/Search-v0"):
        with pytest.raises(ValueError, match=r"splits \('train', 'test'\), not 'validation'"):
            gymnasium.make(env_id, split="validation")


def test_swe_train_and_test_never_share_a_bug():
    from agentrl.envs.swe.env import bug_key

    splits = {}
    for split in ("train", "test"):
        env = gymnasium.make("agentrl/SWE-v0", split=split, sandbox="bwrap")
        splits[split] = {bug_key(i) for i in env.unwrapped.instances}
        env.close()
    assert splits["train"] and splits["test"] and not splits["train"] & splits["test"]
    with pytest.raises(ValueError, match="instance_ids or split, not both"):
        gymnasium.make("agentrl/SWE-v0", split="test", instance_ids=["toolz__1.2.0-5"])


def test_a_swe_instances_file_is_used_whole(tmp_path):
    """A user's rows are never re-split (as a Math-v0 file): all 33 shipped instances written
    to a file give 33 tasks, whatever the split."""
    from agentrl.envs.swe.env import SHIPPED_INSTANCES
    from agentrl.envs.swe.instances import load_instances, write_instances

    path = tmp_path / "rows.jsonl"
    write_instances(load_instances(SHIPPED_INSTANCES), path)
    for split in ("train", "test"):
        env = gymnasium.make("agentrl/SWE-v0", instances=str(path), split=split, sandbox="bwrap")
        assert env.unwrapped.num_tasks == 33
        env.close()
