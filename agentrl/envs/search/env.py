"""``agentrl/Search-v0``: answer a question by searching a corpus, graded by exact match.

Each turn the assistant may call the ``search`` tool (``<search>query</search>`` with
``tool_format="tags"``, as Search-R1 prompts it, or a Hermes ``<tool_call>`` with
``tool_format="hermes"``); each call comes back as a ``tool`` message with the ``topk`` passages
in Search-R1's layout (``Doc 1(Title: ...) text``), each passage cut to ``max_passage_chars`` and
the whole message to ``max_result_chars``. The episode ends at the first turn with an answer in
``<answer>...</answer>``, or at a turn with neither a call nor an answer. Multi-hop questions need
one turn per search plus one to answer: with ``max_turns`` (a wrapper keyword), leave room for them.

**Long context**: ``context_passages`` puts the question's best passages, whole, in the first
user message before the question (``max_context_chars`` bounds them); the agent may still search.

**Retriever**, the first of: ``retriever_url`` (a Search-R1-style ``/retrieve`` service, e.g.
``agentrl retriever serve``), ``index`` (a directory made by ``agentrl retriever build``, searched
in this process), ``corpus`` (a corpus file, BM25-indexed on first use into a cache), or the
shipped WordNet corpus. Questions come from ``dataset`` or the shipped WordNet question set
(``agentrl/envs/search/data/README.md``).

**Reward**: 1.0 when the answer equals a gold answer after normalisation (lower case, no
punctuation, no articles; :mod:`agentrl.envs.search.qa`), else 0.0. ``info`` of the last step has
``answer``, ``golden_answers``, ``exact_match``, ``f1``, ``searches`` (searches run in the
episode) and ``reward_components`` (``correct``, ``f1``, ``format``: 1.0 when an answer was given
in its tag). Search steps' ``info`` has ``tool_calls``, ``tool_errors`` and ``searches``.

**Bad input never ends the episode**: an empty, over-long or non-Unicode query, a malformed call,
more than ``max_searches_per_turn`` calls in a turn (one message for all the extra calls) come
back as ``Error: ...`` tool messages.
**A retriever that does not answer** (the service is down, times out or fails) is not the agent's
fault: the step sets ``info["infra_error"]`` and ends the episode (its reward means nothing).

**``protocol="search-r1"``** follows Search-R1's own code instead of the rules above
(:mod:`agentrl.envs.search.search_r1`): its prompt as one user message, the turn cut at the first
``</search>`` (the reset info asks the engine to stop at ``</search>`` and ``</answer>``), the
first tag acting, observations as ``user`` messages holding exactly Search-R1's
``\n\n<information>...</information>\n\n`` or its invalid-action text, whole passages capped in
tokens (``tokenizer``, ``max_obs_tokens``), its exact-match reward of the whole sequence with its
``format_score``. Search-R1's ``max_turns=K`` is ``max_turns=K + 1`` here: the last turn is its
final rollout, which searches nothing and is scored.
"""

from __future__ import annotations

import asyncio
from functools import cache
from pathlib import Path
from typing import Any, Literal, Self

import datasets
from pydantic import Field, model_validator

from agentrl.config import Config
from agentrl.envs.core import INFRA_ERROR, AgentEnv, ResetResult, StepResult
from agentrl.envs.search.qa import (
    SHIPPED_CORPUS,
    Question,
    exact_match,
    f1_score,
    read_questions,
)
from agentrl.envs.search.search_r1 import STOP, SearchR1Episode, make_prompt, token_cap
from agentrl.models import load_tokenizer
from agentrl.tools import HermesParser, TagParser, Tool, ToolCall, ToolCallError, ToolSet
from agentrl.tools.retrieval_corpus import CorpusFormat
from agentrl.tools.retriever import (
    INDEX_FILE,
    Index,
    LocalRetriever,
    QueryError,
    Retriever,
    RetrieverUnavailable,
    cached_index,
    check_query,
    format_passages,
    load_index,
    passage_entries,
)
from agentrl.tools.retriever_service import RetrieverClient

ANSWER_TAGS = TagParser({"answer": "answer"})
MAX_CONTEXT_PASSAGES = 1000
"""The most passages ``context_passages`` may ask for."""


