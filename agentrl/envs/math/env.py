"""``agentrl/Math-v0``: answer a math problem, optionally using a Python tool, graded by math-verify.

Modes (``mode=``):

- ``"single"``: one assistant turn; its final answer is graded and the episode ends.
- ``"multi"``: the assistant may call the ``python`` tool (``<python>code</python>`` with
  ``tool_format="tags"``, or Hermes ``<tool_call>`` JSON with ``tool_format="hermes"``); each call's
  output comes back as a ``tool`` message. The episode ends at the first turn with a final answer, or
  at a turn with neither a tool call nor an answer. Malformed calls come back as error messages.
  The code runs in the episode's sandbox (``sandbox=``: ``"bwrap"`` by default, or ``"container"``;
  see :mod:`agentrl.tools.sandbox`), started at the first call, with one persistent interpreter
  per episode, and destroyed when the episode ends. ``sandbox="subprocess"`` runs each call in a
  fresh, unisolated Python process instead (:mod:`agentrl.tools.python`).

The final answer is the content of ``<answer>...</answer>`` or of the last ``\\boxed{...}``
(``answer_format`` picks which are accepted). ``answer_format="flexible"`` also falls back to the last
number in the text, as lm-eval's GSM8K "flexible-extract" does, for models too small to follow the
format; such an answer is graded but scores 0 on the ``format`` component. Reward is 1.0 when math-verify judges it equal to the
gold answer, else 0.0; ``info["reward_components"]`` has ``correct`` and ``format`` (1.0 when a final
answer was given in an accepted format) for shaping wrappers.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from typing import Any, Literal, cast

from pydantic import Field, field_validator

from agentrl.config import Config
from agentrl.envs.core import INFRA_ERROR, AgentEnv, ResetResult, StepResult
from agentrl.envs.math.dataset import Format, MathProblem, last_boxed, read_dataset, to_problems
from agentrl.envs.math.generated import generate_problems
from agentrl.envs.math.verifier import shared_pool
from agentrl.envs.splits import SPLITS, Split
from agentrl.tools import (
    EpisodeSandbox,
    HermesParser,
    SandboxLimits,
    SandboxPool,
    TagParser,
    ToolCall,
    ToolSet,
    python_tool,
    sandbox_factory,
)
from agentrl.tools.container import DEFAULT_IMAGE
from agentrl.tools.sandbox_tools import sandbox_tools

ANSWER_TAGS = TagParser({"answer": "answer"})
NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


class MathConfig(Config):
    """Keyword arguments of ``gymnasium.make("agentrl/Math-v0", ...)``."""

    dataset: str | Path | Any = None
    """Local file (.jsonl/.json/.parquet/.csv) or a `datasets` object; None uses the generated set."""
    dataset_format: Format = "auto"
    """How rows map to problems: gsm8k, math, plain (with `columns`), or auto-detect."""
    columns: dict[str, str] | None = None
    """Rename source columns to `question` and `answer`, e.g. {"question": "prompt", "answer": "target"}."""
    split: str = "train"
    """Which tasks: a DatasetDict's split when `dataset` is one; for the generated set, "train"
    or "test", disjoint held-out splits by question text (`agentrl.envs.splits`); ignored for a
    file or a single Dataset, which is used whole."""
    generated_count: int = Field(1000, ge=1)
    """Size of the built-in generated set."""
    generated_seed: int = 0
    """Seed of the built-in generated set."""
    generated_difficulty: Literal[1, 2, 3] = 1
    """Difficulty of the built-in generated set: operations per problem."""
    mode: Literal["single", "multi"] = "single"
    """single: one graded turn; multi: the python tool is available across turns."""
    tool_format: Literal["tags", "hermes"] = "tags"
    """How the model calls the python tool in multi mode."""
    answer_format: Literal["boxed", "answer_tag", "either", "flexible"] = "either"
    """Final-answer formats that count: \\boxed{...}, <answer>...</answer>, either, or flexible
    (either, else the last number in the text, which scores 0 on the format component)."""
    system_prompt: str | None = None
    """Replaces the built-in system prompt."""
    sandbox: Literal["bwrap", "container", "subprocess"] = "bwrap"
    """Where the python tool runs: a bubblewrap or container sandbox (persistent interpreter per
    episode), or an unisolated fresh process per call (subprocess)."""
    sandbox_image: str = DEFAULT_IMAGE
    """Image of the container sandbox."""
    sandbox_limits: SandboxLimits = SandboxLimits(memory_mb=512, pids=64, cpus=1.0)
    """Memory, process, CPU and disk limits of the sandbox."""
    sandbox_pool: SandboxPool | None = None
    """Take sandboxes from this pool (shared by many environments) instead of starting one per episode."""
    python_timeout: float = Field(10.0, gt=0)
    """Wall-clock limit of one python tool call, in seconds."""
    python_max_output_bytes: int = Field(16_384, ge=256)
    """Cap on each of stdout and stderr of a python tool call."""
    verify_timeout: int = Field(5, ge=1)
    """Limit, in seconds, on each of math-verify's parse and compare calls."""

    @field_validator("dataset")
    @classmethod
    def _dataset(cls, value: Any) -> Any:
        """A path, a ``datasets.Dataset`` or ``DatasetDict``, or None. ``datasets`` (about 80 MB
        resident with pyarrow) is imported only when something else is given, so the generated set
        and files do not load it into a training process until a file is read."""
        if value is None or isinstance(value, (str, Path)):
            return value
        import datasets

        if not isinstance(value, (datasets.Dataset, datasets.DatasetDict)):
            raise ValueError(
                "dataset must be a file path or a datasets.Dataset / DatasetDict, "
                f"got {type(value).__name__}"
            )
        return value


