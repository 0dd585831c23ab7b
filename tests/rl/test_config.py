"""The training run's typed config: the YAML example, dotted overrides and clear errors."""

import importlib
from pathlib import Path

import pytest

from agentrl.config import ConfigError, apply_override, config_reference
from agentrl.rl.config import TrainConfig, config_reference_markdown

EXAMPLE = Path(__file__).parents[2] / "examples" / "math_grpo_cpu.yaml"


def test_the_example_config_loads_and_overrides_apply():
    config = TrainConfig.load(
        EXAMPLE, ["trainer.steps=50", "actor.lr=5e-6", "env.kwargs={mode: multi}"]
    )
    assert config.trainer.steps == 50
    assert config.actor.lr == 5e-6
    assert config.env.kwargs == {"mode": "multi"}  # a whole mapping replaces the file's
    assert config.rollout.group_size == 4  # from the file
    assert TrainConfig.load(None).trainer.steps == TrainConfig().trainer.steps


def test_unknown_keys_are_named_with_the_valid_keys_of_their_section():
    with pytest.raises(ConfigError) as info:
        TrainConfig.load(EXAMPLE, ["rollout.group_sise=8", "optimiser.lr=1"])
    message = str(info.value)
    assert "rollout.group_sise: unknown key" in message
    assert "group_size" in message.split("rollout.group_sise")[1].splitlines()[0]
    assert "optimiser: unknown key" in message
    assert "actor" in message.split("optimiser")[1].splitlines()[0]


def test_ill_typed_values_and_inconsistent_sections_are_refused():
    with pytest.raises(ConfigError, match=r"rollout\.group_size"):
        TrainConfig.load(None, ["rollout.group_size=lots"])
    with pytest.raises(
        ConfigError, match=r"micro_batch_tokens \(1024\) must be at least rollout.max_total_tokens"
    ):
        TrainConfig.load(None, ["rollout.max_total_tokens=4096", "trainer.micro_batch_tokens=1024"])
    with pytest.raises(ConfigError, match="does not exist"):
        TrainConfig.load("no/such/file.yaml")


@pytest.mark.parametrize(
    "setting",
    [
        "algorithm.aggregation=seq-mean-token-mean",
        "algorithm.loss=gspo",
        "algorithm.importance_level=sequence",
        "algorithm.rejection=geometric",
        "algorithm.advantage=gae",
    ],
)
def test_sequence_parallelism_refuses_what_needs_whole_sequences(setting):
    with pytest.raises(ConfigError, match="need\\(s\\) every sequence whole on one rank") as info:
        TrainConfig.load(None, ["actor.sequence_parallel=2", setting])
    assert setting.split("=")[0] in str(info.value)
    TrainConfig.load(None, [setting])  # fine without it
    with pytest.raises(ConfigError, match=r"critic\.sequence_parallel is not supported"):
        TrainConfig.load(None, ["algorithm.advantage=gae", "critic.sequence_parallel=2"])


def test_a_micro_batch_shared_by_sequence_parallel_ranks_may_hold_a_longer_trajectory():
    budget = ["trainer.micro_batch_tokens=2048", "actor.sequence_parallel=2"]
    TrainConfig.load(None, [*budget, "rollout.max_total_tokens=4096"])
    with pytest.raises(ConfigError, match=r"\(2048\) times actor.sequence_parallel \(2\) must"):
        TrainConfig.load(None, [*budget, "rollout.max_total_tokens=8192"])


@pytest.mark.parametrize("item", ["steps", "=3", "trainer..steps=3", "trainer.steps=[1"])
def test_malformed_overrides_are_refused(item):
    with pytest.raises(ConfigError, match="override"):
        apply_override({}, item)


def test_every_key_is_documented():
    rows = config_reference(TrainConfig)
    assert {"actor.lr", "stream.max_staleness", "trainer.steps", "env.kwargs"} <= {
        r[0] for r in rows
    }
    undocumented = [key for key, _, description in rows if not description]
    assert undocumented == []


def test_config_round_trips_through_yaml(tmp_path):
    config = TrainConfig.load(EXAMPLE, ["stream.max_staleness=1"])
    path = tmp_path / "config.yaml"
    path.write_text(config.to_yaml())
    assert TrainConfig.load(path) == config


def test_the_documented_reference_is_the_config():
    page = Path(__file__).parents[2] / "docs" / "train_config.md"
    assert page.read_text() == config_reference_markdown(), (
        "docs/train_config.md is stale: agentrl train --help-config --markdown > docs/train_config.md"
    )


