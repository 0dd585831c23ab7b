"""``agentrl env serve`` driven by OpenEnv's own code (``openenv_side.py`` in ``.venv-openenv``,
made by ``scripts/setup-openenv-env``; openenv 0.10.0).

Three real servers on loopback, each ``agentrl env serve`` in its own process: Math-v0 (24
sessions), the example plugin's Echo-v0 (2 sessions, 1.5 s idle expiry) and InfraFault-v0 (an
environment that reports infrastructure errors, and whose constructor fails after the first
instance). One run of the side script drives all three (its interpreter takes seconds to start);
each test checks one part of its answers.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from env_serving import env_servers

from agentrl.cli import main
from agentrl.envs import make_env
from agentrl.envs.remote.protocol import observation_payload

ROOT = Path(__file__).resolve().parents[2]
SIDE_VENV = ROOT / ".venv-openenv"
SIDE = Path(__file__).with_name("openenv_side.py")
IDLE_S = 1.5
TOO_BIG = 70_000  # over the servers' --max-body-bytes 65536
CONCURRENT = 16

pytestmark = pytest.mark.slow


def _payloads() -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(OpenEnv observation fields, the server's wire payload) for a reset and a graded step."""
    cases = [
        ([{"role": "user", "content": "2 + 2?"}], {"tools": []}, None, False, False),
        ([{"role": "tool", "content": "4", "name": "python"}], {"answer": "4"}, 1.0, True, False),
        ([], {"infra_error": "lost"}, 0.0, False, True),
    ]
    pairs = []
    for messages, info, reward, terminated, truncated in cases:
        payload = observation_payload(
            messages, info, reward=reward, terminated=terminated, truncated=truncated
        )
        fields = {**payload["observation"], "reward": reward, "done": payload["done"]}
        pairs.append((fields, payload))
    return pairs


PAYLOADS = _payloads()


@pytest.fixture(scope="module")
def side_python() -> Path:
    """OpenEnv's interpreter; missing, the tests fail (CI must not skip them)."""
    if not (SIDE_VENV / ".openenv-env-installed").exists():
        pytest.fail(f"the openenv venv is missing ({SIDE_VENV}): run scripts/setup-openenv-env")
    return SIDE_VENV / "bin" / "python"


@pytest.fixture(scope="module")
def servers():
    with env_servers(
        math=["agentrl/Math-v0", "--max-sessions", "24"],
        echo=[
            "tests/Echo-v0",
            "attempts=2",
            "--max-sessions",
            "2",
            "--session-timeout-s",
            str(IDLE_S),
        ],
        infra=["tests/InfraFault-v0", "fail_after=2"],
    ) as started:
        yield {name: url for name, (_, url) in started.items()}


