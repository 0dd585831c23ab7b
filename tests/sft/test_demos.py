"""`agentrl demos`: constructed demonstrations replayed in fresh real environments (bwrap
sandboxes), rejection sampling of rollout records, and the command's errors."""

import json
import subprocess
import sys

import gymnasium
import pytest

import agentrl  # noqa: F401  (registers the environments)
from agentrl.cli import main
from agentrl.envs import INFRA_ERROR
from agentrl.envs.code import load_problems
from agentrl.rollout.trajectory import Trajectory, Turn
from agentrl.sft.code_demos import code_examples, code_mutations
from agentrl.sft.demos import (
    constructed_demonstrations,
    math_solution_code,
    successful_trajectories,
)
from agentrl.tokenization import TokenTrajectory

MATH = "agentrl/Math-v0"
CODE = "agentrl/Code-v0"


@pytest.mark.parametrize(
    ("question", "code", "answer"),
    [
        (
            "Ava has 3 coins. Then Ava gets 4 more. How many coins does Ava have now?",
            "coins = 3\ncoins += 4\nprint(coins)",
            "7",
        ),
        (
            "Ben has 40 shells. Then Ben gives away 12. Then the number of shells is multiplied "
            "by 3. How many shells does Ben have now?",
            "shells = 40\nshells -= 12\nshells *= 3\nprint(shells)",
            "84",
        ),
        (
            "Jia has 9 cards. Then the number of cards is multiplied by 2. Then Jia gets 5 more. "
            "Then Jia gives away 20. How many cards does Jia have now?",
            "cards = 9\ncards *= 2\ncards += 5\ncards -= 20\nprint(cards)",
            "3",
        ),
    ],
)
def test_math_solution_code_computes_generated_questions(question, code, answer):
    assert math_solution_code(question) == code
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout == (
        answer + "\n"
    )


@pytest.mark.parametrize(
    "question",
    [
        "What is 2 + 3?",
        "Ava has 3 coins. How many coins does Ava have now?",  # no operation
        "Ava has 3 coins. Then Ava finds 4 more. How many coins does Ava have now?",
        "Ava has 3 coins. Then Ava gets 4 more. How many coins are left?",
    ],
)
def test_math_solution_code_is_none_for_other_text(question):
    assert math_solution_code(question) is None


def test_code_examples_are_the_public_tests_and_never_the_hidden_ones():
    problems = load_problems()
    first = code_examples(problems[0])  # doctest examples, result on the next line
    assert [(e.call, e.expected) for e in first] == [
        ("has_close_elements([1.0, 2.0, 3.0], 0.5)", "False"),
        ("has_close_elements([1.0, 2.8, 3.0, 4.0, 5.0, 2.0], 0.3)", "True"),
    ]
    # no example in the docstring: nothing (the hidden tests' calls are not shown either)
    assert code_examples(problems[83]) == []
    assert code_examples(problems[38]) == []  # decode_cyclic: tested on random strings only
    for problem in problems:
        public = {test.call for test in problem.public_tests}
        assert all(example.call in public for example in code_examples(problem, limit=10))


def test_code_mutations_plant_one_line_bugs_outside_while_loops():
    program = (
        "def f(xs):\n"
        "    i = 0\n"
        "    while i < len(xs) - 1:\n"
        "        i += 1\n"
        "    return [x for x in xs if x > 0][: len(xs) - 1]\n"
    )
    mutations = code_mutations(program, first_line=2)
    assert [(m.line, m.broken_line) for m in mutations] == [
        (
            "return [x for x in xs if x > 0][: len(xs) - 1]",
            "return [x for x in xs if x > 0][: len(xs)]",
        ),
        (
            "return [x for x in xs if x > 0][: len(xs) - 1]",
            "return [x for x in xs if x >= 0][: len(xs) - 1]",
        ),
    ]
    assert all(m.program.count("\n") == program.count("\n") for m in mutations)


