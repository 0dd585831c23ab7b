import subprocess
import sys
import textwrap
from pathlib import Path

import gymnasium
import pytest

import agentrl
from agentrl.config import ConfigError
from agentrl.envs import BUILTIN_ENVS, EpisodeGuard, TurnLimit, register_env

PLUGIN_DIR = Path(__file__).parents[1] / "plugins" / "agentrl-echo"


def test_import_registers_every_builtin():
    for env_id in BUILTIN_ENVS:
        assert env_id in gymnasium.registry


def test_make_returns_guarded_env_with_async_verbs():
    env = gymnasium.make("agentrl/Math-v0", max_turns=3)
    assert isinstance(env, EpisodeGuard) and isinstance(env.env, TurnLimit)
    assert isinstance(env.unwrapped, agentrl.AgentEnv)
    assert callable(env.astep) and callable(env.areset)


def test_unknown_id_is_a_clear_error():
    with pytest.raises(gymnasium.error.NameNotFound, match="Mth"):
        gymnasium.make("agentrl/Mth-v0")
    with pytest.raises(gymnasium.error.Error):
        gymnasium.make("agentrl/Math-v9")


def test_bad_keyword_arguments_name_the_key():
    with pytest.raises(ConfigError, match=r"(?s)modee: unknown key.*valid keys: dataset"):
        gymnasium.make("agentrl/Math-v0", modee="multi")
    with pytest.raises(ConfigError, match=r"mode: Input should be 'single' or 'multi'"):
        gymnasium.make("agentrl/Math-v0", mode="many")
    with pytest.raises(ConfigError, match="verify_timeout"):
        gymnasium.make("agentrl/Math-v0", verify_timeout="soon")


def test_register_env_validates_target():
    with pytest.raises(ValueError, match=r"package\.module:Class"):
        register_env("tests/Bad-v0", "not_a_target")


def test_register_and_make_a_custom_env():
    register_env("tests/Echo-v0", "agentrl_echo:EchoEnv")
    env = gymnasium.make("tests/Echo-v0", attempts=2, max_turns=1)
    env.reset(seed=0)
    assert env.step("no")[3] is True  # truncated by max_turns


def test_entry_point_plugin_is_registered_on_import(tmp_path):
    """Install the example plugin package for real (pip, no network) and make its env in a fresh
    interpreter where only `import agentrl` can have registered it."""
    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(target),
            str(PLUGIN_DIR),
        ],
        check=True,
    )
    script = textwrap.dedent(
        """
        import gymnasium
        assert "echo/Echo-v0" not in gymnasium.registry
        import agentrl
        env = gymnasium.make("echo/Echo-v0", attempts=1)
        obs, info = env.reset(seed=1)
        print(type(env.unwrapped).__module__, obs[0]["role"], env.step("x")[2])
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script],
        env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.split() == ["agentrl_echo", "user", "True"]


def test_broken_plugin_entry_point_warns_and_is_skipped(tmp_path):
    dist = tmp_path / "broken_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[agentrl.envs]\nnot an id = x:Y\n")
    script = "import warnings\nwarnings.simplefilter('always')\nimport agentrl"
    out = subprocess.run(
        [sys.executable, "-c", script],
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert "broken-plugin" in out.stderr and "skipped" in out.stderr


def test_register_env_takes_a_class_and_rejects_non_agent_envs():
    from agentrl_echo import EchoEnv

    register_env("tests/EchoClass-v0", EchoEnv)
    assert gymnasium.make("tests/EchoClass-v0").reset(seed=0)[0]
    with pytest.raises(TypeError, match="not an AgentEnv"):
        register_env("tests/Dict-v0", dict)


@pytest.mark.parametrize("env_id", sorted(BUILTIN_ENVS))
def test_every_builtin_env_passes_check_env(env_id, strict_gymnasium_warnings):
    from gymnasium.utils.env_checker import check_env

    env = gymnasium.make(env_id).unwrapped
    try:
        check_env(env, skip_render_check=True)
    finally:
        env.close()  # check_env never closes: SWE-v0's last sandbox would outlive the test
