"""``protocol="search-r1"`` against skyrl-gym's own code (``skyrl_side.py`` in ``.venv-skyrl``,
made by ``scripts/setup-skyrl-env``; skyrl-gym 0.4.0, ``skyrl_gym/envs/search``).

skyrl-gym's SearchEnv is "based on Verl + Search-R1" and its reward is Search-R1's ``qa_em.py``;
where it departs from Search-R1's ``generation.py`` we follow Search-R1, and the last test pins
those departures so that the documentation's list of them stays true:

- skyrl-gym ends the episode on any turn holding ``<answer>`` and ``</answer>``, even after a
  ``<search>`` (Search-R1 cuts the turn at ``</search>`` and searches);
- a turn with neither tag gets ``\\n<information></information>\\n`` (Search-R1: its
  invalid-action text);
- observations are ``\\n<information>`` + a JSON ``{"result": "Doc 1: <contents>\\n..."}`` +
  ``</information>\\n`` (Search-R1: ``\\n\\n<information>Doc 1(Title: <title>) <text>...``);
- its reward reads the turns without the prompt and so takes the last answer of one or more
  (Search-R1 reads the prompt too and needs two, the prompt's example being the first): the same
  score for Search-R1's prompt, which holds exactly one.
"""

import asyncio
import json
import re
import subprocess
from pathlib import Path

import datasets
import pytest
from aiohttp import web

from agentrl.engine_pool.sglang_engine import free_port
from agentrl.envs.search import SearchEnv, normalize_answer
from agentrl.envs.search.search_r1 import PROMPT, compute_score_em, em_check
from agentrl.tools.retriever import cached_index, load_index
from agentrl.tools.retriever_service import RetrieverService

ROOT = Path(__file__).resolve().parents[3]
SIDE_VENV = ROOT / ".venv-skyrl"
SIDE = Path(__file__).with_name("skyrl_side.py")
CORPUS = [
    {"id": "0", "contents": '"Rust (programming language)"\nRust was first released in 2015.'},
    {"id": "1", "contents": '"Lima"\nLima is the capital and largest city of Peru.'},
    {"id": "2", "contents": '"Peru"\nPeru is a country in South America.\nIts capital is Lima.'},
]
GOLD = ["Lima", "Lima, Peru"]


@pytest.fixture(scope="module")
def side_python() -> Path:
    """The anchor's interpreter; missing, the tests fail (CI must not skip them)."""
    if not (SIDE_VENV / ".skyrl-env-installed").exists():
        pytest.fail(f"the skyrl venv is missing ({SIDE_VENV}): run scripts/setup-skyrl-env")
    return SIDE_VENV / "bin" / "python"


def side(side_python: Path, command: str, request: object) -> object:
    done = subprocess.run(
        [side_python, SIDE, command],
        input=json.dumps(request),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


ANSWERS = [
    "Lima",
    "  lima ",
    "The Lima.",
    "lima, peru",
    "Lima Peru",
    "LIMA!!!",
    "an  lima",
    "Limas",
    "theLima",
    "Lima (city)",
    "Líma",
    "lima\tperu",
    "a the an",
    "",
    "Lima — Peru",
    "Lima's",
]
SOLUTIONS = [
    "<answer>Lima</answer>",
    "<think>x</think><answer> Lima </answer>",
    "<answer>Cusco</answer> more <answer>the lima</answer>",
    "<answer>Lima</answer><answer>Cusco</answer>",
    "no answer at all",
    "<answer>Lima",
    "<answer>\nLima, Peru\n</answer>",
    "<answer></answer>",
]


def test_normalisation_and_exact_match_are_skyrl_gyms(side_python):
    cases = [{"solution": answer, "target": GOLD} for answer in ANSWERS]
    theirs = side(side_python, "score", cases)
    assert [normalize_answer(answer) for answer in ANSWERS] == [t["normalized"] for t in theirs]
    assert [em_check(answer, GOLD) for answer in ANSWERS] == [bool(t["em"]) for t in theirs]
    assert any(t["em"] for t in theirs) and not all(t["em"] for t in theirs)


def test_the_reward_of_a_sequence_is_skyrl_gyms(side_python):
    """Theirs reads the turns alone; ours, as Search-R1, the prompt (one example answer) too."""
    theirs = side(side_python, "score", [{"solution": s, "target": GOLD} for s in SOLUTIONS])
    prompt = PROMPT.format(question="What is the capital of Peru?")
    ours = [compute_score_em(prompt + solution, GOLD) for solution in SOLUTIONS]
    assert ours == [t["score"] for t in theirs]
    assert sorted(set(ours)) == [0.0, 1.0]


@pytest.fixture
async def service_url(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(row) + "\n" for row in CORPUS))
    index = load_index(cached_index(corpus, cache_dir=tmp_path / "cache"))
    runner = web.AppRunner(RetrieverService(index).app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}/retrieve"
    finally:
        await runner.cleanup()


