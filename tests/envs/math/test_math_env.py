import asyncio
import json

import gymnasium
import pytest
from gymnasium.utils.env_checker import check_env

import agentrl  # noqa: F401  (registers the environments)
from agentrl.envs.math import MathEnv, extract_answer


def make(**kwargs):
    return gymnasium.make("agentrl/Math-v0", **kwargs)


@pytest.mark.parametrize(
    "kwargs", [{}, {"mode": "multi"}, {"mode": "multi", "tool_format": "hermes"}]
)
def test_check_env_passes(kwargs, strict_gymnasium_warnings):
    check_env(make(**kwargs).unwrapped, skip_render_check=True)


def test_reset_gives_system_and_problem_with_tool_schemas():
    obs, info = make(mode="multi").reset(seed=0)
    assert [m["role"] for m in obs] == ["system", "user"]
    assert "<python>" in obs[0]["content"]
    assert [t["function"]["name"] for t in info["tools"]] == ["python"]
    assert make().reset(seed=0)[1]["tools"] == []


def test_reset_by_index_and_bad_index():
    env = make()
    obs, info = env.reset(options={"index": 3})
    problem = env.unwrapped.problems[3]
    assert obs[1]["content"] == problem.question and info["problem_id"] == problem.id
    with pytest.raises(IndexError, match="outside"):
        env.reset(options={"index": 10_000})


@pytest.mark.parametrize(
    ("template", "correct", "fmt"),
    [
        ("The answer is \\boxed{{{answer}}}.", 1.0, 1.0),
        ("<answer>{answer}</answer>", 1.0, 1.0),
        ("<answer>{answer}1</answer>", 0.0, 1.0),
        ("I think it is {answer}.", 0.0, 0.0),
    ],
)
def test_single_turn_reward_components(template, correct, fmt):
    env = make()
    _, info = env.reset(seed=1)
    obs, reward, terminated, truncated, info = env.step(template.format(answer=info["gold_answer"]))
    assert (obs, reward, terminated, truncated) == ([], correct, True, False)
    assert info["reward_components"] == {"correct": correct, "format": fmt}


def test_answer_format_restricts_what_counts():
    env = make(answer_format="answer_tag")
    _, info = env.reset(seed=1)
    _, reward, _, _, info = env.step(f"\\boxed{{{info['gold_answer']}}}")
    assert reward == 0.0 and info["reward_components"]["format"] == 0.0


def test_multi_turn_python_tool_then_answer():
    env = make(mode="multi", max_turns=4)
    _, info = env.reset(seed=2)
    gold = info["gold_answer"]
    obs, reward, terminated, _, info = env.step(
        f"Let me compute.\n<python>\nprint({gold} * 1)\n</python>"
    )
    assert (reward, terminated) == (0.0, False)
    assert obs == [{"role": "tool", "name": "python", "content": f"{gold}\n"}]
    assert info == {"tool_calls": 1, "tool_errors": 0}
    _, reward, terminated, _, _ = env.step(f"So \\boxed{{{gold}}}")
    assert (reward, terminated) == (1.0, True)


def test_multi_turn_hermes_calls():
    env = make(mode="multi", tool_format="hermes")
    env.reset(seed=0)
    call = json.dumps({"name": "python", "arguments": {"code": "print(6*7)"}})
    obs, *_ = env.step(f"<tool_call>{call}</tool_call>")
    assert obs[0]["content"].strip() == "42"


@pytest.mark.parametrize(
    ("action", "expected"),
    [
        ("<python>print(1)", "unterminated"),
        ('<tool_call>{"name": "python", "arguments": {"code": 5}}</tool_call>', "code"),
        ('<tool_call>{"name": "python", "arguments": {bad json}}</tool_call>', "JSON"),
        ('<tool_call>{"name": "shell", "arguments": {"cmd": "ls"}}</tool_call>', "python"),
        ("<python>raise ValueError('boom')</python>", "boom"),
        ("<python>while True: pass</python>", "timed out"),
    ],
)
def test_malformed_or_failing_calls_come_back_as_observations(action, expected):
    fmt = "hermes" if "tool_call" in action else "tags"
    env = make(mode="multi", tool_format=fmt, python_timeout=1.0)
    env.reset(seed=0)
    obs, reward, terminated, truncated, _ = env.step(action)
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert len(obs) == 1 and obs[0]["role"] == "tool"
    assert expected.lower() in obs[0]["content"].lower()


def test_multi_turn_without_call_or_answer_ends_the_episode():
    env = make(mode="multi")
    env.reset(seed=0)
    _, reward, terminated, _, info = env.step("I give up.")
    assert (reward, terminated) == (0.0, True) and info["reward_components"]["format"] == 0.0


def test_turn_limit_truncates_tool_loops():
    env = make(mode="multi", max_turns=2)
    env.reset(seed=0)
    assert env.step("<python>print(1)</python>")[3] is False
    assert env.step("<python>print(1)</python>")[3] is True


@pytest.mark.parametrize(
    ("text", "fmt", "expected"),
    [
        ("<answer> 5 </answer> and \\boxed{6}", "either", "5"),
        ("<answer> 5 </answer> and \\boxed{6}", "boxed", "6"),
        ("\\boxed{}", "either", None),
        ("<answer></answer>\\boxed{3}", "either", "3"),
    ],
)
def test_extract_answer(text, fmt, expected):
    assert extract_answer(text, fmt) == expected


