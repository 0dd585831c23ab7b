"""A chat template seen as a token-exact format: initial prompts, per-turn deltas, end-of-turn tokens.

A :class:`ChatFormat` pairs a tokenizer with one Jinja chat template (the tokenizer's own, or any
other, such as the hand-written ones in ``templates/``) and answers the three questions a
token-in/token-out trajectory needs:

* the ids of the initial prompt: ``encode(render(messages, tools, add_generation_prompt=True))``;
* the ids of new messages appended after an assistant turn (the *delta*);
* which single token ends an assistant turn (:attr:`ChatFormat.end_of_turn_ids`).

The delta rule. Let ``base`` be a fixed conversation ``[system S, user U, assistant A]`` (or
``[user U, assistant A]`` when the template moves the system prompt around, see below) and let
``cut`` be the offset just past the end-of-turn token that closes ``A`` when a user message follows
it (templates that close a message only when another follows, like plain ChatML, are covered).
Then::

    delta_text(new) = render(base + new, add_generation_prompt=True)[cut:]

after checking that this rendering starts with the base's text up to ``cut``. Everything the template
writes after the end-of-turn token (ChatML's ``\\n``) belongs to the delta, and whatever it appends
after the closing of a render (a template that writes its assistant header on every render) is
ignored. The cost does not depend on the length of the real conversation.

Time. Renders take ``now``: templates that call ``strftime_now`` see that instant (see
:mod:`agentrl.tokenization.clock`), and their bases are cached per instant. A builder passes its
episode's start, so one episode renders one date whatever the wall clock does.

Guarantees and assumptions:

* The template must close an assistant turn with an *added* token (``<|im_end|>``, ``</s>``...); the
  constructor raises :class:`TemplateError` otherwise. Tokenizers split text on added tokens before
  any merge, so text after one tokenizes the same whatever precedes it. Delta text is encoded as
  ``encode(eot + delta)[1:]`` (anchored on that token), which also keeps SentencePiece tokenizers
  from adding a prefix space: delta ids equal the ids a from-scratch encode gives that stretch.
* Not guaranteed: templates whose rendering of the new messages depends on the real conversation
  beyond the fixed base (turn counters, reasoning kept or dropped by position). The checker
  (:func:`agentrl.tokenization.check_template`) detects both and names them.
"""

from __future__ import annotations

import datetime
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, Any, ClassVar, cast

from agentrl.tokenization.clock import clock_freezes, frozen_clock

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

Message = Mapping[str, Any]

BUILTIN_TEMPLATES: dict[str, str] = {
    "system_last_user": "system prompt folded into the latest user turn (Mistral style)",
    "system_first_user": "system prompt folded into the first user turn (Llama-2 style)",
    "reasoning_stripped": "<think> dropped from assistant turns before the last user turn (Qwen3)",
    "tool_role_eom": "tool results as an `ipython` role; tool-calling turns end with <|endoftext|>",
}
"""Hand-written templates shipped in ``agentrl/tokenization/templates`` (smollm2 vocabulary)."""

SYSTEM_SENTINEL = "AGENTRL-SYSTEM"
USER_SENTINEL = "AGENTRL-USER"
ASSISTANT_SENTINEL = "AGENTRL-ASSISTANT"
_SYSTEM = {"role": "system", "content": SYSTEM_SENTINEL}
_USER = {"role": "user", "content": USER_SENTINEL}
_ASSISTANT = {"role": "assistant", "content": ASSISTANT_SENTINEL}
_FOLLOW = {"role": "user", "content": "AGENTRL-PROBE"}
# Messages appended to a candidate base to check that it stays a prefix (tool role optional).
_PROBES = ([_FOLLOW], [{"role": "tool", "content": "PROBE"}])
_PROBE_TOOLS = [
    {
        "type": "function",
        "function": {"name": "probe", "description": "probe", "parameters": {"type": "object"}},
    }
]
# Assistant contents whose closing tokens are collected as end-of-turn ids.
_PROBE_CONTENTS = (
    ASSISTANT_SENTINEL,
    '<tool_call>\n{"name": "probe", "arguments": {}}\n</tool_call>',
    "<think>\nprobe\n</think>\n\nprobe",
)


class TemplateError(ValueError):
    """The chat template cannot give token-exact deltas (or renders inconsistently)."""


