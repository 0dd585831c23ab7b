"""Search-R1's protocol for ``agentrl/Search-v0`` (``protocol="search-r1"``), rule for rule.

The rules are read from Search-R1's own code (github.com/PeterGriffinJin/Search-R1):

- **Prompt** (``scripts/data_process/nq_search.py``, ``make_prefix``, template ``base``): one
  ``user`` message, the instruction followed by ``Question: {question}\\n``; the question is
  stripped and gets a ``?`` when it does not end with one (``process_fn``). A row of Search-R1's
  parquet files brings its own ``prompt`` (that text), which is used as it is.
- **The turn** (``search_r1/llm_agent/generation.py``, ``_postprocess_responses``): the response
  is cut after the first ``</search>``, else after the first ``</answer>``; the action is the
  first ``<(search|answer)>(.*?)</\\1>`` of the cut text, its content stripped
  (``postprocess_predictions``).
- **The step** (``execute_predictions``): ``answer`` ends the episode; ``search`` answers
  ``\\n\\n<information>{passages.strip()}</information>\\n\\n``; anything else answers
  :data:`INVALID_ACTION` and the episode goes on.
- **Passages** (``_passages2string``): ``Doc {i}(Title: {title}) {text}\\n`` per document, where
  ``title`` is the first line of the document's ``contents`` and ``text`` the rest, whole: the
  corpus decides the quotes (wiki-18 writes ``"Title"``, so Search-R1 shows ``Title: "Title"``).
- **Token cap** (``_process_next_obs``): an observation longer than ``max_obs_length`` tokens is
  cut to its first ``max_obs_length`` tokens (500 in ``train_ppo.sh``).
- **Reward** (``verl/utils/reward_score/qa_em.py``, ``compute_score_em``, called by
  ``verl/trainer/main_ppo.py``'s ``RewardManager`` on the decoded prompt and response): the
  answer is the last ``<answer>(.*?)</answer>`` of the whole sequence, and only when there are at
  least two (the prompt's example ``<answer> Beijing </answer>`` is the first); exact match after
  normalisation scores ``score`` (1), a wrong answer ``format_score`` (0 by default), none 0.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any, Literal

from agentrl.envs.core import INFRA_ERROR, StepResult
from agentrl.envs.search.qa import normalize_answer
from agentrl.tools.retriever import Hit, QueryError, Retriever, RetrieverUnavailable, check_query

PROMPT = (
    "Answer the given question. "
    "You must conduct reasoning inside <think> and </think> first every time you get new "
    "information. "
    "After reasoning, if you find you lack some knowledge, you can call a search engine by "
    "<search> query </search> and it will return the top searched results between "
    "<information> and </information>. "
    "You can search as many times as your want. "
    "If you find no further external knowledge needed, you can directly provide the answer "
    "inside <answer> and </answer>, without detailed illustrations. For example, "
    "<answer> Beijing </answer>. Question: {question}\n"
)
"""``make_prefix(dp, template_type="base")`` of ``nq_search.py``, with ``{question}`` to fill."""

INVALID_ACTION = (
    "\nMy previous action is invalid. "
    "If I want to search, I should put the query between <search> and </search>. "
    "If I want to give the final answer, I should put the answer between <answer> and </answer>. "
    "Let me try again.\n"
)
"""``execute_predictions``' observation for a turn with neither a search nor an answer."""

STOP = ["</search>", "</answer>"]
"""Where a turn ends: the engine stops there (the reset info's ``stop``)."""

_ACTION = re.compile(r"<(search|answer)>(.*?)</\1>", re.DOTALL)
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)

Action = Literal["search", "answer"]


def make_prompt(question: str) -> str:
    """The user message for ``question`` (``process_fn`` then ``make_prefix``)."""
    question = question.strip()
    if not question:
        raise ValueError("the question is empty")
    if not question.endswith("?"):
        question += "?"
    return PROMPT.format(question=question)


def cut_response(response: str) -> str:
    """The response as Search-R1 keeps it: up to the first ``</search>``, else up to the first
    ``</answer>``, else whole (``_postprocess_responses``)."""
    for end in STOP:
        if end in response:
            return response.split(end)[0] + end
    return response


def parse_action(response: str) -> tuple[Action | None, str]:
    """``(action, content)`` of the first tag pair of the cut response; ``(None, "")`` when there
    is none (``postprocess_predictions``)."""
    match = _ACTION.search(cut_response(response))
    if match is None:
        return None, ""
    action: Action = "search" if match.group(1) == "search" else "answer"
    return action, match.group(2).strip()


def passages_to_string(hits: Sequence[Hit]) -> str:
    """The hits as ``_passages2string`` writes them, from each document's ``contents``."""
    lines = []
    for number, hit in enumerate(hits, start=1):
        title, _, text = hit.document["contents"].partition("\n")
        lines.append(f"Doc {number}(Title: {title}) {text}\n")
    return "".join(lines)


