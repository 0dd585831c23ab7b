"""``agentrl/Search-v0`` with ``protocol="search-r1"`` against a transcript of Search-R1's own code.

Search-R1's training code (a verl fork) does not install here, so the expected strings below are
written from reading its source (github.com/PeterGriffinJin/Search-R1, main):

- the prompt: ``scripts/data_process/nq_search.py``, ``make_prefix(dp, "base")`` after
  ``process_fn``'s strip and ``?``;
- the cut and the first tag: ``search_r1/llm_agent/generation.py``,
  ``LLMGenerationManager._postprocess_responses`` and ``postprocess_predictions``;
- the observations: ``execute_predictions`` (``\\n\\n<information>...</information>\\n\\n`` and
  the invalid-action text) and ``_passages2string`` (``Doc i(Title: ...) text\\n``);
- the token cap: ``_process_next_obs`` (``next_obs_ids[:, :max_obs_length]``);
- the reward: ``verl/utils/reward_score/qa_em.py``, ``compute_score_em`` on the decoded prompt and
  response (``verl/trainer/main_ppo.py``, ``RewardManager``).

skyrl-gym's own code is compared in ``test_search_r1_skyrl.py``.
"""

import json

import datasets
import gymnasium
import pytest
from gymnasium.utils.env_checker import check_env

import agentrl  # noqa: F401  (registers the environments)
from agentrl.engine_pool.sglang_engine import free_port
from agentrl.envs import INFRA_ERROR
from agentrl.envs.search import SearchEnv, read_questions
from agentrl.envs.search.search_r1 import cut_response, parse_action
from agentrl.models import load_tokenizer

PROMPT = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first "
    "every time you get new information. After reasoning, if you find you lack some knowledge, "
    "you can call a search engine by <search> query </search> and it will return the top "
    "searched results between <information> and </information>. You can search as many times "
    "as your want. If you find no further external knowledge needed, you can directly provide "
    "the answer inside <answer> and </answer>, without detailed illustrations. For example, "
    "<answer> Beijing </answer>. Question: {question}\n"
)
INVALID = (
    "\nMy previous action is invalid. If I want to search, I should put the query between "
    "<search> and </search>. If I want to give the final answer, I should put the answer between "
    "<answer> and </answer>. Let me try again.\n"
)
CORPUS = [  # wiki-18's layout: contents = '"Title"' + newline + text
    {"id": "0", "contents": '"Rust (programming language)"\nRust was first released in 2015.'},
    {"id": "1", "contents": '"Lima"\nLima is the capital and largest city of Peru.'},
    {"id": "2", "contents": '"Peru"\nPeru is a country in South America.\nIts capital is Lima.'},
]
RUST = (
    '\n\n<information>Doc 1(Title: "Rust (programming language)") '
    "Rust was first released in 2015.</information>\n\n"
)


def nq_search_rows() -> list[dict]:
    """Rows as nq_search.py writes them from FlashRAG's nq (its columns kept, its own added)."""
    questions = [
        ("when was rust first released", ["2015", "July 2015"]),
        ("capital of peru?", ["Lima"]),
    ]
    return [
        {
            "id": f"train_{index}",
            "question": question.strip() + ("" if question.endswith("?") else "?"),
            "golden_answers": answers,
            "data_source": "nq",
            "prompt": [
                {
                    "role": "user",
                    "content": PROMPT.format(
                        question=question + "?" * (not question.endswith("?"))
                    ),
                }
            ],
            "ability": "fact-reasoning",
            "reward_model": {"style": "rule", "ground_truth": {"target": answers}},
            "extra_info": {"split": "train", "index": index},
        }
        for index, (question, answers) in enumerate(questions)
    ]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("search_r1")
    corpus = root / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(row) + "\n" for row in CORPUS))
    questions = root / "train.parquet"
    datasets.Dataset.from_list(nq_search_rows()).to_parquet(str(questions))
    return {"corpus": str(corpus), "dataset": str(questions)}


def make(files, **kwargs):
    return SearchEnv(protocol="search-r1", **files, **kwargs)


def test_check_env_passes(files, strict_gymnasium_warnings):
    check_env(gymnasium.make("agentrl/Search-v0", protocol="search-r1", **files).unwrapped)


def test_search_r1_parquet_rows_are_questions_with_their_prompt(files):
    questions = read_questions(files["dataset"])
    assert [q.golden_answers for q in questions] == [("2015", "July 2015"), ("Lima",)]
    assert questions[1].question == "capital of peru?"
    assert questions[1].metadata["data_source"] == "nq"
    # only reward_model's target: the gold answers come from there
    rows = [{k: v for k, v in row.items() if k != "golden_answers"} for row in nq_search_rows()]
    assert read_questions(datasets.Dataset.from_list(rows))[0].golden_answers == (
        "2015",
        "July 2015",
    )


async def test_reset_is_search_r1s_prompt_and_stop_strings(files):
    env = make(files)
    obs, info = await env.areset(options={"index": 0})
    assert obs == [
        {"role": "user", "content": PROMPT.format(question="when was rust first released?")}
    ]
    assert info["stop"] == ["</search>", "</answer>"]
    # a question without Search-R1's prompt gets the same text from the template
    env = SearchEnv(
        protocol="search-r1",
        corpus=files["corpus"],
        dataset=datasets.Dataset.from_list(
            [{"question": "  when was rust first released ", "golden_answers": ["2015"]}]
        ),
    )
    assert (await env.areset(options={"index": 0}))[0] == obs