async def replay(env_id, env_kwargs, row):
    """Step a fresh environment with the row's assistant turns: it must answer with the row's own
    messages, and end with reward 1 and no infrastructure error."""
    env = gymnasium.make(env_id, **env_kwargs)
    try:
        conversation = row["messages"]
        messages, info = await env.areset(seed=row["index"], options={"index": row["index"]})
        assert conversation[: len(messages)] == messages
        assert row["tools"] == info["tools"]
        position = len(messages)
        while position < len(conversation):
            assert conversation[position]["role"] == "assistant"
            observation, reward, terminated, _, info = await env.astep(
                conversation[position]["content"]
            )
            position += 1
            assert conversation[position : position + len(observation)] == observation
            position += len(observation)
        assert terminated and reward == 1.0 and not info.get(INFRA_ERROR)
    finally:
        await env.aclose()


async def demonstrations(env_id, env_kwargs, indices):
    rows = [row async for row in constructed_demonstrations(env_id, env_kwargs, indices)]
    return sorted((row for row in rows if row is not None), key=lambda row: row["index"])


def check_row(row, env_id, env_kwargs):
    assert row["reward"] == 1.0 and row["source"] == "constructed"
    assert row["env_id"] == env_id and json.loads(row["env_kwargs"]) == env_kwargs
    assert row["messages"][-1]["role"] == "assistant"
    assert any(message["role"] == "tool" for message in row["messages"])


@pytest.mark.parametrize("tool_format", ["tags", "hermes"])
async def test_math_demonstrations_replay_in_a_fresh_environment(tool_format):
    kwargs = {"mode": "multi", "tool_format": tool_format, "sandbox": "bwrap"}
    kwargs["generated_difficulty"] = 2
    rows = await demonstrations(MATH, kwargs, range(4))
    assert len(rows) == 4  # every generated problem is demonstrable
    parser = gymnasium.make(MATH, **kwargs).unwrapped.parser
    for row in rows:
        check_row(row, MATH, kwargs)
        question, call, tool = row["messages"][1], row["messages"][2], row["messages"][3]
        (parsed,) = parser.parse(call["content"]).calls
        code = parsed.arguments["code"]
        assert code == math_solution_code(question["content"])
        rerun = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert tool["role"] == "tool" and tool["content"] == rerun.stdout
        await replay(MATH, kwargs, row)


@pytest.mark.parametrize(("tool_format", "indices"), [("tags", [0, 3, 14]), ("hermes", [14, 38])])
async def test_code_demonstrations_replay_in_a_fresh_environment(tool_format, indices):
    kwargs = {"mode": "multi", "tool_format": tool_format, "sandbox": "bwrap"}
    rows = await demonstrations(CODE, kwargs, indices)
    assert [row["index"] for row in rows] == indices
    for row in rows:
        check_row(row, CODE, kwargs)
        assert "```python" in row["messages"][-1]["content"]
        await replay(CODE, kwargs, row)
    fixed = next(row for row in rows if row["index"] == 14)  # every third problem: a bug, fixed
    tools = [message["content"] for message in fixed["messages"] if message["role"] == "tool"]
    assert tools == ["['', 'a', 'ab']\n", "['a', 'ab', 'abc']\n"]
    assert "should be `result.append(string[:i+1])`" in fixed["messages"][-3]["content"]


def trajectory(reward, *, terminated=True, error=None, infra_error=None, last="assistant"):
    messages = [{"role": "user", "content": "2+2?"}, {"role": last, "content": "4"}]
    tokens = TokenTrajectory(
        input_ids=[1, 2, 3],
        loss_mask=[0, 1, 1],
        logprobs=[0.0, -0.5, -0.1],
        versions=[-1, 0, 0],
        prompt_length=1,
    )
    return Trajectory(
        env_id=MATH,
        group=0,
        sample=0,
        seed=7,
        tokens=tokens,
        messages=messages,
        turns=[Turn(1, 2, "stop", 0, 0.1)],
        reward=reward,
        terminated=terminated,
        truncated=not terminated,
        error=error,
        infra_error=infra_error,
    )


REJECTION_CASES = [
    (trajectory(1.0), True),
    (trajectory(0.5), False),  # under the threshold
    (trajectory(1.0, terminated=False), False),  # cut by a limit
    (trajectory(1.0, error="engine died"), False),
    (trajectory(1.0, infra_error="no sandbox"), False),
    (trajectory(1.0, last="user"), False),  # does not end with an assistant turn
]


