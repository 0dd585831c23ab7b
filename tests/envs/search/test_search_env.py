import json

import gymnasium
import pytest
from aiohttp import web
from gymnasium.utils.env_checker import check_env

import agentrl  # noqa: F401  (registers the environments)
from agentrl.config import ConfigError
from agentrl.engine_pool.sglang_engine import free_port
from agentrl.envs import INFRA_ERROR
from agentrl.envs.search import (
    SearchEnv,
    exact_match,
    extract_answer,
    f1_score,
    normalize_answer,
    read_questions,
)
from agentrl.envs.search.qa import SHIPPED_CORPUS
from agentrl.tools.retrieval_corpus import CorpusError
from agentrl.tools.retriever import (
    IndexNotFoundError,
    RetrieverUnavailable,
    cached_index,
    load_index,
)
from agentrl.tools.retriever_service import RetrieverService

QUESTIONS = read_questions()
TWO_HOP = next(i for i, q in enumerate(QUESTIONS) if q.metadata["type"] == "capital_of_country")


def make(**kwargs):
    return gymnasium.make("agentrl/Search-v0", **kwargs)


def hermes(query: str) -> str:
    return f"<tool_call>{json.dumps({'name': 'search', 'arguments': {'query': query}})}</tool_call>"


@pytest.mark.parametrize("tool_format", ["tags", "hermes"])
def test_check_env_passes(tool_format, strict_gymnasium_warnings):
    check_env(make(tool_format=tool_format).unwrapped, skip_render_check=True)


@pytest.mark.parametrize(("tool_format", "call"), [("tags", "<search>"), ("hermes", "<tool_call>")])
def test_reset_gives_the_question_and_the_search_tool(tool_format, call):
    obs, info = make(tool_format=tool_format).reset(options={"index": TWO_HOP})
    assert [m["role"] for m in obs] == ["system", "user"]
    assert call in obs[0]["content"] and "<answer>" in obs[0]["content"]
    assert obs[1]["content"] == QUESTIONS[TWO_HOP].question
    assert [t["function"]["name"] for t in info["tools"]] == ["search"]
    assert info["golden_answers"] == list(QUESTIONS[TWO_HOP].golden_answers)


@pytest.mark.parametrize("tool_format", ["tags", "hermes"])
def test_a_two_hop_question_answered_with_two_searches(tool_format):
    question = QUESTIONS[TWO_HOP]
    first, second = question.metadata["subquestions"]
    call = hermes if tool_format == "hermes" else lambda q: f"<search>{q}</search>"
    env = make(tool_format=tool_format, max_turns=4)
    env.reset(options={"index": TWO_HOP})
    obs, reward, terminated, _, info = env.step(f"First the country.\n{call(first)}")
    assert (reward, terminated, info) == (
        0.0,
        False,
        {"tool_calls": 1, "tool_errors": 0, "searches": 1},
    )
    assert obs[0]["role"] == "tool" and obs[0]["content"].startswith("Doc 1(Title: ")
    assert question.metadata["bridge"] in obs[0]["content"]
    obs, *_ = env.step(call(second))
    answer = question.golden_answers[0]
    assert answer in obs[0]["content"]
    _, reward, terminated, truncated, info = env.step(f"<answer>{answer}</answer>")
    assert (reward, terminated, truncated) == (1.0, True, False)
    assert info["searches"] == 2 and info["exact_match"] == info["f1"] == 1.0
    assert info["reward_components"] == {"correct": 1.0, "f1": 1.0, "format": 1.0}


@pytest.mark.parametrize(
    ("answer", "em", "f1"),
    [
        ("the PARIS.", 1.0, 1.0),
        ("City of Light", 1.0, 1.0),
        ("Paris, France", 0.0, 2 / 3),
        ("Lyon", 0.0, 0.0),
    ],
)
def test_answers_are_graded_after_normalisation(answer, em, f1):
    env = make()
    index = next(i for i, q in enumerate(QUESTIONS) if "Paris" in q.golden_answers)
    env.reset(options={"index": index})
    _, reward, terminated, _, info = env.step(f"<answer>{answer}</answer>")
    assert (reward, terminated, info["exact_match"], info["searches"]) == (em, True, em, 0)
    assert info["f1"] == pytest.approx(f1)


def test_qa_normalisation_is_search_r1s():
    assert normalize_answer("  The  Eiffel-Tower, an icon! ") == "eiffeltower icon"
    assert exact_match("an apple", ["Apple", "pear"]) == 1.0
    assert f1_score("the big red apple", ["red apple"]) == pytest.approx(2 / 3 * 2 / (2 / 3 + 1))
    assert extract_answer("<answer> </answer> x <answer> B </answer>") == "B"
    assert extract_answer("<answer>unterminated") is None