def test_env_mix_is_one_way_with_unique_names():
    from agentrl.rl.config import TrainConfig

    mix = "env.mix=[{id: agentrl/Math-v0, weight: 3}, {id: agentrl/Code-v0}]"
    config = TrainConfig.load(None, [mix])
    assert [(s.label, s.weight) for s in config.env.specs()] == [("Math-v0", 3.0), ("Code-v0", 1.0)]
    assert [s.id for s in TrainConfig.load(None, []).env.specs()] == ["agentrl/Math-v0"]
    with pytest.raises(ConfigError, match=r"either env\.id / env\.kwargs or env\.mix"):
        TrainConfig.load(None, [mix, "env.id=agentrl/Code-v0"])
    with pytest.raises(ConfigError, match="names must differ"):
        TrainConfig.load(None, ["env.mix=[{id: agentrl/Math-v0}, {id: other/Math-v0}]"])
    with pytest.raises(ConfigError, match="weight"):
        TrainConfig.load(None, ["env.mix=[{id: agentrl/Math-v0, weight: 0}]"])


def test_engines_section_is_checked():
    from agentrl.rl.config import TrainConfig

    assert TrainConfig.load(None, []).engines.kind == "embedded"
    config = TrainConfig.load(None, ["engines.kind=attach", "engines.urls=[http://a:1]"])
    assert config.engines.urls == ["http://a:1"]
    with pytest.raises(ConfigError, match=r"needs engines\.urls"):
        TrainConfig.load(None, ["engines.kind=attach"])
    with pytest.raises(ConfigError, match=r"only for engines\.kind=attach"):
        TrainConfig.load(None, ["engines.kind=serve", "engines.urls=[http://a:1]"])
    with pytest.raises(ConfigError, match="weight_sync=tensor"):
        TrainConfig.load(None, ["engines.weight_sync=broadcast"])
    with pytest.raises(ConfigError, match="kind"):
        TrainConfig.load(None, ["engines.kind=vllm"])
    fp8 = TrainConfig.load(None, ["engines.fp8_weights=true", "engines.fp8_ignored_layers=[a]"])
    assert fp8.engines.fp8_weights and fp8.engines.fp8_ignored_layers == ["a"]
    with pytest.raises(ConfigError, match=r"fp8_weights is sent by weight_sync=tensor only"):
        TrainConfig.load(
            None, ["engines.kind=serve", "engines.fp8_weights=true", "engines.weight_sync=disk"]
        )
    with pytest.raises(ConfigError, match=r"fp8_ignored_layers is set but .*fp8_weights is off"):
        TrainConfig.load(None, ["engines.fp8_ignored_layers=[a]"])


def test_a_server_command_template_is_checked():
    from agentrl.rl.config import TrainConfig

    template = 'engines.command=[sglang-wrapper, "{model}", --port, "{port}", --gpu, "{gpu}"]'
    config = TrainConfig.load(None, ["engines.kind=sglang", template])
    assert config.engines.command[-1] == "{gpu}"
    with pytest.raises(ConfigError, match=r"is not a template .*KeyError: 'gpus'"):
        TrainConfig.load(None, ["engines.kind=sglang", 'engines.command=["{port}", "{gpus}"]'])
    with pytest.raises(ConfigError, match="must place the server's port"):
        TrainConfig.load(None, ["engines.kind=sglang", "engines.command=[sglang-wrapper]"])
    with pytest.raises(ConfigError, match=r"only for engines\.kind=serve or sglang"):
        TrainConfig.load(None, ["engines.kind=ray", 'engines.command=["{port}"]'])


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        # an importance correction the engine reference silently ignored
        (
            ["algorithm.old_logprobs=engine"],
            r"importance_correction=tis has no effect with algorithm\.old_logprobs=engine",
        ),
        (
            ["algorithm.old_logprobs=engine", "algorithm.importance_correction=mis"],
            r"importance_correction=mis has no effect with algorithm\.old_logprobs=engine",
        ),
        # stale tokens kept for a correction that is not applied
        (
            ["stream.staleness_mode=importance", "algorithm.importance_correction=none"],
            r"stream\.staleness_mode=importance .* algorithm\.importance_correction=none",
        ),
        # rejection bounds without rejection, and a band of width 0
        (
            ["algorithm.rejection_low=0.9"],
            r"algorithm\.rejection_low set with algorithm\.rejection=none",
        ),
        (
            ["algorithm.rejection_low=0.9", "algorithm.rejection_high=1.1"],
            r"rejection_low and algorithm\.rejection_high set with algorithm\.rejection=none",
        ),
        (
            [
                "algorithm.rejection=geometric",
                "algorithm.rejection_low=1",
                "algorithm.rejection_high=1",
            ],
            r"algorithm\.rejection_low and algorithm\.rejection_high are equal",
        ),
        # the geometric mean is a rejection test now, not an importance level
        (
            ["algorithm.importance_level=geometric"],
            r"algorithm\.importance_level: .*rejection=geometric",
        ),
        (["algorithm.clip_ratio_c=1"], r"algorithm\.clip_ratio_c: Input should be greater than 1"),
    ],
)
def test_combinations_that_make_no_sense_are_refused(overrides, message):
    with pytest.raises(ConfigError, match=message):
        TrainConfig.load(None, overrides)


