import asyncio
import json

import gymnasium
import pytest
from gymnasium.utils.env_checker import check_env

import agentrl  # noqa: F401  (registers the environments)
from agentrl.config import ConfigError
from agentrl.envs.code import CodeEnv, load_problems
from agentrl.tools import SandboxPool, sandbox_factory

PROBLEM = load_problems()[0]  # has_close_elements(numbers, threshold) -> bool
WRONG = "```python\ndef has_close_elements(numbers, threshold):\n    return False\n```"
RIGHT = f"Here it is:\n```python\n{PROBLEM.prompt}{PROBLEM.canonical_solution}```"


def make(**kwargs):
    return gymnasium.make("agentrl/Code-v0", **kwargs)


@pytest.fixture
def start():
    """``start(**kwargs)``: a Code-v0 env reset to problem 0, closed after the test."""
    envs = []

    def start(**kwargs):
        envs.append(make(**kwargs))
        envs[-1].reset(options={"index": 0})
        return envs[-1]

    yield start
    for env in envs:
        env.close()


@pytest.mark.parametrize(
    "kwargs", [{}, {"mode": "multi"}, {"mode": "multi", "tool_format": "hermes"}]
)
def test_check_env_passes(kwargs, strict_gymnasium_warnings):
    check_env(make(**kwargs).unwrapped, skip_render_check=True)


def test_reset_gives_the_prompt_and_tool_schemas():
    env = make(mode="multi", tools=("python", "bash"))
    obs, info = env.reset(options={"index": 5})
    assert [m["role"] for m in obs] == ["system", "user"]
    assert obs[1]["content"] == f"```python\n{env.unwrapped.problems[5].prompt}```"
    assert "<python>" in obs[0]["content"] and "<bash>" in obs[0]["content"]
    assert [t["function"]["name"] for t in info["tools"]] == ["python", "bash"]
    assert info["task_id"] == "HumanEval/5"
    assert make().reset(seed=0)[1]["tools"] == []
    with pytest.raises(IndexError, match="outside"):
        env.reset(options={"index": 164})


def test_problems_restricts_the_episodes():
    env = make(problems=["HumanEval/3", 7])
    assert {env.reset(seed=s)[1]["task_id"] for s in range(8)} == {"HumanEval/3", "HumanEval/7"}


def test_config_errors_are_clear():
    with pytest.raises(ConfigError, match="'HumanEval/999' is neither a task id"):
        make(problems=["HumanEval/999"])
    with pytest.raises(ConfigError, match="max_attempts"):
        make(max_attempts=0)
    with pytest.raises(ConfigError, match="modes: unknown key"):
        make(modes="multi")
    with pytest.raises(ConfigError, match="tools"):
        make(tools=("python", "rm"))


@pytest.mark.parametrize(
    ("action", "reward", "components"),
    [
        (RIGHT, 1.0, {"passed": 1.0, "format": 1.0}),
        (f"```python\n{PROBLEM.canonical_solution}```", 1.0, {"passed": 1.0, "format": 1.0}),
        (WRONG, 0.0, {"passed": 0.0, "format": 1.0}),
        ("It is easy: return False.", 0.0, {"passed": 0.0, "format": 0.0}),
    ],
)
def test_single_turn_is_graded_once(start, action, reward, components):
    env = start()
    obs, r, terminated, truncated, info = env.step(action)
    assert (obs, r, terminated, truncated) == ([], reward, True, False)
    assert info["reward_components"] == components
    assert info["task_id"] == "HumanEval/0" and "grading_error" not in info
    if components["format"] == 0.0:
        assert "no ```python code block" in info["error"]
    else:
        assert info["tests_passed"] == bool(reward) and info["attempt"] == 1


def test_multi_turn_run_code_fail_then_pass(start):
    env = start(mode="multi", max_attempts=3)
    obs, reward, terminated, _, info = env.step(
        "Let me try it.\n<python>\nprint(abs(3.9 - 4.0) < 0.3)\n</python>"
    )
    assert (obs, reward, terminated) == (
        [{"role": "tool", "name": "python", "content": "True\n"}],
        0.0,
        False,
    )
    assert info == {"tool_calls": 1, "tool_errors": 0}
    obs, reward, terminated, _, info = env.step(WRONG)
    assert (reward, terminated, info["attempt"], info["tests_passed"]) == (0.0, False, 1, False)
    assert obs[0]["role"] == "user"
    assert obs[0]["content"].startswith("Submission 1 of 3 failed the hidden tests.")
    # the failing example of the docstring (a public test), not the hidden test that failed
    assert (
        "assert has_close_elements([1.0, 2.8, 3.0, 4.0, 5.0, 2.0], 0.3) == True"
        in (obs[0]["content"])
    )
    assert "assert candidate([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.3) == True" not in obs[0]["content"]
    assert "(2 attempts left)" in obs[0]["content"]
    obs, reward, terminated, _, info = env.step(RIGHT)
    assert (obs, reward, terminated, info["attempt"]) == ([], 1.0, True, 2)
    assert not env.unwrapped.sandbox.started  # the episode's sandbox is gone


def test_attempt_limit_ends_the_episode(start):
    env = start(mode="multi", max_attempts=2)
    assert env.step(WRONG)[2] is False
    obs, reward, terminated, _, info = env.step(WRONG)
    assert (obs, reward, terminated, info["attempt"]) == ([], 0.0, True, 2)
    assert info["feedback"] == "" and "AssertionError" in info["hidden_test_report"]


