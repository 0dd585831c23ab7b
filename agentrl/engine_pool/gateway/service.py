"""``Gateway``: OpenAI's chat and text completions over any :class:`~agentrl.engine_pool.Engine`.

The gateway does what the rollout runner does, with the same parts: the prompt comes from a
:class:`~agentrl.tokenization.TrajectoryBuilder` over the messages and tool schemas (so the chat
template renders the tools as it does for environments), the engine is sent token ids only, the
reply is the sampled ids decoded as the runner decodes them (special tokens skipped), and tool calls
are read from that text by the parser environments use (:class:`~agentrl.tools.HermesParser`
unless another is given). Calls made in a session are recorded token-exactly
(:mod:`agentrl.engine_pool.gateway.sessions`).

Errors are :class:`~agentrl.engine_pool.gateway.protocol.GatewayError`: 404 for an unknown model,
400 for a malformed request, a template that refuses the conversation or a prompt that does not fit
the context (``code="context_length_exceeded"``), 503 when the engine cannot serve
(:class:`~agentrl.engine_pool.EngineError`). A failed call changes no session.

Sampling: ``n`` choices are ``n`` engine requests from the same prompt, run concurrently; with a
``seed``, choice ``i`` is sampled with ``seed + i``. Chat requests stop on the template's
end-of-turn ids besides the engine's own. ``max_tokens`` defaults to the room left in the context
(``context_length``, when known). A ``sampling_policy`` (the trainer's: the rollout's temperature
and token budget whatever the agent asks) rewrites each chat request's sampling fields, given the
prompt's length, before they are checked.

Tool choice. ``"auto"`` reads tool calls from whatever the model writes; ``"none"`` reads none;
``"required"`` and a named function constrain decoding (:mod:`agentrl.engine_pool.grammar`) with
the parser's structural tag (:meth:`~agentrl.tools.HermesParser.structural_tag`): the model must
open its reply with a call in the parser's own format (of the named tool, exactly once; of any tool,
once or more), so what it samples is what the template renders for the call, and the reply is
parsed as for ``"auto"``. The engine samples from, and reports the log-probs of, the constrained
distribution (as SGLang does). ``response_format`` ``json_object`` / ``json_schema`` constrain the
reply to JSON (any object / valid under the schema) the same way. An engine without constrained
decoding refuses the request (400).

Aborted generations. With ``resume_aborted=True`` a generation the engine aborts (a weight update
under ``stream.partial_rollouts="abort"``) is continued from its tokens with the rest of its token
budget, as the rollout runner does, and the caller gets one reply: its ids are the pieces' ids in
order, each token tagged with the weight version that sampled it. Without it (the default) the
reply ends with ``finish_reason`` ``"abort"``. A constrained generation (a required tool call) is
not continued: its grammar would start again at the seam; it ends with ``"abort"``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
import uuid
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from agentrl.engine_pool.engine import Engine, EngineError, GenerateResult, SamplingParams
from agentrl.engine_pool.gateway.messages import parse_reply, template_messages
from agentrl.engine_pool.gateway.protocol import (
    ChatRequest,
    CompletionRequest,
    GatewayError,
    Sampling,
    bad_request,
)
from agentrl.engine_pool.gateway.responses import Choice, finish_reason
from agentrl.engine_pool.gateway.sessions import (
    CallRecord,
    Session,
    SessionRecord,
    SessionStore,
    Start,
    fork,
)
from agentrl.engine_pool.gateway.text_segments import text_start
from agentrl.tokenization import (
    ChatFormat,
    SeamPolicy,
    TemplateError,
    TemplatePolicy,
    TemplateWarning,
    TrajectoryBuilder,
    check_template,
)
from agentrl.tools.parsers import HermesParser, ToolCallParser


@dataclasses.dataclass(frozen=True)
class Completed:
    """A finished call: the prompt's ids and the choices; ``header`` for the response body."""

    header: dict[str, Any]
    prompt_ids: list[int]
    choices: list[Choice]


