"""docs/env_options.md is generated from the environments' config classes and kept in sync."""

from pathlib import Path

import gymnasium
import pytest

from agentrl.config import ConfigError
from agentrl.envs import BUILTIN_ENVS
from agentrl.envs.options import ENV_CONFIGS, REGENERATE, env_options_markdown

PAGE = Path(__file__).parents[2] / "docs" / "env_options.md"


def test_env_options_page_is_current():
    assert PAGE.read_text() == env_options_markdown(), f"docs/env_options.md is stale: {REGENERATE}"


def test_every_builtin_env_has_its_options_documented():
    assert set(ENV_CONFIGS) == set(BUILTIN_ENVS)


@pytest.mark.parametrize("env_id", sorted(ENV_CONFIGS))
def test_documented_config_is_the_one_make_checks(env_id):
    # The config is checked before the environment builds anything, so an unknown key fails fast
    # and lists the valid keys: those of the class the page documents.
    valid = ", ".join(ENV_CONFIGS[env_id].model_fields)
    with pytest.raises(ConfigError, match=f"valid keys: {valid}$"):
        gymnasium.make(env_id, no_such_option=1)