async def test_thousand_concurrent_steps_share_one_loop_without_blocking_it():
    """1,000 environments step at once; verification runs in worker processes, so while the checks
    are in flight the loop keeps running other tasks. A probe task that only yields (`sleep(0)`)
    counts its turns: if verification ran on the loop, each astep would run to completion in one
    turn and the probe would get about one turn per round of 1,000 steps."""
    envs = [MathEnv() for _ in range(1000)]
    golds = []
    for i, env in enumerate(envs):
        _, info = await env.areset(seed=i)
        golds.append(info["gold_answer"])
    done = asyncio.Event()
    probe_turns = 0

    async def probe():
        nonlocal probe_turns
        while not done.is_set():
            probe_turns += 1
            await asyncio.sleep(0)

    probe_task = asyncio.create_task(probe())
    actions = [f"\\boxed{{{g}}}" if i % 2 == 0 else "\\boxed{-1}" for i, g in enumerate(golds)]
    results = await asyncio.gather(*(env.astep(a) for env, a in zip(envs, actions, strict=True)))
    done.set()
    await probe_task
    rewards = [r[1] for r in results]
    assert rewards == [1.0 if i % 2 == 0 else 0.0 for i in range(1000)]
    assert all(r[2] for r in results)
    assert probe_turns > 1000


def test_config_errors_are_clear():
    with pytest.raises(ValueError, match="generated_count"):
        make(generated_count=0)
    with pytest.raises(FileNotFoundError, match="dataset file not found"):
        make(dataset="/nonexistent/file.jsonl")


def test_loads_a_local_gsm8k_file(tmp_path):
    path = tmp_path / "gsm8k.jsonl"
    path.write_text(json.dumps({"question": "What is 2+3?", "answer": "2+3=5\n#### 5"}) + "\n")
    env = make(dataset=str(path))
    obs, info = env.reset(seed=0)
    assert obs[1]["content"] == "What is 2+3?" and info["gold_answer"] == "5"
    assert env.step("\\boxed{5}")[1] == 1.0


@pytest.mark.parametrize("mode", ["single", "multi"])
def test_flexible_format_grades_the_last_number_without_format_credit(mode):
    env = make(answer_format="flexible", mode=mode)
    _, info = env.reset(seed=1)
    gold = info["gold_answer"]
    _, reward, terminated, _, info = env.step(f"First 3, then 1,000, so it is {gold}.")
    assert (reward, terminated) == (1.0, True)
    assert info["reward_components"] == {"correct": 1.0, "format": 0.0}
    env.reset(seed=1)
    _, reward, _, _, info = env.step(f"\\boxed{{{gold}}} not 99999")
    assert info["reward_components"] == {"correct": 1.0, "format": 1.0}


def test_flexible_format_still_runs_tool_calls_first():
    env = make(answer_format="flexible", mode="multi")
    env.reset(seed=1)
    obs, reward, terminated, _, _ = env.step("<python>print(2 + 2)</python> maybe 4")
    assert (obs[0]["content"], reward, terminated) == ("4\n", 0.0, False)


@pytest.mark.parametrize("sandbox", ["bwrap", pytest.param("container", marks=pytest.mark.slow)])
def test_python_tool_keeps_state_within_an_episode_and_not_across(sandbox):
    env = make(mode="multi", sandbox=sandbox)
    try:
        env.reset(seed=2)
        env.step("<python>x = 6 * 7\nopen('note.txt', 'w').write('kept')</python>")
        obs, *_ = env.step("<python>print(x, open('note.txt').read())</python>")
        assert obs[0]["content"] == "42 kept\n"
        _, _, terminated, _, _ = env.step("\\boxed{1}")
        assert terminated and not env.unwrapped.sandbox.started  # the episode's sandbox is gone
        env.reset(seed=3)
        obs, *_ = env.step("<python>import os\nprint('x' in dir(), os.listdir('.'))</python>")
        assert obs[0]["content"] == "False []\n"
    finally:
        env.close()


def test_subprocess_python_tool_is_still_available():
    env = make(mode="multi", sandbox="subprocess")
    env.reset(seed=2)
    obs, *_ = env.step("<python>x = 1</python>")
    obs, *_ = env.step("<python>print(x)</python>")
    assert "NameError" in obs[0]["content"]  # a fresh process per call: nothing persists


def test_a_verifier_that_cannot_run_is_an_infrastructure_failure():
    from agentrl.envs import INFRA_ERROR
    from agentrl.envs.math.verifier import shared_pool

    env = make()
    _, info = env.reset(seed=1)
    broken = shared_pool.executor()
    broken.shutdown(wait=True)  # the worker processes are gone: nothing can be verified
    try:
        _, reward, terminated, _, info = env.step(f"\\boxed{{{info['gold_answer']}}}")
    finally:
        shared_pool._discard(broken)  # the next check starts a fresh pool
    assert (reward, terminated) == (0.0, True)
    assert "verifier failed" in info[INFRA_ERROR] and info["verifier_error"] == info[INFRA_ERROR]
    _, info = env.reset(seed=1)
    _, reward, _, _, info = env.step(f"\\boxed{{{info['gold_answer']}}}")
    assert reward == 1.0 and INFRA_ERROR not in info
