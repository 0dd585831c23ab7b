"""The ``agentrl`` command. Each subcommand lives beside its component as a module with
``add_arguments(parser)`` and ``run(args) -> int`` that keeps heavy imports inside ``run``. Only
the module of the subcommand given is imported (``agentrl env serve`` does not wait for the
trainer's imports); ``agentrl --help`` lists them all from :data:`SUBCOMMANDS` alone."""

from __future__ import annotations

import argparse
import importlib
import sys

SUBCOMMANDS = {
    "train": ("agentrl.rl.cli", "train a policy with RL from a YAML config"),
    "sft": ("agentrl.sft.cli", "supervised fine-tuning on multi-turn conversations (warm start)"),
    "demos": ("agentrl.sft.demos_cli", "write verified tool-use demonstrations for agentrl sft"),
    "rollout": ("agentrl.rollout.cli", "run an environment against the embedded engine"),
    "eval": ("agentrl.evaluation.cli", "evaluate a policy on every task: pass@k, per environment"),
    "serve": (
        "agentrl.engine_pool.cli",
        "serve the embedded engine over SGLang's and OpenAI's APIs",
    ),
    "gateway": (
        "agentrl.engine_pool.gateway.cli",
        "an OpenAI-compatible endpoint in front of engine servers; records sessions",
    ),
    "check-template": ("agentrl.tokenization.cli", "check whether a chat template is append-only"),
    "extend-context": (
        "agentrl.context_extension",
        "copy a model with its rotary embedding scaled to a longer context",
    ),
    "swe": ("agentrl.envs.swe.taskgen.cli", "generate verified SWE-bench instances from sdists"),
    "retriever": ("agentrl.tools.retriever_cli", "build a retrieval index or serve one over HTTP"),
    "env": ("agentrl.env_server.cli", "serve an environment in OpenEnv's protocol (env serve)"),
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser, with the arguments of ``command`` (every subcommand's when None)."""
    parser = argparse.ArgumentParser(prog="agentrl", description="RL for multi-turn LLM agents.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        sub = commands.add_parser(name, help=help_text, description=help_text)
        if command is None or name == command:
            module = importlib.import_module(module_name)
            module.add_arguments(sub)
            sub.set_defaults(run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # The subcommand is the first word that is not an option (the top level has only --help).
    command = next((word for word in argv if not word.startswith("-")), "")
    args = build_parser(command if command in SUBCOMMANDS else "").parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    raise SystemExit(main())