class SearchConfig(Config):
    """Keyword arguments of ``gymnasium.make("agentrl/Search-v0", ...)``."""

    dataset: str | Path | datasets.Dataset | datasets.DatasetDict | None = None
    """Questions: a local file (.jsonl/.json/.parquet) or a `datasets` object with `question` and
    `golden_answers` (or `answer`) columns; None: the shipped WordNet question set."""
    columns: dict[str, str] | None = None
    """Rename source columns to `question` / `golden_answers`, e.g. {"question": "query"}."""
    split: str = "train"
    """Which questions: a DatasetDict's split when `dataset` is one; for the shipped set, "train"
    or "test", held out by answer so that no test answer is a train answer
    (`agentrl.envs.splits`); a file or a single Dataset is used whole."""
    retriever_url: str | None = None
    """A Search-R1-style /retrieve endpoint, e.g. http://127.0.0.1:8000/retrieve."""
    index: str | Path | None = None
    """An index directory made by `agentrl retriever build`, searched in this process."""
    corpus: str | Path | None = None
    """A corpus file (.jsonl/.parquet) BM25-indexed in this process on first use (cached under
    $AGENTRL_CACHE_DIR or ~/.cache/agentrl); None with no index or URL: the shipped corpus."""
    corpus_format: CorpusFormat = "auto"
    """Layout of `corpus`: search-r1 (id, contents), plain (id, title, text) or auto."""
    retriever_timeout: float = Field(30.0, gt=0)
    """Seconds to wait for the retrieval service before the step is an infrastructure error."""
    topk: int = Field(3, ge=1, le=100)
    """Passages returned per search."""
    max_passage_chars: int = Field(400, ge=20)
    """Each passage's text is cut to this many characters."""
    max_result_chars: int = Field(2000, ge=100)
    """Each search's tool message is cut to this many characters."""
    max_query_chars: int = Field(512, ge=1)
    """Longer queries are refused with an error message (not sent to the retriever)."""
    max_searches_per_turn: int = Field(3, ge=1)
    """Search calls run per turn; further calls in the same turn get an error message."""
    context_passages: int = Field(0, ge=0, le=MAX_CONTEXT_PASSAGES)
    """Long context (agentrl protocol): the first user message holds the question's best
    ``context_passages`` passages (searched with the question as the query, its first
    max_query_chars characters when longer; whole, best first, in the search results' layout)
    before the question; the agent may still search. 0: the question alone."""
    max_context_chars: int | None = Field(None, ge=1)
    """With ``context_passages``: passages are kept, best first, while the context stays within
    this many characters (a passage that would pass it ends the list); None: no limit."""
    tool_format: Literal["tags", "hermes"] = "tags"
    """How the model calls search: <search>query</search>, or Hermes <tool_call> JSON."""
    system_prompt: str | None = None
    """Replaces the built-in system prompt."""
    protocol: Literal["agentrl", "search-r1"] = "agentrl"
    """agentrl: this project's rules, in Search-R1's style but not its protocol (system prompt,
    tool messages, the last answer of a turn acting, a turn without a tag ending the episode);
    search-r1: reproduces Search-R1's own generation.py step and qa_em.py reward (prompt as one
    user message, turn cut at the first </search>, first tag acting, its invalid-action text,
    <information> framing, whole passages; agentrl/envs/search/search_r1.py). tool_format,
    system_prompt, max_passage_chars, max_result_chars and max_searches_per_turn are agentrl's."""
    tokenizer: str | None = None
    """search-r1: the model whose tokenizer caps observations at max_obs_tokens (a model
    reference as agentrl.models takes it); None: observations are not capped."""
    max_obs_tokens: int = Field(500, ge=1)
    """search-r1: an observation is cut to its first max_obs_tokens tokens (Search-R1's
    max_obs_length, 500 in its train_ppo.sh)."""
    format_score: float = 0.0
    """search-r1: the reward of an answer that is given but wrong (Search-R1's format_score)."""

    @model_validator(mode="after")
    def _one_retriever(self) -> Self:
        given = [name for name in ("retriever_url", "index", "corpus") if getattr(self, name)]
        if len(given) > 1:
            raise ValueError(f"give at most one of retriever_url, index, corpus (got {given})")
        return self

    @model_validator(mode="after")
    def _context_is_agentrls(self) -> Self:
        if self.context_passages and self.protocol == "search-r1":
            raise ValueError(
                "context_passages is agentrl's long-context start; Search-R1's protocol has none: "
                "leave it 0 with protocol='search-r1'"
            )
        return self