def information(passages: str) -> str:
    """A search's observation: the passages in ``<information>`` tags, as Search-R1 frames them."""
    return f"\n\n<information>{passages.strip()}</information>\n\n"


def extract_solution(sequence: str) -> str | None:
    """The last ``<answer>`` of the whole sequence (prompt included), stripped, or None when the
    sequence has fewer than two (``qa_em.extract_solution``)."""
    matches = list(_ANSWER.finditer(sequence))
    if len(matches) <= 1:
        return None
    return matches[-1].group(1).strip()


def em_check(prediction: str, golden_answers: str | Sequence[str]) -> bool:
    """Whether the normalised prediction equals a normalised gold answer (``qa_em.em_check``)."""
    if isinstance(golden_answers, str):
        golden_answers = [golden_answers]
    normalized = normalize_answer(prediction)
    return any(normalize_answer(gold) == normalized for gold in golden_answers)


def compute_score_em(
    sequence: str,
    golden_answers: str | Sequence[str],
    *,
    format_score: float = 0.0,
    score: float = 1.0,
) -> float:
    """Search-R1's reward of a whole sequence (``qa_em.compute_score_em``)."""
    answer = extract_solution(sequence)
    if answer is None:
        return 0.0
    return score if em_check(answer, golden_answers) else format_score


def token_cap(tokenizer: Any, max_tokens: int) -> Callable[[str], str]:
    """Search-R1's observation cap: the text of the first ``max_tokens`` tokens of ``tokenizer``
    (a ``transformers`` tokenizer, no special tokens added) when the observation has more."""

    def cap(text: str) -> str:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        return text if len(ids) <= max_tokens else str(tokenizer.decode(ids[:max_tokens]))

    return cap


class SearchR1Episode:
    """One episode under Search-R1's rules: the text of the whole sequence so far (what its
    reward reads) and the step (``execute_predictions``), with ``final`` its last rollout."""

    def __init__(
        self,
        prompt: str,
        golden_answers: Sequence[str],
        *,
        retriever: Retriever,
        topk: int,
        max_query_chars: int,
        cap: Callable[[str], str] | None = None,
        format_score: float = 0.0,
    ) -> None:
        self.sequence = prompt
        self.golden_answers = list(golden_answers)
        self.retriever = retriever
        self.topk = topk
        self.max_query_chars = max_query_chars
        self.cap = cap
        self.format_score = format_score
        self.searches = 0
        self.invalid_turns = 0

    async def step(self, response: str, *, final: bool = False) -> StepResult:
        """One turn. ``final``: the rollout after the last search turn (``run_llm_loop``'s
        ``do_search=False``): nothing is searched and the sequence is scored, whatever the turn."""
        self.sequence += cut_response(response)
        action, content = parse_action(response)
        if action == "answer" or final:
            return [], *self.grade(terminated=action == "answer")
        info: dict[str, Any] = {"action": action}
        if action == "search":
            passages, infra_error = await self._search(content)
            if infra_error is not None:
                info |= {INFRA_ERROR: infra_error, "searches": self.searches}
                return [{"role": "user", "content": information(passages)}], 0.0, True, False, info
            observation = information(passages)
        else:
            self.invalid_turns += 1
            observation = INVALID_ACTION
        if self.cap is not None:
            observation = self.cap(observation)
        self.sequence += observation
        info |= {"searches": self.searches, "invalid_turns": self.invalid_turns}
        return [{"role": "user", "content": observation}], 0.0, False, False, info

    def grade(self, *, terminated: bool) -> tuple[float, bool, bool, dict[str, Any]]:
        """(reward, terminated, truncated, info) of the sequence: ``compute_score_em``."""
        answer = extract_solution(self.sequence)
        correct = float(answer is not None and em_check(answer, self.golden_answers))
        reward = compute_score_em(
            self.sequence, self.golden_answers, format_score=self.format_score
        )
        info = {
            "answer": answer,
            "golden_answers": self.golden_answers,
            "exact_match": correct,
            "searches": self.searches,
            "invalid_turns": self.invalid_turns,
            "reward_components": {"correct": correct, "format": float(answer is not None)},
        }
        return reward, terminated, False, info

    async def _search(self, query: str) -> tuple[str, str | None]:
        """(passages, infra error) for one query. A query the retriever refuses (empty, too
        long) is answered ``Error: ...`` inside the information tags."""
        try:
            check_query(query, self.max_query_chars)
            self.searches += 1
            [hits] = await self.retriever.search([query], self.topk)
        except QueryError as exc:
            return f"Error: {exc}.", None
        except RetrieverUnavailable as exc:
            return "Error: the search service is unavailable.", f"search: {exc}"
        except Exception as exc:  # the index itself failed: not the agent's fault either
            error = f"search: the retriever failed: {type(exc).__name__}: {exc}"
            return "Error: the search failed.", error
        return passages_to_string(hits), None