def builtin_template(name: str) -> str:
    """The source of a template shipped in ``templates/`` (a key of :data:`BUILTIN_TEMPLATES`)."""
    if name not in BUILTIN_TEMPLATES:
        raise KeyError(
            f"unknown template {name!r}; built-in templates: {sorted(BUILTIN_TEMPLATES)}"
        )
    return (resources.files(__package__) / "templates" / f"{name}.jinja").read_text("utf-8")


@dataclass(frozen=True)
class _Base:
    """The fixed conversation deltas are rendered after, and its text up to the end-of-turn."""

    messages: tuple[Message, ...]
    prefix: str  # text up to and including the end-of-turn token of the assistant, when followed


_CLOCK_CALL = re.compile(r"""strftime_now\(\s*(["'])(.*?)\1""")


class ChatFormat:
    """A tokenizer plus a chat template, with the delta rule of this module.

    ``chat_template=None`` uses the tokenizer's template. ``end_of_turn_ids=None`` detects them:
    the added tokens that close assistant turns with plain, tool-calling and reasoning content,
    plus the tokenizer's eos. These are the ids an engine should stop on. Use :meth:`of` to share
    one instance per (tokenizer, template); instances cache per tool list (and, for templates
    that read the clock, per instant) and are not thread-safe.
    """

    # (id(tokenizer), template) -> format; a format holds its tokenizer, so ids are never reused.
    _shared: ClassVar[dict[tuple[int, str | None], ChatFormat]] = {}

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        chat_template: str | None = None,
        end_of_turn_ids: Iterable[int] | None = None,
    ):
        template = chat_template if chat_template is not None else tokenizer.chat_template
        if not isinstance(template, str) or not template:
            raise TemplateError("the tokenizer has no chat template; pass chat_template=")
        self.tokenizer = tokenizer
        self.template = template
        self.clock_formats: tuple[str, ...] = tuple(
            dict.fromkeys(m.group(2) for m in _CLOCK_CALL.finditer(template))
        )
        """The ``strftime_now`` formats the template calls (empty: it does not read the clock)."""
        self.reads_clock = "strftime_now" in template
        if self.reads_clock and not clock_freezes():
            raise TemplateError(
                "the template reads the clock (strftime_now) and this transformers version does "
                "not let agentrl freeze it per episode; renders would change at midnight"
            )
        self._added = dict(tokenizer.added_tokens_encoder)  # token text -> id
        self._bases: dict[tuple[str, datetime.datetime | None], _Base] = {}
        self._accepted: dict[str, None] = {}  # role skeletons the template renders
        now = datetime.datetime.now()
        try:
            tools: list[dict] | None = None
            base = self._base(tools, now)
        except TemplateError:  # a template that renders only with tools (Hermes 3 tool_use)
            tools = _PROBE_TOOLS
            base = self._base(tools, now)
        self.closing = base.prefix[
            base.prefix.rindex(ASSISTANT_SENTINEL) + len(ASSISTANT_SENTINEL) :
        ]
        self._end_of_turn_text = self._last_added_token(self.closing)
        self.end_of_turn_id = self._added[self._end_of_turn_text]
        if end_of_turn_ids is None:
            detected = {
                self._added[self._last_added_token(self.closing_text(c, tools, now=now))]
                for c in _PROBE_CONTENTS
            }
            if tokenizer.eos_token_id is not None:
                detected.add(tokenizer.eos_token_id)
            end_of_turn_ids = detected
        self.end_of_turn_ids = frozenset(end_of_turn_ids)
        self.added_ids = frozenset(self._added.values())
        """Ids of the added tokens: text never merges across one."""

    @classmethod
    def of(cls, tokenizer: PreTrainedTokenizerBase, chat_template: str | None = None) -> ChatFormat:
        """The shared instance for this tokenizer object and template, built on first use and kept
        (with the tokenizer) for the life of the process, like :func:`agentrl.models.load_tokenizer`."""
        key = (id(tokenizer), chat_template)
        if key not in cls._shared:
            cls._shared[key] = cls(tokenizer, chat_template)
        return cls._shared[key]

    # -- rendering and encoding ------------------------------------------------------------------

    def render(
        self,
        messages: Sequence[Message],
        tools: Sequence[Mapping[str, Any]] | None = None,
        *,
        add_generation_prompt: bool = False,
        now: datetime.datetime | None = None,
    ) -> str:
        """The template's text for ``messages`` (``tokenizer.apply_chat_template``, untokenized);
        ``strftime_now`` sees ``now`` (``None``: the wall clock)."""
        with frozen_clock(now):
            text = self.tokenizer.apply_chat_template(
                [dict(m) for m in messages],
                tools=[dict(t) for t in tools] if tools else None,
                chat_template=self.template,
                add_generation_prompt=add_generation_prompt,
                tokenize=False,
            )
        return cast(str, text)  # one conversation, tokenize=False

    def encode(self, text: str) -> list[int]:
        """Ids of ``text`` as at the start of a sequence (no special tokens added)."""
        return self.tokenizer.encode(text, add_special_tokens=False)

    def encode_after_turn(self, text: str) -> list[int]:
        """Ids of ``text`` as it tokenizes right after an end-of-turn token (see module doc)."""
        ids = self.encode(self._end_of_turn_text + text)
        if ids[:1] != [self.end_of_turn_id]:
            raise TemplateError(f"{self._end_of_turn_text!r} does not encode to its own id")
        return ids[1:]

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids``, special tokens included, without clean-up of spaces."""
        text = self.tokenizer.decode(
            list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False
        )
        return cast(str, text)

    # -- the three things a trajectory needs -----------------------------------------------------

    def prompt_ids(
        self,
        messages: Sequence[Message],
        tools: Sequence[Mapping[str, Any]] | None = None,
        *,
        now: datetime.datetime | None = None,
    ) -> list[int]:
        """Ids of the initial prompt: the template on ``messages`` plus the generation prompt.
        Raises :class:`TemplateError` when the template refuses the messages' roles."""
        self.check_roles(messages, tools, now=now)
        return self.encode(self.render(messages, tools, add_generation_prompt=True, now=now))

    def delta_text(
        self,
        messages: Sequence[Message],
        tools: Sequence[Mapping[str, Any]] | None = None,
        *,
        now: datetime.datetime | None = None,
    ) -> str:
        """Text the template adds after an assistant's end-of-turn token for ``messages`` (possibly
        none) and the next generation prompt. Raises :class:`TemplateError` when adding them
        changes the rendering of the base conversation."""
        now = self._instant(now)
        base = self._base(tools, now)
        text = self.render([*base.messages, *messages], tools, add_generation_prompt=True, now=now)
        messages_text = "".join(str(m.get("content")) for m in messages)
        delta = text[len(base.prefix) :]
        if not text.startswith(base.prefix) or any(
            m["content"] in delta for m in base.messages if m["content"] not in messages_text
        ):
            raise TemplateError(
                "adding these messages re-renders earlier turns, so no delta exists: "
                f"{[m.get('role') for m in messages]}; run `agentrl check-template`"
            )
        return delta

    def delta_ids(
        self,
        messages: Sequence[Message],
        tools: Sequence[Mapping[str, Any]] | None = None,
        *,
        now: datetime.datetime | None = None,
    ) -> list[int]:
        """Ids of :meth:`delta_text`, tokenized as right after an end-of-turn token."""
        return self.encode_after_turn(self.delta_text(messages, tools, now=now))

    def closing_text(
        self,
        content: str,
        tools: Sequence[Mapping[str, Any]] | None = None,
        *,
        now: datetime.datetime | None = None,
    ) -> str:
        """What the template writes after assistant ``content`` (followed by a user message), up
        to and including the first added token. Falls back to the base's closing when the
        template rewrites ``content``."""
        now = self._instant(now)
        lead = list(self._base(tools, now).messages[:-1])
        prompt = self.render(lead, tools, add_generation_prompt=True, now=now)
        turn = {"role": "assistant", "content": content}
        text = self.render([*lead, turn, _FOLLOW], tools, add_generation_prompt=True, now=now)
        if text.startswith(prompt + content):
            start = len(prompt) + len(content)
        elif content and (found := text.rfind(content)) >= 0:
            start = found + len(content)
        else:
            return self.closing
        end = self._first_added_token_end(text, start)
        return self.closing if end is None else text[start:end]

    def closing_ids(
        self,
        content: str,
        tools: Sequence[Mapping[str, Any]] | None = None,
        *,
        now: datetime.datetime | None = None,
    ) -> list[int]:
        """Ids of :meth:`closing_text` (encoded on their own; they follow engine tokens)."""
        return self.encode(self.closing_text(content, tools, now=now))

    def check_roles(
        self,
        messages: Sequence[Message],
        tools: Sequence[Mapping[str, Any]] | None = None,
        *,
        now: datetime.datetime | None = None,
    ) -> None:
        """Raise :class:`TemplateError` if the template refuses to render a conversation with
        these messages' roles and keys (``raise_exception`` for alternating roles, a missing tool
        role...). Renders a skeleton (contents replaced) and remembers skeletons that passed, so
        the cost does not grow with the conversation's text."""
        skeleton = [{**m, "content": "x"} for m in messages]
        key = json.dumps([skeleton, tools or None], sort_keys=True, default=str)
        if key in self._accepted:
            return
        try:
            self.render(skeleton, tools, now=self._instant(now))
        except Exception as error:
            roles = [m.get("role") for m in messages]
            raise TemplateError(
                f"the chat template refuses a conversation with roles {roles}: "
                f"{type(error).__name__}: {error}"
            ) from error
        if len(self._accepted) >= 4096:
            self._accepted.clear()
        self._accepted[key] = None

    # -- internals -------------------------------------------------------------------------------

    def _instant(self, now: datetime.datetime | None) -> datetime.datetime | None:
        """The instant a group of renders shares: ``now``, or the wall clock read once."""
        if now is None and self.reads_clock:
            return datetime.datetime.now()
        return now

    def _base(
        self, tools: Sequence[Mapping[str, Any]] | None, now: datetime.datetime | None
    ) -> _Base:
        key = (
            json.dumps(tools, sort_keys=True, default=str) if tools else "",
            self._instant(now) if self.reads_clock else None,
        )
        if key not in self._bases:
            if len(self._bases) >= 64:
                self._bases.clear()
            self._bases[key] = self._choose_base(tools, key[1])
        return self._bases[key]

    def _choose_base(
        self, tools: Sequence[Mapping[str, Any]] | None, now: datetime.datetime | None
    ) -> _Base:
        """The first candidate base that later messages only append to (probed with a user and a
        tool message; a template that rejects the tool role skips that probe)."""
        refused: Exception | None = None
        for lead in ([_SYSTEM, _USER], [_USER]):
            messages = (*lead, _ASSISTANT)
            try:
                text = self.render([*messages, _FOLLOW], tools, add_generation_prompt=True, now=now)
            except Exception as error:  # e.g. a template without a system role
                refused = error
                continue
            start = text.find(ASSISTANT_SENTINEL)
            end = None if start < 0 else self._first_added_token_end(text, start)
            if end is None:
                raise TemplateError(
                    "the template does not close assistant turns with an added token; "
                    "token-exact deltas need one (e.g. <|im_end|>, </s>, <|eot_id|>)"
                )
            prefix = text[:end]
            # every base message must be written before the cut: one written later (a system
            # prompt moved into the last user turn) would leak into every delta
            kept = all(m["content"] in prefix for m in lead)
            if kept and all(
                self._appends(messages, probe, tools, prefix, now) for probe in _PROBES
            ):
                return _Base(messages, prefix)
        if refused is not None:
            raise TemplateError(
                f"the template refuses the base conversation: {type(refused).__name__}: {refused}"
            )
        raise TemplateError("every base conversation is re-rendered when messages are added")

    def _appends(
        self,
        base: Sequence[Message],
        probe: list[dict],
        tools: Any,
        prefix: str,
        now: datetime.datetime | None,
    ) -> bool:
        try:
            text = self.render([*base, *probe], tools, add_generation_prompt=True, now=now)
        except Exception:  # raise_exception(...): a template without a tool role
            return probe[0]["role"] == "tool"
        return text.startswith(prefix)

    def _first_added_token_end(self, text: str, start: int) -> int | None:
        hits = [(i, len(t)) for t in self._added if (i := text.find(t, start)) >= 0]
        if not hits:
            return None
        index, length = min(hits, key=lambda hit: (hit[0], -hit[1]))
        return index + length

    def _last_added_token(self, closing: str) -> str:
        for token in sorted(self._added, key=len, reverse=True):
            if closing.endswith(token):
                return token
        raise TemplateError(f"closing text {closing!r} does not end with an added token")