class SearchEnv(AgentEnv):
    """Question answering with a search tool (see the module docstring)."""

    def __init__(self, **kwargs: Any):
        self.config = config = SearchConfig.build("agentrl/Search-v0", kwargs)
        self.questions = read_questions(config.dataset, split=config.split, columns=config.columns)
        self.retriever = make_retriever(config)
        self.question: Question | None = None
        self.searches = 0
        self.episode: SearchR1Episode | None = None
        self._cap = (
            token_cap(load_tokenizer(config.tokenizer), config.max_obs_tokens)
            if config.tokenizer is not None and config.protocol == "search-r1"
            else None
        )
        self._infra_error: str | None = None

        async def search(query: str) -> str:
            """Search the encyclopedia and return the best passages.

            Args:
                query: What to look for: a name, a few keywords or a short question.
            """
            return await self._search(query)

        description = (
            f"Search the encyclopedia; returns the {config.topk} best-matching passages, "
            "each with its title. One fact per search works best."
        )
        self.tools = ToolSet([Tool.from_function(search, description=description)])
        self.parser = (
            TagParser({"search": "query"}) if config.tool_format == "tags" else HermesParser()
        )

    @property
    def num_tasks(self) -> int:
        return len(self.questions)

    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> ResetResult:
        await super().areset(seed=seed, options=options)
        index = (options or {}).get("index")
        if index is None:
            index = int(self.np_random.integers(len(self.questions)))
        if not 0 <= index < len(self.questions):
            raise IndexError(f"options['index']={index} is outside 0..{len(self.questions) - 1}")
        self.question = self.questions[index]
        self.searches = 0
        if self.config.protocol == "search-r1":
            return self._reset_search_r1(self.question)
        messages = [
            {
                "role": "system",
                "content": self.config.system_prompt or self.default_system_prompt(),
            },
            {"role": "user", "content": await self._first_message(self.question.question)},
        ]
        info = {
            "tools": self.tools.schemas(),
            "question_id": self.question.id,
            "golden_answers": list(self.question.golden_answers),
            "tags": _tags(self.question),
        }
        return messages, info

    async def _first_message(self, question: str) -> str:
        """The question, after its ``context_passages`` best passages when there are any. A
        retriever that fails here raises: the episode has not started, and the rollout runner
        reports it as the environment's error, never as a reward."""
        config = self.config
        if not config.context_passages:
            return question
        query = question[: config.max_query_chars]  # the policy's cap; the question may be longer
        hits = (await self.retriever.search([query], config.context_passages))[0]
        kept: list[str] = []
        size = -1  # the entries' newlines: one fewer than the entries
        for entry in passage_entries(hits):
            size += len(entry) + 1
            if config.max_context_chars is not None and size > config.max_context_chars:
                break
            kept.append(entry)
        if not kept:
            return question
        return "Passages:\n" + "\n".join(kept) + f"\n\nQuestion: {question}"

    async def astep(self, action: str) -> StepResult:
        if self.question is None:
            raise RuntimeError("SearchEnv.step() before reset()")
        if self.episode is not None:
            return await self.episode.step(action, final=self.final_turn)
        answer = extract_answer(action)
        if answer is None:
            parsed = self.parser.parse(action)
            if parsed.calls or parsed.errors:
                return await self._run_calls(parsed.calls, parsed.errors)
        return [], *self.grade(answer)

    def _reset_search_r1(self, question: Question) -> ResetResult:
        """Search-R1's first observation: the row's own ``prompt`` when it has one, else the
        ``base`` template around the question."""
        messages = question.metadata.get("prompt") or [
            {"role": "user", "content": make_prompt(question.question)}
        ]
        self.episode = SearchR1Episode(
            "".join(message["content"] for message in messages),
            question.golden_answers,
            retriever=self.retriever,
            topk=self.config.topk,
            max_query_chars=self.config.max_query_chars,
            cap=self._cap,
            format_score=self.config.format_score,
        )
        info = {
            "question_id": question.id,
            "golden_answers": list(question.golden_answers),
            "stop": list(STOP),
            "tags": _tags(question),
        }
        return [dict(message) for message in messages], info

    def grade(self, answer: str | None) -> tuple[float, bool, bool, dict[str, Any]]:
        """The final turn: (reward, terminated, truncated, info) for ``answer`` (None: none)."""
        assert self.question is not None
        gold = self.question.golden_answers
        correct = exact_match(answer, gold) if answer is not None else 0.0
        f1 = f1_score(answer, gold) if answer is not None else 0.0
        info = {
            "answer": answer,
            "golden_answers": list(gold),
            "exact_match": correct,
            "f1": f1,
            "searches": self.searches,
            "reward_components": {
                "correct": correct,
                "f1": f1,
                "format": float(answer is not None),
            },
        }
        return correct, True, False, info

    async def _run_calls(self, calls: list[ToolCall], errors: list[ToolCallError]) -> StepResult:
        limit = self.config.max_searches_per_turn
        extra = calls[limit:]
        refused = (
            [
                ToolCallError(
                    f"at most {limit} searches per turn; {len(extra)} more were not run", ""
                )
            ]
            if extra
            else []
        )
        self._infra_error = None
        messages = list(await asyncio.gather(*(self._answer(call) for call in calls[:limit])))
        messages += await self.tools.run([], [*errors, *refused])
        info: dict[str, Any] = {
            "tool_calls": len(calls[:limit]),
            "tool_errors": len(errors) + len(refused),
            "searches": self.searches,
        }
        if self._infra_error is not None:
            info[INFRA_ERROR] = self._infra_error
            return messages, 0.0, True, False, info
        return messages, 0.0, False, False, info

    async def _answer(self, call: ToolCall) -> dict[str, str]:
        """One call's tool message. A refused query is answered here, before the tool's argument
        validation, which cannot encode text with unpaired surrogates and says so unclearly."""
        query = call.arguments.get("query") if call.name == "search" else None
        if isinstance(query, str):
            try:
                check_query(query, self.config.max_query_chars)
            except QueryError as exc:
                return {"role": "tool", "name": call.name, "content": f"Error: {exc}"}
        [message] = await self.tools.run([call])
        return message

    async def _search(self, query: str) -> str:
        """One search call's tool message; records a retriever failure for the step's info."""
        config = self.config
        try:
            check_query(query, config.max_query_chars)
            self.searches += 1
            hits = (await self.retriever.search([query], config.topk))[0]
        except QueryError as exc:
            return f"Error: {exc}"
        except RetrieverUnavailable as exc:
            self._infra_error = f"search: {exc}"
            return "Error: the search service is unavailable."
        except Exception as exc:  # the index itself failed: not the agent's fault either
            self._infra_error = f"search: the retriever failed: {type(exc).__name__}: {exc}"
            return "Error: the search failed."
        if not hits:
            return "No passage matches the query."
        text = format_passages(hits, config.max_passage_chars)
        if len(text) > config.max_result_chars:
            cut = len(text) - config.max_result_chars
            text = f"{text[: config.max_result_chars]}\n[... {cut} more characters not shown]"
        return text

    def default_system_prompt(self) -> str:
        example = self.parser.format(ToolCall("search", {"query": "capital of France"}))
        return (
            "Answer the question. You can search an encyclopedia as often as you need: write\n"
            f"{example}\nand the best passages come back. Search for one fact at a time; when a "
            "question needs two facts, search for the first, then use what you found to search "
            "for the second. When you know the answer, write it in a few words as "
            "<answer>ANSWER</answer>, for example <answer>Paris</answer>."
        )