async def run_both(side_python, url, actions):
    env = SearchEnv(
        protocol="search-r1",
        retriever_url=url,
        topk=2,
        dataset=datasets.Dataset.from_list(
            [{"question": "capital of Peru", "golden_answers": GOLD}]
        ),
    )
    await env.areset(options={"index": 0})
    ours = []
    for action in actions:
        obs, reward, terminated, _, _ = await env.astep(action)
        ours.append({"observations": obs, "reward": reward, "done": terminated})
        if terminated:
            break
    request = {"url": url, "topk": 2, "max_turns": 10, "target": GOLD, "actions": actions}
    # the side process calls back into this event loop's service: run it in a thread
    theirs = await asyncio.to_thread(side, side_python, "episode", request)
    return ours, theirs


def documents(skyrl_observation: str) -> list[str]:
    """The ``contents`` of each document of a skyrl-gym search observation, in order."""
    body = skyrl_observation.removeprefix("\n<information>").removesuffix("</information>\n")
    result = json.loads(body)["result"]
    return [doc.strip() for doc in re.split(r"(?m)^Doc \d+: ", result) if doc.strip()]


def as_search_r1(contents: list[str]) -> str:
    """Search-R1's observation for documents with these ``contents`` (``_passages2string``)."""
    passages = "".join(
        f"Doc {i}(Title: {c.partition(chr(10))[0]}) {c.partition(chr(10))[2]}\n"
        for i, c in enumerate(contents, start=1)
    )
    return f"\n\n<information>{passages.strip()}</information>\n\n"


@pytest.mark.parametrize(
    "actions",
    [
        ["<think>Peru?</think><search> capital of Peru </search>", "<answer> Lima </answer>"],
        ["<search>Rust released</search>", "<search>Lima</search>", "<answer>Cusco</answer>"],
        ["<answer>lima, peru</answer>"],
    ],
)
async def test_steps_match_skyrl_gym_where_it_follows_search_r1(side_python, service_url, actions):
    ours, theirs = await run_both(side_python, service_url, actions)
    assert [s["done"] for s in ours] == [s["done"] for s in theirs]
    assert [float(s["reward"]) for s in ours] == [float(s["reward"]) for s in theirs]
    for our_step, their_step in zip(ours, theirs, strict=True):
        if not our_step["done"]:  # the same documents, in the same order, framed Search-R1's way
            [their_obs], [our_obs] = their_step["observations"], our_step["observations"]
            assert their_obs["role"] == our_obs["role"] == "user"
            contents = documents(their_obs["content"])
            assert contents and our_obs["content"] == as_search_r1(contents)


async def test_where_skyrl_gym_departs_from_search_r1(side_python, service_url):
    actions = ["Let me think.", "<search>Lima</search> <answer>Lima</answer>"]
    ours, theirs = await run_both(side_python, service_url, actions)
    assert theirs[0] == {
        "observations": [{"role": "user", "content": "\n<information></information>\n"}],
        "reward": 0,
        "done": False,
    }
    assert ours[0]["observations"][0]["content"].startswith("\nMy previous action is invalid.")
    assert theirs[1]["done"] is True and theirs[1]["reward"] == 1.0  # answered past </search>
    assert ours[1]["done"] is False  # Search-R1 searched
    assert ours[1]["observations"][0]["content"].startswith("\n\n<information>Doc 1(Title: ")