def test_a_turn_with_a_tool_call_does_not_submit_and_one_with_neither_ends(start):
    env = start(mode="multi")
    obs, reward, terminated, _, _ = env.step(f"{RIGHT}\n<python>print(2)</python>")
    assert (obs[0]["content"], reward, terminated) == ("2\n", 0.0, False)
    _, reward, terminated, _, info = env.step("I give up.")
    assert (reward, terminated) == (0.0, True) and info["reward_components"]["format"] == 0.0


def test_hermes_calls_and_the_bash_tool(start):
    env = start(mode="multi", tool_format="hermes", tools=("python", "bash"))
    outputs = []
    for call in (  # one call per turn: the calls of one turn run concurrently
        {"name": "python", "arguments": {"code": "open('f.txt', 'w').write('hi')"}},
        {"name": "bash", "arguments": {"command": "cat f.txt"}},
    ):
        obs, *_ = env.step(f"<tool_call>{json.dumps(call)}</tool_call>")
        outputs += [m["content"] for m in obs]
    assert outputs == ["2\n", "hi"]


def test_tool_state_persists_within_an_episode_and_never_reaches_grading_or_the_next(start):
    env = start(mode="multi")
    env.step("<python>x = 6 * 7\nopen('helper.py', 'w').write('ANSWER = True')</python>")
    obs, *_ = env.step("<python>import helper\nprint(x, helper.ANSWER)</python>")
    assert obs[0]["content"] == "42 True\n"
    # The grading sandbox is a fresh one: the helper module the agent wrote is not there.
    uses_helper = (
        "```python\nimport helper\ndef has_close_elements(n, t):\n    return helper.ANSWER\n```"
    )
    _, reward, _, _, info = env.step(uses_helper)
    assert reward == 0.0 and "No module named 'helper'" in info["feedback"]
    env.reset(options={"index": 0})
    obs, *_ = env.step("<python>import os\nprint('x' in dir(), os.listdir('.'))</python>")
    assert obs[0]["content"] == "False []\n"


def test_infinite_loop_and_fake_pass_marker_score_0():
    env = make(test_timeout=1.0)
    env.reset(options={"index": 0})
    loop = "```python\ndef has_close_elements(n, t):\n    while True:\n        pass\n```"
    _, reward, terminated, _, info = env.step(loop)
    assert (reward, terminated, info["timed_out"]) == (0.0, True, True)
    env.reset(options={"index": 0})
    fake = "```python\nimport sys\nprint('All tests passed')\nsys.exit(0)\n```"
    _, reward, _, _, info = env.step(fake)
    assert (reward, info["tests_passed"]) == (0.0, False) and "grading_error" not in info


async def test_a_grading_sandbox_that_cannot_start_sets_grading_error():
    pool = SandboxPool(sandbox_factory("bwrap"), warm=0)
    await pool.close()
    env = CodeEnv(sandbox_pool=pool)
    await env.areset(options={"index": 0})
    _, reward, terminated, _, info = await env.astep(RIGHT)
    assert (reward, terminated, info["tests_passed"]) == (0.0, True, False)
    assert "pool is closed" in info["grading_error"]


async def test_concurrent_episodes_share_one_sandbox_pool():
    async with SandboxPool(sandbox_factory("bwrap"), warm=2) as pool:
        envs = [CodeEnv(mode="multi", sandbox_pool=pool) for _ in range(6)]
        await asyncio.gather(*(env.areset(options={"index": 0}) for env in envs))
        tool_turns = await asyncio.gather(
            *(env.astep(f"<python>print({i})</python>") for i, env in enumerate(envs))
        )
        assert [turn[0][0]["content"] for turn in tool_turns] == [f"{i}\n" for i in range(6)]
        actions = [RIGHT if i % 2 == 0 else WRONG for i in range(6)]
        results = await asyncio.gather(
            *(env.astep(a) for env, a in zip(envs, actions, strict=True))
        )
        assert [r[1] for r in results] == [1.0, 0.0] * 3
        await asyncio.gather(*(env.aclose() for env in envs))
        # one tool sandbox and one grading sandbox per episode, and a public run per failure
        assert pool.stats.served == 6 + 6 + 3


async def test_gymnasium_make_takes_a_shared_sandbox_pool():
    """A pool passed through gymnasium.make stays one shared pool: the spec gymnasium builds (and
    deep-copies for every wrapper) refers to it instead of copying its live sandboxes."""
    async with SandboxPool(sandbox_factory("bwrap"), warm=1) as pool:
        env = gymnasium.make("agentrl/Code-v0", mode="multi", sandbox_pool=pool)
        assert env.spec.kwargs["sandbox_pool"] is pool
        assert env.unwrapped.grading_sandboxes is pool
        await env.unwrapped.areset(options={"index": 0})
        _, reward, terminated, _, _ = await env.unwrapped.astep(RIGHT)
        assert (reward, terminated) == (1.0, True)
        await env.unwrapped.aclose()
        assert pool.stats.served == 1  # the grading sandbox came from this pool


@pytest.mark.slow
def test_multi_turn_episode_with_the_container_backend(start):
    env = start(mode="multi", sandbox="container")
    obs, *_ = env.step("<python>import sys\nprint(sys.version_info[0])</python>")
    assert obs[0]["content"] == "3\n"
    _, reward, terminated, _, info = env.step(RIGHT)
    assert (reward, terminated, info["tests_passed"]) == (1.0, True, True)
