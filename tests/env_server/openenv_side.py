"""OpenEnv's side of the env-server tests; runs in ``.venv-openenv`` (openenv 0.10.0).

``python openenv_side.py`` reads ``{key: [command, request]}`` on stdin and prints ``{key: answer}``. It
drives ``agentrl env serve`` with OpenEnv's own code only: a typed ``EnvClient`` subclass (the
pattern OpenEnv's environments ship: ``_step_payload``, ``_parse_result`` into their
``Observation`` subclass, ``_parse_state`` into ``State``), ``GenericEnvClient``, the
``openenv validate`` checks of a running server and the runtime collector and graders of
``openenv.validation``. Raw frames and HTTP bodies (``websockets``, ``requests``) are used only
for the malformed input OpenEnv's clients cannot send.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from types import SimpleNamespace
from typing import Any

import requests
from openenv.cli._validation import validate_running_environment
from openenv.core import EnvClient, GenericEnvClient
from openenv.core.client_types import StepResult
from openenv.core.env_server.serialization import serialize_observation
from openenv.core.env_server.types import Action, Observation, State
from openenv.validation.graders.runtime import (
    ObservationSchemaGrader,
    RewardWellFormedGrader,
    StateContractGrader,
)
from openenv.validation.runtime.collector import collect_runtime_evidence
from openenv.validation.runtime.contracts import RuntimePlan, RuntimeReset
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed


class AgentrlAction(Action):
    text: str


class AgentrlObservation(Observation):
    messages: list[dict[str, Any]]
    info: dict[str, Any]
    terminated: bool
    truncated: bool


class AgentrlClient(EnvClient[AgentrlAction, AgentrlObservation, State]):
    def _step_payload(self, action: AgentrlAction) -> dict[str, Any]:
        return action.model_dump()

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[AgentrlObservation]:
        observation = AgentrlObservation(
            **payload["observation"], reward=payload.get("reward"), done=payload["done"]
        )
        return StepResult(
            observation=observation, reward=payload.get("reward"), done=payload["done"]
        )

    def _parse_state(self, payload: dict[str, Any]) -> State:
        return State(**payload)


def result_json(result: StepResult[AgentrlObservation]) -> dict[str, Any]:
    return {
        "observation": result.observation.model_dump(exclude={"reward", "done", "metadata"}),
        "reward": result.reward,
        "done": result.done,
    }


async def episode(request: dict[str, Any]) -> dict[str, Any]:
    """One episode with the typed client: reset (with ``reset``'s kwargs), then ``actions``."""
    async with AgentrlClient(base_url=request["url"]) as env:
        results = [result_json(await env.reset(**request.get("reset", {})))]
        states = [(await env.state()).model_dump()]
        for text in request["actions"]:
            results.append(result_json(await env.step(AgentrlAction(text=text))))
            states.append((await env.state()).model_dump())
    return {"results": results, "states": states}


async def concurrent(request: dict[str, Any]) -> dict[str, Any]:
    """``n`` sessions at once with GenericEnvClient: each resets with its own seed, reads its
    own state, answers its own problem's gold answer, then its state again."""

    async def one(i: int) -> dict[str, Any]:
        async with GenericEnvClient(base_url=request["url"]) as env:
            reset = await env.reset(seed=i, episode_id=f"episode-{i}")
            state = await env.state()
            gold = reset.observation["info"]["gold_answer"]
            await asyncio.sleep(0.01 * (i % 4))  # interleave the sessions' steps
            step = await env.step({"text": f"The answer is \\boxed{{{gold}}}"})
            after = await env.state()
            return {
                "question": reset.observation["messages"][-1]["content"],
                "gold": gold,
                "state": state,
                "reward": step.reward,
                "done": step.done,
                "info": step.observation["info"],
                "after": after,
            }

    return {"sessions": await asyncio.gather(*(one(i) for i in range(request["n"])))}


async def raw_exchange(url: str, frames: list[Any], query: str = "") -> list[Any]:
    """Send each frame (a str as is, else as JSON) and read one reply for each; the close
    code and reason when the server closes instead."""
    replies: list[Any] = []
    ws_url = url.replace("http://", "ws://") + "/ws" + query
    async with connect(ws_url, max_size=None) as ws:
        for frame in frames:
            # a refused session's error frame may be queued when the send meets the close
            with contextlib.suppress(ConnectionClosed):
                await ws.send(frame if isinstance(frame, (str, bytes)) else json.dumps(frame))
            try:
                replies.append(json.loads(await ws.recv()))
            except ConnectionClosed as exc:
                replies.append({"closed": exc.rcvd.code if exc.rcvd else None})
                break
    return replies


async def client_error(url: str, steps: list[tuple[str, Any]]) -> list[str]:
    """Run (verb, argument) pairs on one GenericEnvClient session; the text of each error."""
    out = []
    async with GenericEnvClient(base_url=url) as env:
        for verb, argument in steps:
            try:
                if verb == "reset":
                    await env.reset(**argument)
                elif verb == "step":
                    await env.step(argument)
                elif verb == "sleep":
                    await asyncio.sleep(argument)
                    continue
                out.append("ok")
            except Exception as exc:
                out.append(f"{type(exc).__name__}: {exc}")
    return out


async def errors(request: dict[str, Any]) -> dict[str, Any]:
    url = request["url"]
    big = "x" * request["too_big"]
    out: dict[str, Any] = {}
    out["client"] = await client_error(
        url,
        [
            ("step", {"text": "before any reset"}),
            ("reset", {"seed": 1}),
            ("step", {"txt": "a misspelt field"}),
            ("step", {"text": 42}),
            ("reset", {"seed": -1}),
            ("step", {"text": "\\boxed{1}"}),
            ("step", {"text": "after the episode ended"}),
            ("reset", {"seed": 2}),
        ],
    )
    out["raw"] = await raw_exchange(
        url,
        [
            "{not json",
            b"\x00binary",
            [1, 2],
            {"type": "dance"},
            {"type": "step"},
            {"type": "state", "data": {}},
            {"type": "reset", "data": {}, "extra": 1},
            {"type": "reset"},
            {"type": "mcp", "data": {"jsonrpc": "2.0", "method": "tools/list", "id": 1}},
            {"type": "step", "data": {"text": big}},
        ],
    )
    out["unknown_session_ws"] = await raw_exchange(url, [{"type": "state"}], "?session_id=nope")
    out["unknown_session_state"] = _http("get", url + "/state?session_id=nope")
    out["unknown_session_step"] = _http(
        "post", url + "/step", json={"action": {"text": "x"}, "session_id": "nope"}
    )
    out["mcp_close_unknown"] = _http(
        "post",
        url + "/mcp",
        json={
            "jsonrpc": "2.0",
            "method": "openenv/session/close",
            "params": {"session_id": "nope"},
            "id": 7,
        },
    )
    out["mcp_parse_error"] = _http("post", url + "/mcp", data=b"{oops")
    out["mcp_unknown_method"] = _http(
        "post", url + "/mcp", json={"jsonrpc": "2.0", "method": "dance", "id": 8}
    )
    out["http_too_big"] = _http("post", url + "/step", json={"action": {"text": big}})
    out["http_bad_json"] = _http("post", url + "/step", data=b"{oops")
    out["http_bad_action"] = _http("post", url + "/step", json={"action": {"txt": "x"}})
    out["http_stateless_step"] = _http("post", url + "/step", json={"action": {"text": "x"}})
    out["health_after"] = _http("get", url + "/health")
    return out


def _http(method: str, url: str, **kwargs: Any) -> dict[str, Any]:
    response = requests.request(method, url, timeout=30, **kwargs)
    try:
        body = response.json()
    except ValueError:
        body = response.text
    return {"status": response.status_code, "body": body}


async def http_session(request: dict[str, Any]) -> dict[str, Any]:
    """A session made over POST /mcp, stepped over HTTP, attached to over /ws, then closed."""
    url = request["url"]
    rpc = {"jsonrpc": "2.0", "method": "openenv/session/create", "id": 1}
    created = _http("post", url + "/mcp", json=rpc)
    sid = created["body"]["result"]["session_id"]
    reset = _http("post", url + "/reset", json={"session_id": sid, "seed": 5})
    gold = reset["body"]["observation"]["info"]["gold_answer"]
    step = _http(
        "post",
        url + "/step",
        json={"action": {"text": f"\\boxed{{{gold}}}"}, "session_id": sid},
    )
    state = _http("get", url + f"/state?session_id={sid}")
    attached = await raw_exchange(url, [{"type": "state"}], f"?session_id={sid}")
    close = {
        "jsonrpc": "2.0",
        "method": "openenv/session/close",
        "params": {"session_id": sid},
        "id": 2,
    }
    closed = _http("post", url + "/mcp", json=close)
    after = _http("get", url + f"/state?session_id={sid}")
    stateless = _http("post", url + "/reset", json={"seed": 5})
    return {
        "created": created,
        "reset": reset,
        "step": step,
        "state": state,
        "attached": attached,
        "closed": closed,
        "after": after,
        "stateless_reset": stateless,
    }


async def limits(request: dict[str, Any]) -> dict[str, Any]:
    """Against a server of --max-sessions 2 and a short --session-timeout-s."""
    url = request["url"]
    out: dict[str, Any] = {}
    async with GenericEnvClient(base_url=url) as a, GenericEnvClient(base_url=url) as b:
        await a.reset(seed=1)
        await b.reset(seed=2)
        out["third"] = await client_error(url, [("reset", {"seed": 3})])
    out["after_release"] = await client_error(url, [("reset", {"seed": 3})])
    out["expired"] = await client_error(
        url,
        [
            ("reset", {"seed": 4}),
            ("sleep", request["idle_s"]),
            ("step", {"text": "late"}),
            ("reset", {"seed": 4}),
            ("step", {"text": "on time"}),
        ],
    )
    out["reconnected"] = await client_error(url, [("reset", {"seed": 5})])
    return out


def validate(request: dict[str, Any]) -> dict[str, Any]:
    """``openenv validate --url``'s checks, then one episode collected and graded by OpenEnv's
    runtime graders (observation schema, reward, state contract)."""
    url = request["url"]
    report = validate_running_environment(url)
    plan = RuntimePlan(
        plan_schema_version="1",
        reset=RuntimeReset(episode_id="graded-episode", seed=7, options=request.get("options", {})),
        actions=[{"text": text} for text in request["actions"]],
    )
    evidence = collect_runtime_evidence(url, plan, episode_timeout_s=60)
    subject = SimpleNamespace(manifest=SimpleNamespace(reward=SimpleNamespace(range=(0.0, 1.0))))
    graders = {}
    for grader in (ObservationSchemaGrader(), RewardWellFormedGrader(), StateContractGrader()):
        result = grader.run(SimpleNamespace(runtime_evidence=evidence, **vars(subject)))
        graders[grader.check_id] = {"status": result.status.value, "evidence": result.evidence}
    return {
        "report": report,
        "failure": evidence.failure_reason,
        "exchanges": [row.operation for row in evidence.exchanges],
        "graders": graders,
    }


def serialize(request: dict[str, Any]) -> list[dict[str, Any]]:
    """OpenEnv's own ``serialize_observation`` of each ``{observation fields, reward, done}``."""
    return [
        serialize_observation(AgentrlObservation(**fields)) for fields in request["observations"]
    ]


COMMANDS = {
    "episode": episode,
    "concurrent": concurrent,
    "errors": errors,
    "http_session": http_session,
    "limits": limits,
    "validate": validate,
    "serialize": serialize,
}


def run_all(requests_by_key: dict[str, list[Any]]) -> dict[str, Any]:
    """Run ``{key: [command, request]}`` one after another (one interpreter start for all);
    a command that raises gives ``{"error": ...}`` under its key."""
    answers: dict[str, Any] = {}
    for key, (name, request) in requests_by_key.items():
        try:
            answer = COMMANDS[name](request)
            answers[key] = asyncio.run(answer) if asyncio.iscoroutine(answer) else answer
        except Exception as exc:
            answers[key] = {"error": f"{type(exc).__name__}: {exc}"}
    return answers


if __name__ == "__main__":
    json.dump(run_all(json.load(sys.stdin)), sys.stdout, default=str)