def test_off_policy_combinations_that_make_sense_load():
    engine = TrainConfig.load(
        None, ["algorithm.old_logprobs=engine", "algorithm.importance_correction=none"]
    )
    assert engine.algorithm.importance_correction == "none"
    # stale tokens corrected by the ratio to the engine, or by TIS
    TrainConfig.load(
        None,
        [
            "stream.staleness_mode=importance",
            "algorithm.old_logprobs=engine",
            "algorithm.importance_correction=none",
        ],
    )
    TrainConfig.load(None, ["stream.staleness_mode=importance"])
    geo = TrainConfig.load(None, ["algorithm.rejection=geometric", "algorithm.rejection_high=1.01"])
    assert (geo.algorithm.rejection_low, geo.algorithm.rejection_high) == (None, 1.01)
    cispo = TrainConfig.load(None, ["algorithm.loss=cispo", "algorithm.clip_ratio_c=null"])
    assert cispo.algorithm.cispo_clip_low == 1.0 and cispo.algorithm.clip_ratio_c is None
    defaults = TrainConfig.load(None).algorithm
    assert (defaults.clip_ratio_c, defaults.importance_lower, defaults.rejection) == (
        3.0,
        0.5,
        "none",
    )


@pytest.mark.parametrize(
    ("old", "new", "value"),
    [
        ("rollout.engine_dtype", "engines.dtype", "bfloat16"),
        ("rollout.engine_batch_size", "engines.batch_size", 7),
        ("rollout.prefix_cache_tokens", "engines.prefix_cache_tokens", 0),
    ],
)
def test_a_moved_key_is_read_for_one_release_with_a_warning_naming_its_new_key(old, new, value):
    with pytest.warns(FutureWarning, match=f"{old} is deprecated .* use {new}"):
        config = TrainConfig.load(None, [f"{old}={value}"])
    section, key = new.split(".")
    assert getattr(getattr(config, section), key) == value
    with pytest.raises(ConfigError, match=f"{old} and {new} both set"):
        TrainConfig.load(None, [f"{old}={value}", f"{new}={value}"])


def test_the_example_configs_use_no_moved_key(recwarn):
    for path in sorted(EXAMPLE.parent.glob("*.yaml")):
        if "sft" not in path.stem:
            TrainConfig.load(path)
    assert not [w for w in recwarn if issubclass(w.category, FutureWarning)]


@pytest.mark.parametrize(
    ("key", "table"),
    [
        ("algorithm.advantage", "agentrl.algorithms.advantages.OUTCOME_ADVANTAGES"),
        ("algorithm.loss", "agentrl.algorithms.losses.POLICY_LOSSES"),
        ("engines.kind", "agentrl.rl.engines.SERVER_KINDS"),
    ],
)
def test_allowed_values_come_from_the_registries(key, table, monkeypatch):
    """An unknown name is refused with the registered ones; a name added to the table is taken."""
    with pytest.raises(ConfigError, match=f"{key}: .*registered"):
        TrainConfig.load(None, [f"{key}=nonesuch"])
    module, name = table.rsplit(".", 1)
    registry = getattr(importlib.import_module(module), name)
    monkeypatch.setitem(registry, "nonesuch", next(iter(registry.values())))
    config = TrainConfig.load(None, [f"{key}=nonesuch"])
    section, field = key.split(".")
    assert getattr(getattr(config, section), field) == "nonesuch"