class MathEnv(AgentEnv):
    """Math problems graded by math-verify (see the module docstring)."""

    def __init__(self, **kwargs: Any):
        self.config = MathConfig.build("agentrl/Math-v0", kwargs)
        self.problems = load_problems(self.config)
        self.problem: MathProblem | None = None
        multi = self.config.mode == "multi"
        config = self.config
        self.sandbox: EpisodeSandbox | None = None
        tools = []
        if multi and config.sandbox == "subprocess":
            tools = [
                python_tool(
                    timeout=config.python_timeout, max_output_bytes=config.python_max_output_bytes
                )
            ]
        elif multi:
            factory = sandbox_factory(
                config.sandbox, config.sandbox_limits, image=config.sandbox_image
            )
            self.sandbox = EpisodeSandbox(factory, config.sandbox_pool)
            tools = sandbox_tools(
                self.sandbox.get,
                timeout=config.python_timeout,
                max_output_bytes=config.python_max_output_bytes,
                names=("python",),
            )
        self.tools = ToolSet(tools)
        self.parser = (
            (TagParser({"python": "code"}) if self.config.tool_format == "tags" else HermesParser())
            if multi
            else None
        )

    @property
    def num_tasks(self) -> int:
        return len(self.problems)

    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> ResetResult:
        await super().areset(seed=seed, options=options)
        if self.sandbox is not None:
            await self.sandbox.release()
        index = (options or {}).get("index")
        if index is None:
            index = int(self.np_random.integers(len(self.problems)))
        if not 0 <= index < len(self.problems):
            raise IndexError(f"options['index']={index} is outside 0..{len(self.problems) - 1}")
        self.problem = self.problems[index]
        messages = [
            {
                "role": "system",
                "content": self.config.system_prompt or self.default_system_prompt(),
            },
            {"role": "user", "content": self.problem.question},
        ]
        info = {
            "tools": self.tools.schemas(),
            "problem_id": self.problem.id,
            "gold_answer": self.problem.answer,
        }
        return messages, info

    async def astep(self, action: str) -> StepResult:
        if self.problem is None:
            raise RuntimeError("MathEnv.step() before reset()")
        answer = extract_answer(action, self.config.answer_format)
        if answer is None and self.parser is not None:
            parsed = self.parser.parse(action)
            if parsed.calls or parsed.errors:
                messages = await self.tools.run(parsed.calls, parsed.errors)
                info = {"tool_calls": len(parsed.calls), "tool_errors": len(parsed.errors)}
                return messages, 0.0, False, False, info
        if self.sandbox is not None:
            await self.sandbox.release()
        return [], *(await self.grade(action, answer))

    async def aclose(self) -> None:
        if self.sandbox is not None:
            await self.sandbox.release()

    async def grade(
        self, action: str, answer: str | None
    ) -> tuple[float, bool, bool, dict[str, Any]]:
        """The final turn: (reward, terminated, truncated, info) for ``answer`` (None: not found)."""
        assert self.problem is not None
        formatted = answer is not None
        if answer is None and self.config.answer_format == "flexible":
            answer = last_number(action)
        info: dict[str, Any] = {"answer": answer, "gold_answer": self.problem.answer}
        correct = 0.0
        if answer is not None:
            verdict = await shared_pool.verify(
                self.problem.answer, answer, self.config.verify_timeout
            )
            correct = float(verdict.correct)
            if verdict.error:  # the verifier failed, not the answer: not a reward
                info["verifier_error"] = info[INFRA_ERROR] = verdict.error
        info["reward_components"] = {"correct": correct, "format": float(formatted)}
        return correct, True, False, info

    def default_system_prompt(self) -> str:
        answer = (
            "<answer>ANSWER</answer>"
            if self.config.answer_format == "answer_tag"
            else "\\boxed{ANSWER}"
        )
        prompt = (
            f"Solve the math problem. Think step by step, then give the final answer as {answer}."
        )
        if self.parser is None:
            return prompt
        example = self.parser.format(ToolCall("python", {"code": "print(12 * 7)"}, raw=""))
        return (
            f"{prompt}\nYou can run Python code to help you. To run code, write:\n{example}\n"
            "The output will be returned to you. Give the final answer only when you are sure."
        )