@pytest.mark.parametrize(
    ("action", "expected"),
    [
        ("<search></search>", "Error: the query is empty"),
        ("<search>\n  \n</search>", "Error: the query is empty"),
        (f"<search>{'x' * 600}</search>", "Error: the query has 600 characters; the limit is 512"),
        ("<search>Peru \udcff</search>", "Error: the query is not valid Unicode"),
        ("<search>xylophonist zzyzx</search>", "No passage matches the query."),
        ("<search>Peru", "Error: unterminated <search>"),
        ('<tool_call>{"name": "search", "arguments": {"query": 5}}</tool_call>', "Error:"),
        ('<tool_call>{"name": "search", "arguments": {bad}}</tool_call>', "Error: invalid JSON"),
        (
            '<tool_call>{"name": "browse", "arguments": {"url": "x"}}</tool_call>',
            "Error: unknown tool",
        ),
    ],
)
def test_bad_queries_and_calls_come_back_as_errors(action, expected):
    env = make(tool_format="hermes" if "tool_call" in action else "tags")
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step(action)
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert len(obs) == 1 and obs[0]["role"] == "tool" and obs[0]["content"].startswith(expected)
    assert INFRA_ERROR not in info
    _, reward, terminated, *_ = env.step("<answer>x</answer>")  # the episode goes on
    assert terminated


def test_searches_per_turn_are_capped():
    env = make(max_searches_per_turn=2)
    env.reset(seed=0)
    obs, _, _, _, info = env.step("<search>Peru</search><search>Chile</search>" * 500)
    assert [m["name"] for m in obs] == ["search", "search", "error"]
    assert "at most 2 searches per turn; 998 more were not run" in obs[2]["content"]
    assert info == {"tool_calls": 2, "tool_errors": 1, "searches": 2}


def test_observations_are_capped():
    env = make(topk=5, max_passage_chars=40, max_result_chars=150)
    env.reset(seed=0)
    [message], *_ = env.step("<search>capital of Peru</search>")
    assert message["content"].startswith(
        "Doc 1(Title: Lima) Lima: capital and largest city and econo ..."
    )
    head, _, tail = message["content"].rpartition("\n[... ")
    assert len(head) == 150 and tail.endswith("more characters not shown]")


def test_a_turn_without_call_or_answer_ends_the_episode():
    env = make()
    env.reset(seed=0)
    _, reward, terminated, _, info = env.step("I do not know.")
    assert (reward, terminated, info["answer"]) == (0.0, True, None)
    assert info["reward_components"]["format"] == 0.0


def test_the_turn_limit_truncates_search_loops():
    env = make(max_turns=2)
    env.reset(seed=0)
    assert env.step("<search>Peru</search>")[3] is False
    assert env.step("<search>Peru</search>")[3] is True


@pytest.fixture(scope="module")
def index_path(tmp_path_factory):
    return cached_index(SHIPPED_CORPUS, cache_dir=tmp_path_factory.mktemp("cache"))