async def test_a_transcript_of_search_r1s_step(files):
    env = make(files)
    await env.areset(options={"index": 0})
    # cut at the first </search>; the search's query is stripped; the rest of the turn is dropped
    step = await env.astep(
        "<think>I need the year.</think>\n<search> Rust programming language </search>"
        "\n<information>made up</information><answer>1999</answer>"
    )
    assert step[:4] == ([{"role": "user", "content": RUST}], 0.0, False, False)
    # neither tag: the invalid-action text, and the episode goes on
    step = await env.astep("I think it was 2015. <answer>2015")
    assert step[:4] == ([{"role": "user", "content": INVALID}], 0.0, False, False)
    # cut at the first </answer>: the first answer is the one graded
    obs, reward, terminated, truncated, info = await env.astep(
        "<answer> July 2015 </answer><answer>1999</answer>"
    )
    assert (obs, reward, terminated, truncated) == ([], 1.0, True, False)
    assert info["answer"] == "July 2015"
    assert env.episode.sequence == (
        PROMPT.format(question="when was rust first released?")
        + "<think>I need the year.</think>\n<search> Rust programming language </search>"
        + RUST
        + "I think it was 2015. <answer>2015"
        + INVALID
        + "<answer> July 2015 </answer>"
    )


@pytest.mark.parametrize(
    ("response", "action"),
    [
        ("<answer>Lima</answer> then <search>Peru</search>", ("answer", "Lima")),
        ("<search>Peru</search> <answer>Lima</answer>", ("search", "Peru")),
        ("<search>a <answer>b</answer></search>", ("search", "a <answer>b</answer>")),
        ("<answer>Lima</search></answer>", (None, "")),  # cut at </search>: no pair left
        ("<search>Peru</answer>", (None, "")),
        ("<search>\n</search>", ("search", "")),
    ],
)
def test_the_first_tag_of_the_cut_turn_acts(response, action):
    assert parse_action(response) == action
    assert cut_response("x</search>y</search>") == "x</search>"


async def test_passages_are_whole_and_titled_as_the_corpus_writes_them(files):
    env = make(files, topk=3)
    await env.areset(options={"index": 1})
    [message], *_ = await env.astep("<search>capital of Peru</search>")
    lima = '(Title: "Lima") Lima is the capital and largest city of Peru.\n'
    peru = '(Title: "Peru") Peru is a country in South America.\nIts capital is Lima.\n'
    framed = [
        f"\n\n<information>{text.strip()}</information>\n\n"
        for text in (f"Doc 1{lima}Doc 2{peru}", f"Doc 1{peru}Doc 2{lima}")
    ]
    assert message["content"] in framed


async def test_observations_are_capped_in_tokens(files):
    tokenizer = load_tokenizer("smollm2")
    env = make(files, tokenizer="smollm2", max_obs_tokens=12)
    await env.areset(options={"index": 0})
    [message], *_ = await env.astep("<search>Rust programming language</search>")
    ids = tokenizer(RUST, add_special_tokens=False)["input_ids"]
    assert len(ids) > 12
    assert message["content"] == tokenizer.decode(ids[:12])
    assert env.episode.sequence.endswith(message["content"])


@pytest.mark.parametrize(
    ("answer", "format_score", "reward"),
    [
        ("<answer>the 2015.</answer>", 0.0, 1.0),
        ("<answer>1999</answer>", 0.0, 0.0),
        ("<answer>1999</answer>", 0.1, 0.1),
        ("<answer></answer>", 0.1, 0.1),
    ],
)
async def test_the_reward_is_qa_em(files, answer, format_score, reward):
    env = make(files, format_score=format_score)
    await env.areset(options={"index": 0})
    assert (await env.astep(answer))[1] == reward


def test_the_last_turn_is_search_r1s_final_rollout(files):
    env = gymnasium.make("agentrl/Search-v0", protocol="search-r1", max_turns=2, **files)
    env.reset(options={"index": 1})
    # a search inside the tags of a search turn holds an answer; the final turn searches nothing
    assert env.step("<search>Peru <answer>Lima</answer></search>")[2:4] == (False, False)
    obs, reward, terminated, truncated, info = env.step("<search>Lima</search>")
    assert (obs, reward, terminated, truncated) == ([], 1.0, False, True)
    assert info["searches"] == 1


@pytest.mark.parametrize(
    ("query", "text"),
    [
        ("<search> </search>", "Error: the query is empty."),
        (
            "<search>" + "x" * 600 + "</search>",
            "Error: the query has 600 characters; the limit is 512.",
        ),
    ],
)
async def test_bad_queries_are_errors_in_the_information(files, query, text):
    env = make(files)
    await env.areset(options={"index": 0})
    obs, reward, terminated, _, info = await env.astep(query)
    assert obs == [{"role": "user", "content": f"\n\n<information>{text}</information>\n\n"}]
    assert (reward, terminated, info["searches"]) == (0.0, False, 0)


async def test_an_unreachable_retriever_is_an_infrastructure_error(files):
    env = SearchEnv(
        protocol="search-r1",
        dataset=files["dataset"],
        retriever_url=f"http://127.0.0.1:{free_port()}/retrieve",
    )
    await env.areset(options={"index": 0})
    _, reward, terminated, _, info = await env.astep("<search>Rust</search>")
    assert (reward, terminated) == (0.0, True)
    assert info[INFRA_ERROR].startswith("search: no answer from the retriever")


def test_a_bad_prompt_column_is_a_clear_error():
    rows = [{"question": "q", "golden_answers": ["a"], "prompt": "not messages"}]
    with pytest.raises(ValueError, match="'prompt' must be a list of messages"):
        read_questions(datasets.Dataset.from_list(rows))