def last_number(text: str) -> str | None:
    """The last number in ``text`` (thousands separators dropped), or None."""
    numbers = NUMBER.findall(text)
    return numbers[-1].replace(",", "") if numbers else None


def extract_answer(text: str, answer_format: str) -> str | None:
    """The final answer in ``text``: ``<answer>`` content or the last ``\\boxed{}``, per format
    (``flexible`` accepts both here; its last-number fallback is :func:`last_number`)."""
    if answer_format in ("answer_tag", "either", "flexible"):
        tagged = [call.arguments["answer"] for call in ANSWER_TAGS.parse(text).calls]
        if tagged and tagged[-1].strip():
            return tagged[-1].strip()
    if answer_format in ("boxed", "either", "flexible"):
        boxed = last_boxed(text)
        if boxed is not None and boxed.strip():
            return boxed.strip()
    return None


def load_problems(config: MathConfig) -> list[MathProblem]:
    if config.dataset is None:
        if config.split not in SPLITS:
            raise ValueError(
                f"agentrl/Math-v0: the generated set has the splits {SPLITS}, not {config.split!r}"
            )
        return _generated(
            config.generated_count,
            config.generated_seed,
            config.generated_difficulty,
            cast(Split, config.split),
        )
    if isinstance(config.dataset, (str, Path)):
        path = Path(config.dataset).expanduser().resolve()
        if not path.is_file():
            raise FileNotFoundError(f"agentrl/Math-v0: dataset file not found: {path}")
        columns = tuple(sorted((config.columns or {}).items()))
        return _from_file(
            str(path), path.stat().st_mtime_ns, config.dataset_format, columns, config.split
        )
    return to_problems(
        read_dataset(config.dataset, config.split), config.dataset_format, config.columns
    )


@cache
def _generated(count: int, seed: int, difficulty: int, split: Split) -> list[MathProblem]:
    return generate_problems(count, seed, difficulty, split)


@cache
def _from_file(
    path: str, mtime_ns: int, format: Format, columns: tuple[tuple[str, str], ...], split: str
) -> list[MathProblem]:
    return to_problems(read_dataset(path, split), format, dict(columns) or None)
