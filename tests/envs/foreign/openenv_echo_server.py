"""OpenEnv's echo environment on OpenEnv's own server; runs in ``.venv-openenv``.

``python openenv_echo_server.py WORKDIR PORT [MAX_SESSIONS]``: ``openenv init echo_env`` (the
echo environment the ``openenv`` package ships as its template) writes the environment into
WORKDIR, and ``openenv``'s ``create_app`` serves it with uvicorn on 127.0.0.1:PORT, taking up to
MAX_SESSIONS (default 8) concurrent WebSocket sessions. Prints ``ready`` once it accepts
connections.
"""

import importlib
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import uvicorn
from openenv.core.env_server.http_server import create_app


def main() -> None:
    workdir, port = Path(sys.argv[1]), int(sys.argv[2])
    max_sessions = int(sys.argv[3]) if len(sys.argv) > 3 else 8
    openenv = Path(sys.executable).with_name("openenv")
    subprocess.run(
        [str(openenv), "init", "echo_env", "--output-dir", str(workdir)],
        check=True,
        capture_output=True,
    )
    sys.path.insert(0, str(workdir))
    models = importlib.import_module("echo_env.models")
    environment = importlib.import_module("echo_env.server.echo_env_environment")
    app = create_app(
        environment.EchoEnvironment,
        models.EchoAction,
        models.EchoObservation,
        env_name="echo_env",
        max_concurrent_envs=max_sessions,
    )
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        if not thread.is_alive():
            sys.exit("the echo server did not start")
        time.sleep(0.05)
    with socket.create_connection(("127.0.0.1", port), timeout=5):
        pass
    print("ready", flush=True)
    thread.join()


if __name__ == "__main__":
    main()