@pytest.fixture(scope="module")
def answers(side_python: Path, servers: dict[str, str]) -> dict[str, Any]:
    math, echo, infra = servers["math"], servers["echo"], servers["infra"]
    requests = {
        "validate": ["validate", {"url": math, "actions": ["\\boxed{0}"]}],
        "episode": [
            "episode",
            {"url": math, "reset": {"seed": 3, "index": 5}, "actions": ["\\boxed{-1}"]},
        ],
        "concurrent": ["concurrent", {"url": math, "n": CONCURRENT}],
        "errors": ["errors", {"url": math, "too_big": TOO_BIG}],
        "http_session": ["http_session", {"url": math}],
        "limits": ["limits", {"url": echo, "idle_s": IDLE_S + 1.0}],
        "infra": ["episode", {"url": infra, "actions": ["fault"]}],
        "factory": ["episode", {"url": infra, "actions": ["ok"]}],
        "infra_health": ["validate", {"url": infra, "actions": ["ok"]}],
        "serialize": ["serialize", {"observations": [fields for fields, _ in PAYLOADS]}],
    }
    done = subprocess.run(
        [side_python, SIDE],
        input=json.dumps(requests),
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_observation_payload_is_openenvs_own_serialization(answers):
    # The same observation, serialized by OpenEnv's serialize_observation and by the server's
    # observation_payload: the same JSON, field for field (metadata included).
    assert answers["serialize"] == [payload for _, payload in PAYLOADS]


def test_openenv_validate_and_its_runtime_graders_pass(answers):
    answer = answers["validate"]
    report = answer["report"]
    assert report["passed"], report["criteria"]
    assert report["standard_profile"] == "openenv-http/1.x"
    assert report["mode"] == "simulation"
    assert answer["failure"] is None
    assert answer["exchanges"] == ["reset", "state", "step", "state"]
    for check_id, graded in answer["graders"].items():
        assert graded["status"] == "pass", (check_id, graded)


def test_math_episode_with_openenvs_typed_client(answers):
    answer = answers["episode"]
    assert "error" not in answer, answer
    reset, step = answer["results"]
    assert reset["reward"] is None and reset["done"] is False
    roles = [message["role"] for message in reset["observation"]["messages"]]
    assert roles == ["system", "user"]
    local = make_env("agentrl/Math-v0")
    messages, info = local.reset(seed=3, options={"index": 5})  # the reset's seed and index=5
    local.close()
    assert reset["observation"]["messages"] == messages
    assert reset["observation"]["info"] == info
    assert step["done"] is True and step["observation"]["terminated"] is True
    assert step["reward"] == 0.0 and step["observation"]["truncated"] is False
    assert step["observation"]["info"]["answer"] == "-1"
    assert [state["step_count"] for state in answer["states"]] == [0, 1]
    assert answer["states"][0]["episode_id"] == answer["states"][1]["episode_id"]


def test_concurrent_sessions_keep_their_own_state(answers):
    sessions = answers["concurrent"]["sessions"]
    assert len(sessions) == CONCURRENT
    assert len({session["question"] for session in sessions}) > CONCURRENT // 2
    assert len({session["state"]["session_id"] for session in sessions}) == CONCURRENT
    for i, session in enumerate(sessions):
        # Each session was judged against its own problem: its gold answer scored 1.
        assert session["reward"] == 1.0 and session["done"] is True, session
        assert session["info"]["gold_answer"] == session["gold"]
        assert session["state"]["episode_id"] == f"episode-{i}"
        assert session["after"]["episode_id"] == f"episode-{i}"
        assert session["after"]["step_count"] == 1


def test_malformed_input_gets_openenvs_errors_and_the_server_stays_up(answers):
    answer = answers["errors"]
    before_reset, reset, misspelt, not_text, bad_seed, step, after_end, again = answer["client"]
    assert "EXECUTION_ERROR" in before_reset and "reset" in before_reset
    assert reset == "ok" and step == "ok" and again == "ok"  # the session survived each error
    assert "VALIDATION_ERROR" in misspelt and "VALIDATION_ERROR" in not_text
    assert "VALIDATION_ERROR" in bad_seed
    assert "EXECUTION_ERROR" in after_end and "ResetNeeded" in after_end
    codes = [reply.get("data", {}).get("code") for reply in answer["raw"][:8]]
    assert codes == [
        "INVALID_JSON",
        "INVALID_JSON",
        "INVALID_JSON",
        "UNKNOWN_TYPE",
        "VALIDATION_ERROR",
        "VALIDATION_ERROR",
        "VALIDATION_ERROR",
        None,
    ]
    assert answer["raw"][7]["type"] == "observation"  # a bare reset still works after them
    mcp = answer["raw"][8]
    assert mcp["type"] == "mcp" and mcp["data"]["error"]["code"] == -32603
    assert answer["raw"][9] == {"closed": 1009}  # the oversized message: "message too big"
    unknown = answer["unknown_session_ws"][0]["data"]
    assert unknown == {"message": "Unknown session_id: nope", "code": "SESSION_ERROR"}
    assert answer["unknown_session_state"] == {
        "status": 404,
        "body": {"detail": "Unknown session_id: nope"},
    }
    assert answer["unknown_session_step"]["status"] == 404
    assert answer["mcp_close_unknown"]["body"]["error"] == {
        "code": -32602,
        "message": "Unknown session_id: nope",
        "data": None,
    }
    assert answer["mcp_parse_error"]["body"]["error"]["code"] == -32700
    assert answer["mcp_unknown_method"]["body"]["error"]["code"] == -32601
    assert answer["http_too_big"]["status"] == 413
    assert answer["http_bad_json"]["status"] == 422
    assert answer["http_bad_action"]["status"] == 422
    assert answer["http_bad_action"]["body"]["detail"][0]["loc"] == ["text"]
    assert answer["http_stateless_step"]["status"] == 409
    assert answer["health_after"] == {"status": 200, "body": {"status": "healthy"}}


def test_sessions_over_http_mcp_and_websocket_attach(answers):
    answer = answers["http_session"]
    sid = answer["created"]["body"]["result"]["session_id"]
    assert answer["reset"]["status"] == 200
    assert answer["step"]["status"] == 200 and answer["step"]["body"]["reward"] == 1.0
    assert answer["state"]["body"]["session_id"] == sid
    assert answer["state"]["body"]["step_count"] == 1
    assert answer["attached"][0]["data"]["session_id"] == sid
    assert answer["closed"]["body"]["result"] == {"session_id": sid, "closed": True}
    assert answer["after"]["status"] == 404
    stateless = answer["stateless_reset"]
    assert stateless["status"] == 200 and stateless["body"]["reward"] is None
    assert stateless["body"]["observation"]["messages"][-1]["role"] == "user"


def test_session_limit_and_idle_expiry(answers):
    answer = answers["limits"]
    assert "CAPACITY_REACHED" in answer["third"][0] and "2/2" in answer["third"][0]
    assert answer["after_release"] == ["ok"]  # closed sessions freed their slots
    reset, late, again, on_time = answer["expired"]
    assert "SESSION_ERROR" in late and "expired" in late and "--session-timeout-s" in late
    assert reset == again == on_time == "ok"  # a reset opened a new session on the connection
    assert answer["reconnected"] == ["ok"]


def test_infra_errors_pass_through_and_factory_errors_are_reported(answers):
    reset, step = answers["infra"]["results"]
    assert reset["reward"] is None and reset["observation"]["messages"][0]["content"] == "Say ok."
    assert step["observation"]["info"] == {"infra_error": "the grading sandbox could not start"}
    assert step["reward"] == 0.0 and step["done"] is True
    # fail_after=2: the command's probe and the session above were the two environments
    assert "FACTORY_ERROR" in answers["factory"]["error"]
    assert "no sandbox left" in answers["factory"]["error"]
    health = {c["id"]: c["passed"] for c in answers["infra_health"]["report"]["criteria"]}
    assert health["health_endpoint"] and health["schema_endpoint"]


def test_bad_arguments_stop_the_command(capsys):
    assert main(["env", "serve", "agentrl/Math-v0", "colour=blue"]) == 2
    assert "colour" in capsys.readouterr().err
    assert main(["env", "serve", "agentrl/Math-v0", "mode=sideways"]) == 2
    assert "mode" in capsys.readouterr().err
    assert main(["env", "serve", "agentrl/Nope-v0"]) == 2
    assert "Nope" in capsys.readouterr().err
    assert main(["env", "serve", "agentrl/Math-v0", "no-equals"]) == 2
    assert "key=value" in capsys.readouterr().err