class Gateway:
    """OpenAI's API over ``engine`` for the model ``model_name`` (see the module docstring).

    ``tokenizer`` gives the chat template (``chat_template`` replaces it; without either, only
    text completions are served and chat completions answer 400); ``tool_parser`` reads
    tool calls; ``template_policy`` and ``seams`` are the builder's (:class:`TemplatePolicy`,
    :class:`SeamPolicy`); ``context_length`` bounds prompt plus completion; ``max_sessions``
    bounds the open sessions; ``sampling_policy`` and ``resume_aborted``: see the module
    docstring.
    """

    def __init__(
        self,
        engine: Engine,
        tokenizer: Any,
        *,
        model_name: str,
        context_length: int | None = None,
        chat_template: str | None = None,
        tool_parser: ToolCallParser | None = None,
        template_policy: TemplatePolicy | str = TemplatePolicy.KEEP,
        seams: SeamPolicy | str = SeamPolicy.KEEP,
        max_sessions: int = 10_000,
        sampling_policy: Callable[[Sampling, int], Sampling] | None = None,
        resume_aborted: bool = False,
    ) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.context_length = context_length
        try:
            self._format: ChatFormat | None = ChatFormat.of(tokenizer, chat_template)
            self._no_chat = ""
        except TemplateError as exc:
            if chat_template is not None:
                raise
            # a tokenizer without a chat template (a base model): text completions only
            self._format, self._no_chat = None, str(exc)
        self.parser = tool_parser if tool_parser is not None else HermesParser()
        self.template_policy = TemplatePolicy(template_policy)
        self.seams = SeamPolicy(seams)
        self.sessions = SessionStore(max_sessions)
        self.sampling_policy = sampling_policy
        self.resume_aborted = resume_aborted
        self.created = int(time.time())

    def models(self) -> dict[str, Any]:
        """The ``/v1/models`` body: the one model served."""
        card = {"id": self.model_name, "object": "model", "created": self.created}
        card |= {"owned_by": "agentrl", "max_model_len": self.context_length}
        return {"object": "list", "data": [card]}

    @property
    def format(self) -> ChatFormat:
        """The chat template (400 for chat completions when the tokenizer has none)."""
        if self._format is None:
            raise bad_request(f"chat completions need a chat template: {self._no_chat}")
        return self._format

    def check_model(self, model: str) -> None:
        if model != self.model_name:
            raise GatewayError(
                404,
                f"the model {model!r} does not exist here; this gateway serves "
                f"{self.model_name!r} (GET /v1/models)",
                param="model",
                code="model_not_found",
            )

    async def close_session(self, session_id: str) -> SessionRecord:
        """Close the session (404 when it is not open) and tell the engine that it will make no
        more requests (`Engine.end_session`), so the engine may drop what it kept for it."""
        record = self.sessions.close(session_id)
        with contextlib.suppress(EngineError):  # an engine that cannot serve holds nothing
            await self.engine.end_session(session_id)
        return record

    # -- chat ------------------------------------------------------------------------------

    async def chat(self, request: ChatRequest, session_id: str | None = None) -> Completed:
        """Run one chat completion; in a session, record it (see the module docstring)."""
        self.check_model(request.model)
        # a session is made by its first call that succeeds: a failed call changes nothing
        session = self.sessions.find(session_id) if session_id is not None else None
        start = self._start(request, session)
        prompt = start.builder.prompt_ids()
        asked = request.sampling
        if self.sampling_policy is not None:
            asked = self.sampling_policy(asked, len(prompt))
        sampling = self._sampling(asked, len(prompt), self.format.end_of_turn_ids)
        if request.tool_choice == "required":
            sampling = dataclasses.replace(sampling, structural_tag=self._tool_constraint(request))
        elif request.json_schema is not None:  # response_format json_object / json_schema
            sampling = dataclasses.replace(sampling, json_schema=request.json_schema)
        results = await self._generate(prompt, sampling, asked.n, session_id)
        parser = self.parser if request.tools and request.tool_choice != "none" else None
        choices = []
        for i, result in enumerate(results):
            text = self._text(result)
            reply = parse_reply(text, parser)
            choices.append(Choice(i, result, text, reply, finish_reason(result, reply)))
        if session_id is not None:
            session = self.sessions.open(session_id)
            system = request.messages[0]["role"] == "system"  # also the segment's first
            verdict = check_template(self.format).verdict([start.use], system).value
            outcomes = [
                (
                    c.reply.normalized(),
                    CallRecord(
                        session.calls,
                        c.index,
                        start.segment is not None,
                        verdict,
                        len(prompt),
                        len(c.result.token_ids),
                        c.finish_reason,
                        len(c.reply.tool_calls),
                    ),
                    c.result,
                )
                for c in choices
            ]
            session.commit(start, request.messages, request.tools, outcomes)
        return Completed(self._header("chatcmpl"), prompt, choices)

    def _tool_constraint(self, request: ChatRequest) -> str:
        """The structural tag that makes the model call a tool (``tool_choice`` ``"required"`` or
        a named function) in the tool-call parser's own format (:meth:`HermesParser.structural_tag`)."""
        constrain = getattr(self.parser, "structural_tag", None)
        if constrain is None:
            raise bad_request(
                f"tool_choice 'required' or a named function needs a tool-call parser that can "
                f"constrain its format; {type(self.parser).__name__} cannot (HermesParser can)",
                "tool_choice",
            )
        try:
            return str(constrain(request.tools or [], request.forced_tool))
        except (ValueError, TypeError, KeyError) as exc:
            raise bad_request(
                f"the tools cannot be turned into a constraint: {exc}", "tools"
            ) from None

    def _start(self, request: ChatRequest, session: Session | None) -> Start:
        """The builder that holds this call's prompt: a fork of the segment it extends, or new."""
        use = "tools" if request.tools else "plain"
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", TemplateWarning)  # the verdict is recorded
                if session is not None:
                    found = session.extension(request.messages, request.tools)
                    if found is not None:
                        segment, new = found
                        builder = fork(segment.builder)
                        builder.add_messages(self._template(new, session))
                        return Start(builder, segment, segment.version, use if new else "no_reply")
                builder = TrajectoryBuilder(
                    self.format,
                    self._template(request.messages, session),
                    tools=request.tools,
                    policy=self.template_policy,
                    seams=self.seams,
                )
        except TemplateError as exc:
            raise bad_request(f"the chat template cannot render these messages: {exc}") from None
        return Start(builder, use=use)

    def _template(self, messages: list[dict[str, Any]], session: Session | None) -> list[Any]:
        known = session.known_reply if session is not None else (lambda message: None)
        return template_messages(messages, self.format, self.parser, known)

    # -- text completions ------------------------------------------------------------------

    async def complete(
        self, request: CompletionRequest, session_id: str | None = None
    ) -> Completed:
        """Run one text completion (a string prompt is encoded as the tokenizer does by default);
        in a session, record it (see :mod:`~agentrl.engine_pool.gateway.sessions`)."""
        self.check_model(request.model)
        session = self.sessions.find(session_id) if session_id is not None else None
        if session is not None:
            start = session.text_start(request.prompt, self.tokenizer.encode)
        else:
            start = text_start([], request.prompt, self.tokenizer.encode)
        prompt = start.prompt_ids
        asked = request.sampling
        if self.sampling_policy is not None:
            asked = self.sampling_policy(asked, len(prompt))
        sampling = self._sampling(asked, len(prompt), ())
        results = await self._generate(prompt, sampling, asked.n, session_id)
        choices = []
        for i, result in enumerate(results):
            text = self._text(result)
            choices.append(Choice(i, result, text, parse_reply(text, None), result.finish_reason))
        if session_id is not None:
            session = self.sessions.open(session_id)
            outcomes = [
                (
                    self.decode(c.result.token_ids),
                    CallRecord(
                        session.calls,
                        c.index,
                        start.segment is not None,
                        "text",
                        len(prompt),
                        len(c.result.token_ids),
                        c.finish_reason,
                        0,
                    ),
                    c.result,
                )
                for c in choices
            ]
            session.commit_text(start, request.prompt, outcomes)
        return Completed(self._header("cmpl"), prompt, choices)

    # -- shared ----------------------------------------------------------------------------

    def decode(self, ids: Sequence[int]) -> str:
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=False))

    def _text(self, result: GenerateResult) -> str:
        text = str(self.tokenizer.decode(result.token_ids, skip_special_tokens=True))
        if result.matched_stop is not None and (cut := text.find(result.matched_stop)) >= 0:
            text = text[:cut]
        return text

    def _sampling(
        self, sampling: Sampling, prompt_tokens: int, stop_ids: frozenset[int] | tuple[int, ...]
    ) -> SamplingParams:
        room = None if self.context_length is None else self.context_length - prompt_tokens
        if room is not None and (room < 1 or (sampling.max_tokens or 0) > room):
            asked = f" plus max_tokens={sampling.max_tokens}" if sampling.max_tokens else ""
            raise bad_request(
                f"the prompt has {prompt_tokens} tokens{asked}; the model's context holds "
                f"{self.context_length}",
                "messages",
                "context_length_exceeded",
            )
        try:
            return SamplingParams(
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                top_k=sampling.top_k,
                min_p=sampling.min_p,
                max_new_tokens=sampling.max_tokens or room or 256,
                stop_token_ids=tuple(sorted(stop_ids)),
                stop=sampling.stop,
                seed=sampling.seed,
            )
        except ValueError as exc:
            raise bad_request(str(exc)) from None

    async def _generate(
        self, prompt: list[int], sampling: SamplingParams, n: int, routing: str | None
    ) -> list[GenerateResult]:
        """``n`` generations from ``prompt``; one failing cancels the others."""
        seeds = [None if sampling.seed is None else (sampling.seed + i) % 2**63 for i in range(n)]
        # The error is raised after the except* clauses: before Python 3.11.4 an exception raised
        # inside one reaches the caller wrapped in an ExceptionGroup (gh-103590).
        failure: GatewayError | None = None
        try:
            async with asyncio.TaskGroup() as group:
                tasks = [
                    group.create_task(
                        self._generate_one(
                            prompt, dataclasses.replace(sampling, seed=seed), routing
                        )
                    )
                    for seed in seeds
                ]
        except* EngineError as errors:
            message = str(errors.exceptions[0])
            failure = GatewayError(
                503, f"the engine cannot serve: {message}", type="server_error", code="engine_error"
            )
        except* (ValueError, TypeError) as errors:
            failure = bad_request(f"the engine refused the request: {errors.exceptions[0]}")
        if failure is not None:
            raise failure
        return [task.result() for task in tasks]

    async def _generate_one(
        self, prompt: list[int], sampling: SamplingParams, routing: str | None
    ) -> GenerateResult:
        """One generation; with ``resume_aborted``, an aborted one continued from its tokens
        until it ends otherwise or its budget is spent (the pieces joined into one result)."""
        result = await self.engine.generate(prompt, sampling, session_id=routing)
        pieces = [result]
        budget = sampling.max_new_tokens - len(result.token_ids)
        # a constrained generation is not resumed: its grammar would restart at the seam
        resumable = self.resume_aborted and sampling.constraint is None
        while resumable and result.finish_reason == "abort" and budget > 0:
            sampling = sampling.continuation(len(pieces), budget)
            sampled = [i for piece in pieces for i in piece.token_ids]
            result = await self.engine.generate(prompt + sampled, sampling, session_id=routing)
            pieces.append(result)
            budget -= len(result.token_ids)
        if len(pieces) == 1:
            return result
        finish = "length" if result.finish_reason == "abort" else result.finish_reason
        return dataclasses.replace(
            result,
            token_ids=[i for piece in pieces for i in piece.token_ids],
            logprobs=[p for piece in pieces for p in piece.logprobs],
            token_weight_versions=[
                v
                for piece in pieces
                for v in piece.token_weight_versions
                or [piece.weight_version] * len(piece.token_ids)
            ],
            finish_reason=finish,
            prompt_tokens=len(prompt),
        )

    def _header(self, prefix: str) -> dict[str, Any]:
        return {
            "id": f"{prefix}-{uuid.uuid4().hex}",
            "created": int(time.time()),
            "model": self.model_name,
        }