def extract_answer(text: str) -> str | None:
    """The content of the last non-empty ``<answer>...</answer>`` in ``text``, stripped, or None."""
    answers = [call.arguments["answer"].strip() for call in ANSWER_TAGS.parse(text).calls]
    answers = [answer for answer in answers if answer]
    return answers[-1] if answers else None


def make_retriever(config: SearchConfig) -> Retriever:
    """The retriever ``config`` names (see the module docstring for the order)."""
    if config.retriever_url:
        return RetrieverClient(config.retriever_url, timeout=config.retriever_timeout)
    if config.index is not None:
        path = Path(config.index).expanduser().resolve()
    else:
        path = cached_index(config.corpus or SHIPPED_CORPUS, corpus_format=config.corpus_format)
    meta = path / INDEX_FILE  # an index rebuilt in place is loaded again
    mtime_ns = meta.stat().st_mtime_ns if meta.is_file() else 0
    return LocalRetriever(_load_index(str(path), mtime_ns), max_query_chars=config.max_query_chars)


@cache
def _load_index(path: str, mtime_ns: int) -> Index:
    """One loaded index per directory and version, shared by the environments of a process."""
    return load_index(path)


def _tags(question: Question) -> dict[str, str]:
    """What ``agentrl eval`` reports per value: the question's source, when its row names one."""
    source = question.metadata.get("data_source")
    return {"data_source": str(source)} if source is not None else {}