def test_rejection_sampling_keeps_ended_error_free_episodes_over_the_threshold():
    records = [json.loads(json.dumps(t.to_record())) for t, _ in REJECTION_CASES]
    tools = [{"type": "function", "function": {"name": "python"}}]
    rows = successful_trajectories(records, min_reward=0.9, tools=tools)
    assert len(rows) == sum(keep for _, keep in REJECTION_CASES) == 1
    assert rows[0]["messages"] == REJECTION_CASES[0][0].messages
    assert rows[0]["tools"] == tools and rows[0]["source"] == "rejection_sampling"
    assert len(successful_trajectories(records, min_reward=0.5)) == 2


def test_demos_command_writes_math_demonstrations(tmp_path, capsys):
    out = tmp_path / "demos" / "math.jsonl"
    argv = ["demos", "--env", MATH, "--env-kwargs", "mode=multi", "sandbox=bwrap"]
    assert main([*argv, "--count", "3", "--out", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 3 and all(row["reward"] == 1.0 for row in rows)
    assert "3 verified demonstrations (3 tasks tried, 0 skipped)" in capsys.readouterr().out
    assert [path.name for path in out.parent.iterdir()] == ["math.jsonl"]  # no side file left


def test_demos_command_keeps_successful_rollouts(tmp_path, capsys):
    rollouts = tmp_path / "r.jsonl"
    lines = [json.dumps(t.to_record()) for t, _ in REJECTION_CASES]
    rollouts.write_text("\n".join(lines) + "\n")
    out = tmp_path / "kept.jsonl"
    argv = ["demos", "--env", MATH, "--env-kwargs", "mode=multi", "--from-rollouts"]
    assert main([*argv, str(rollouts), "--out", str(out)]) == 0
    (row,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert row["tools"][0]["function"]["name"] == "python"
    assert "1 of 6 episodes kept" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--env", "agentrl/Nope-v0"], "--env agentrl/Nope-v0: Environment `Nope` doesn't exist"),
        (["--env", CODE, "--env-kwargs", "modes=multi"], "--env-kwargs: agentrl/Code-v0: invalid"),
        (["--env", CODE], "pass --env-kwargs mode=multi"),
        (["--env", "CartPole-v1"], "not an agentrl environment"),
        (["--env", MATH, "--from-rollouts", "missing.jsonl"], "no such file: missing.jsonl"),
        (["--env", MATH, "--from-rollouts", "{notjson}"], "line 2 is not JSON"),
        (
            ["--env", MATH, "--from-rollouts", "{other}"],
            "line 1 is not an `agentrl rollout` record",
        ),
    ],
)
def test_demos_command_errors_are_one_clear_line(argv, message, tmp_path, capsys):
    (tmp_path / "notjson.jsonl").write_text("\nnot json\n")
    (tmp_path / "other.jsonl").write_text('{"messages": "[]"}\n')
    argv = [
        a.format(notjson=tmp_path / "notjson.jsonl", other=tmp_path / "other.jsonl") for a in argv
    ]
    out = tmp_path / "out.jsonl"
    out.write_text("an earlier run\n")
    assert main(["demos", *argv, "--out", str(out)]) == 2
    error = capsys.readouterr().err
    assert error.startswith("agentrl demos: ") and message in error
    assert out.read_text() == "an earlier run\n"  # untouched, and no side file
    assert sorted(path.name for path in tmp_path.iterdir()) == [
        "notjson.jsonl",
        "other.jsonl",
        "out.jsonl",
    ]


def test_a_failed_run_leaves_no_output(tmp_path, monkeypatch):
    async def broken(*args, **kwargs):
        raise RuntimeError("sandbox backend died")
        yield

    monkeypatch.setattr("agentrl.sft.demos.constructed_demonstrations", broken)
    out = tmp_path / "math.jsonl"
    argv = ["demos", "--env", MATH, "--env-kwargs", "mode=multi", "--out", str(out)]
    with pytest.raises(RuntimeError, match="backend died"):
        main(argv)
    assert list(tmp_path.iterdir()) == []


async def test_replay_would_catch_a_forged_tool_message():
    """The replay check is not vacuous: an edited tool message no longer matches the env's."""
    kwargs = {"mode": "multi", "sandbox": "bwrap"}
    (row,) = await demonstrations(MATH, kwargs, [0])
    row["messages"][3]["content"] = "999\n"
    with pytest.raises(AssertionError):
        await replay(MATH, kwargs, row)
