"""`agentrl sft`: the config reference, clear errors with exit code 2, and a whole tiny run."""

import json
from pathlib import Path

import pytest

from agentrl.cli import main
from agentrl.config import ConfigError
from agentrl.sft.config import SFTConfig, sft_config_reference, sft_config_reference_markdown

CONVERSATION = [
    {"role": "user", "content": "What is 6 * 7?"},
    {"role": "assistant", "content": "<python>print(6 * 7)</python>"},
    {"role": "tool", "name": "python", "content": "42\n"},
    {"role": "assistant", "content": "\\boxed{42}"},
]
RED = "\x1b[31m"


@pytest.fixture
def wide_color_console(monkeypatch):
    """Rich consoles made from now on are 200 columns wide and write ANSI colors to capsys."""
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.setenv("FORCE_COLOR", "1")
    monkeypatch.delenv("NO_COLOR", raising=False)


def write_rows(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_help_config_lists_every_key(capsys, wide_color_console):
    assert main(["sft", "--help-config"]) == 0
    printed = capsys.readouterr().out
    for key in ("data.path", "data.val_fraction", "trainer.micro_batch_tokens", "actor.lr"):
        assert key in printed, key
    undocumented = [key for key, _, description in sft_config_reference() if not description]
    assert undocumented == []


def test_the_documented_reference_is_the_config():
    page = Path(__file__).parents[2] / "docs" / "sft_config.md"
    assert page.read_text() == sft_config_reference_markdown(), (
        "docs/sft_config.md is stale: agentrl sft --help-config --markdown > docs/sft_config.md"
    )


def test_actor_overrides_keep_the_sft_learning_rate():
    config = SFTConfig.load(None, ["data.path=d.jsonl", "actor.warmup_steps=5"])
    assert config.actor.lr == SFTConfig().actor.lr == 2e-5
    assert config.actor.warmup_steps == 5


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["data.path=d.jsonl", "trainer.stepz=3"], "trainer.stepz: unknown key"),
        ([], "data.path is required"),
        (
            ["data.path=d.jsonl", "data.max_tokens=4096", "trainer.micro_batch_tokens=1024"],
            r"micro_batch_tokens \(1024\) must be at least data.max_tokens \(4096\)",
        ),
    ],
)
def test_a_bad_config_prints_a_red_error_and_exits_2(
    tmp_path, capsys, wide_color_console, overrides, message
):
    config = tmp_path / "sft.yaml"
    config.write_text("model:\n  path: smollm2\n")
    assert main(["sft", str(config), *overrides]) == 2
    printed = capsys.readouterr().out
    assert RED in printed
    with pytest.raises(ConfigError, match=message):  # the same message, from the loader
        SFTConfig.load(config, overrides)


def test_missing_config_file_and_no_config(tmp_path, capsys):
    assert main(["sft", str(tmp_path / "nope.yaml")]) == 2
    assert "does not exist" in " ".join(capsys.readouterr().out.split())
    with pytest.raises(SystemExit, match="give a config file"):
        main(["sft"])


def test_a_bad_conversation_is_named_and_exits_2(tmp_path, capsys, tiny_policy_dir):
    rows = [{"messages": CONVERSATION}, {"messages": CONVERSATION[:3]}]
    data = write_rows(tmp_path / "d.jsonl", rows)
    config = tmp_path / "sft.yaml"
    config.write_text(f"model: {{path: {tiny_policy_dir}}}\ndata: {{path: {data}}}\n")
    assert main(["sft", str(config), f"trainer.output_dir={tmp_path / 'run'}"]) == 2
    printed = " ".join(capsys.readouterr().out.split())
    assert "row 1: the conversation ends with a 'tool' message" in printed


@pytest.mark.slow
def test_a_tiny_run_prints_its_summary(tmp_path, capsys, tiny_policy_dir, wide_color_console):
    data = write_rows(tmp_path / "d.jsonl", [{"messages": CONVERSATION}] * 4)
    out = tmp_path / "run"
    config = tmp_path / "sft.yaml"
    config.write_text(
        f"model: {{path: {tiny_policy_dir}}}\ndata: {{path: {data}, max_tokens: 256}}\n"
        f"trainer: {{batch_size: 2, micro_batch_tokens: 512, output_dir: {out}}}\n"
    )
    assert main(["sft", str(config), "trainer.tensorboard=false"]) == 0
    printed = capsys.readouterr().out
    assert "SFT summary" in printed and "2 this run, 2 in all" in printed
    assert (out / "hf" / "config.json").is_file()
    assert SFTConfig.load(out / "config.yaml") == SFTConfig.load(
        config, ["trainer.tensorboard=false"]
    )