async def test_the_service_gives_what_the_in_process_index_gives(index_path):
    runner = web.AppRunner(RetrieverService(load_index(index_path)).app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        remote = SearchEnv(retriever_url=f"http://127.0.0.1:{port}/retrieve")
        local = SearchEnv(index=str(index_path))
        for env in (remote, local):
            await env.areset(options={"index": TWO_HOP})
        action = "<search>capital of Peru</search><search></search><search>Einstein</search>"
        remote_step, local_step = [await env.astep(action) for env in (remote, local)]
        assert remote_step == local_step
        assert remote_step[0][1]["content"] == "Error: the query is empty"
    finally:
        await runner.cleanup()


async def test_an_unreachable_service_is_an_infrastructure_error():
    env = SearchEnv(retriever_url=f"http://127.0.0.1:{free_port()}/retrieve")
    await env.areset(seed=0)
    obs, reward, terminated, _, info = await env.astep("<search>Peru</search>")
    assert (reward, terminated) == (0.0, True)
    assert obs[0]["content"] == "Error: the search service is unavailable."
    assert info[INFRA_ERROR].startswith("search: no answer from the retriever at http://127.0.0.1")


def test_custom_questions_and_a_plain_corpus(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    rows = [
        {"id": "r", "title": "Rust", "text": "Rust was first released in 2015 by Mozilla."},
        {"id": "p", "title": "Python", "text": "Python was first released in 1991."},
    ]
    corpus.write_text("".join(json.dumps(row) + "\n" for row in rows))
    questions = tmp_path / "questions.jsonl"
    questions.write_text(
        json.dumps({"query": "When was Python released?", "answer": "1991"}) + "\n"
    )
    env = make(dataset=str(questions), columns={"question": "query"}, corpus=str(corpus))
    obs, info = env.reset(seed=0)
    assert obs[1]["content"] == "When was Python released?" and info["golden_answers"] == ["1991"]
    [message], *_ = env.step("<search>Python release</search>")
    assert message["content"].startswith("Doc 1(Title: Python) Python was first released in 1991.")
    assert env.step("<answer>1991</answer>")[1] == 1.0


def test_configuration_errors_are_clear(tmp_path):
    with pytest.raises(ConfigError, match="at most one of retriever_url, index, corpus"):
        make(index="/x", retriever_url="http://127.0.0.1:8000/retrieve")
    with pytest.raises(ConfigError, match="topk"):
        make(topk=0)
    with pytest.raises(IndexNotFoundError, match="no retriever index at"):
        make(index=str(tmp_path / "missing"))
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"contents": "a\\nb"}\n{"contents": \n')
    with pytest.raises(CorpusError, match="line 2 is not valid JSON"):
        make(corpus=str(corpus))
    with pytest.raises(FileNotFoundError, match="question file not found"):
        make(dataset=str(tmp_path / "none.jsonl"))
    with pytest.raises(IndexError, match="outside"):
        make().reset(options={"index": 10_000})


def test_the_long_context_start_holds_the_best_passages_within_the_budget(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    rows = [
        {"id": "p", "title": "Python", "text": "Python was first released in 1991.\nBy Guido."},
        {"id": "r", "title": "Rust", "text": "Rust was first released in 2015."},
        {"id": "c", "title": "C", "text": "C appeared in 1972; Python is younger."},
        {"id": "z", "title": "Zig", "text": "Zig is a systems language."},
    ]
    corpus.write_text("".join(json.dumps(row) + "\n" for row in rows))
    questions = tmp_path / "questions.jsonl"
    questions.write_text(json.dumps({"question": "When was Python released?", "answer": "1991"}))
    question = "When was Python released?"
    kwargs = {"dataset": str(questions), "corpus": str(corpus)}
    entries = [
        "Doc 1(Title: Python) Python was first released in 1991.\nBy Guido.",
        "Doc 2(Title: C) C appeared in 1972; Python is younger.",
        "Doc 3(Title: Rust) Rust was first released in 2015.",
    ]  # BM25's order; Zig shares no term with the question and is never returned
    obs, _ = make(**kwargs, context_passages=10).reset(seed=0)
    assert obs[1]["content"] == "Passages:\n" + "\n".join(entries) + f"\n\nQuestion: {question}"
    for limit, kept in [(len(entries[0]), 1), (len("\n".join(entries[:2])), 2), (100, 1)]:
        obs, _ = make(**kwargs, context_passages=10, max_context_chars=limit).reset(seed=0)
        body = "\n".join(entries[:kept])
        assert obs[1]["content"] == f"Passages:\n{body}\n\nQuestion: {question}"
    obs, _ = make(**kwargs, context_passages=10, max_context_chars=10).reset(seed=0)
    assert obs[1]["content"] == question  # not even the best passage fits
    obs, _ = make(**kwargs, context_passages=1).reset(seed=0)
    assert obs[1]["content"] == f"Passages:\n{entries[0]}\n\nQuestion: {question}"
    env = make(**kwargs, context_passages=3)  # the agent may still search
    env.reset(seed=0)
    [message], *_ = env.step("<search>Rust</search>")
    assert message["content"].startswith("Doc 1(Title: Rust)")
    # a question longer than the query cap is searched by its first max_query_chars characters
    long = question + " Tell me more about it, please." * 40
    questions.write_text(json.dumps({"question": long, "answer": "1991"}))
    obs, _ = make(**kwargs, context_passages=1, max_query_chars=len(question)).reset(seed=0)
    assert obs[1]["content"] == f"Passages:\n{entries[0]}\n\nQuestion: {long}"


def test_the_long_context_start_reaches_16k_tokens_on_the_shipped_corpus():
    """The long-context example's settings: every shipped question opens with 16k-20k tokens."""
    from agentrl.models import load_tokenizer

    tokenizer = load_tokenizer("smollm2")
    env = make(context_passages=1000, max_context_chars=64_000)
    lengths = []
    for index in range(0, len(QUESTIONS), 20):
        obs, _ = env.reset(options={"index": index})
        assert len(obs[1]["content"]) <= 64_000 + len(QUESTIONS[index].question) + 30
        text = tokenizer.apply_chat_template(obs, tokenize=False, add_generation_prompt=True)
        lengths.append(len(tokenizer(text, add_special_tokens=False)["input_ids"]))
    assert min(lengths) >= 16_000 and max(lengths) <= 20_000, lengths


async def test_a_retriever_down_at_the_long_context_start_fails_the_reset():
    env = SearchEnv(retriever_url=f"http://127.0.0.1:{free_port()}/retrieve", context_passages=5)
    with pytest.raises(RetrieverUnavailable, match="no answer from the retriever"):
        await env.areset(seed=0)


def test_the_long_context_start_is_not_search_r1s():
    with pytest.raises(ConfigError, match="Search-R1's protocol has none"):
        make(protocol="search-r1", context_passages=5)
    with pytest.raises(ConfigError, match="context_passages"):
        make(context_passages=1001)
