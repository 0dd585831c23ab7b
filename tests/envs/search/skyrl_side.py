"""The anchor's side of the Search-R1 protocol tests; runs in ``.venv-skyrl`` (skyrl-gym 0.4.0).

``python skyrl_side.py score`` reads ``[{"solution": str, "target": [str, ...]}, ...]`` on stdin
and prints, for each, skyrl-gym's ``compute_score(solution, {"target": target})``, its
``em_check(solution, target)`` and ``normalize_answer(solution)``
(``skyrl_gym/envs/search/utils.py``, adapted from Search-R1's ``qa_em.py``).

``python skyrl_side.py episode`` reads ``{"url": str, "topk": int, "max_turns": int, "target":
[str, ...], "actions": [str, ...]}``, makes skyrl-gym's own ``SearchEnv`` and steps it with the
actions, printing each step's ``observations``, ``reward`` and ``done``. Its search tool posts
``{"query": str, ...}`` (one query), while Search-R1's retrieval server, and agentrl's, take
``{"queries": [str, ...]}``: a loopback relay here forwards each request to ``url`` with the
query as a one-element ``queries`` and hands the answer back unchanged, so the passages come from
agentrl's real retriever service and skyrl-gym's code runs unpatched.
"""

import json
import sys
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def score() -> None:
    from skyrl_gym.envs.search.utils import compute_score, em_check, normalize_answer

    cases = json.load(sys.stdin)
    json.dump(
        [
            {
                "score": compute_score(case["solution"], {"target": case["target"]}),
                "em": em_check(case["solution"], case["target"]),
                "normalized": normalize_answer(case["solution"]),
            }
            for case in cases
        ],
        sys.stdout,
    )


def relay(url: str) -> ThreadingHTTPServer:
    """A loopback server turning skyrl-gym's ``query`` requests into ``queries`` ones."""

    class Relay(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            body["queries"] = [body.pop("query")]
            request = urllib.request.Request(
                url, json.dumps(body).encode(), {"Content-Type": "application/json"}
            )
            try:
                with urllib.request.urlopen(request, timeout=30) as response:
                    status, answer = response.status, response.read()
            except urllib.error.HTTPError as exc:
                status, answer = exc.code, exc.read()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Relay)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def episode() -> None:
    from skyrl_gym.envs.search.env import SearchEnv, SearchEnvConfig

    request = json.load(sys.stdin)
    server = relay(request["url"])
    try:
        config = SearchEnvConfig(
            search_url=f"http://127.0.0.1:{server.server_address[1]}/retrieve",
            topk=request["topk"],
            log_requests=False,
        )
        extras = {
            "reward_spec": {"ground_truth": {"target": request["target"]}},
            "max_turns": request["max_turns"],
        }
        env = SearchEnv(config, extras)
        env.init([{"role": "user", "content": "question"}])
        steps = []
        for action in request["actions"]:
            out = env.step(action)
            steps.append({key: out[key] for key in ("observations", "reward", "done")})
            if out["done"]:
                break
    finally:
        server.shutdown()
    json.dump(steps, sys.stdout)


if __name__ == "__main__":
    {"score": score, "episode": episode}[sys.argv[1]]()
