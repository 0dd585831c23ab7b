"""The sandbox images that ``sandboxes/build.sh`` builds, checked through the engine the backend uses.

The engine is the one ``docker.from_env()`` finds (``DOCKER_HOST``; ``make test`` runs
``sandboxes/setup.sh``, which starts Podman's API, and points ``DOCKER_HOST`` at it). These tests
fail, never skip, when the engine or the image is missing.
"""

import os
import subprocess
from pathlib import Path

import docker
import pytest

from agentrl.tools.container import DEFAULT_IMAGE

pytestmark = pytest.mark.slow

BUILD = Path(__file__).parents[2] / "sandboxes" / "build.sh"
TMPFS = "rw,size=64m,mode=1777"  # what the container backend mounts on /work and /tmp

PROBE = """
import os, sys
for directory in ("/work", "/tmp"):
    with open(os.path.join(directory, "probe"), "w") as f:
        f.write("ok")
try:
    open("/probe", "w")
    print("root file system writable")
except OSError:
    pass
print(os.getuid(), os.getgid(), os.getcwd(), sys.version_info[:2] >= (3, 11))
"""


@pytest.fixture(scope="module")
def client():
    try:
        client = docker.from_env()
        client.ping()
    except docker.errors.DockerException as exc:
        pytest.fail(
            f"no container engine at DOCKER_HOST={os.environ.get('DOCKER_HOST')!r} ({exc}): run "
            "`sudo sandboxes/setup.sh` and export the DOCKER_HOST it prints"
        )
    yield client
    client.close()


def test_python_image_exists(client):
    try:
        client.images.get(DEFAULT_IMAGE)
    except docker.errors.ImageNotFound:
        pytest.fail(f"{DEFAULT_IMAGE} is missing: run `sudo sandboxes/build.sh`")


def test_sandbox_user_writes_work_and_tmp_on_a_read_only_root(client):
    container = client.containers.create(
        DEFAULT_IMAGE,
        ["python3", "-c", PROBE],
        user="65534:65534",
        read_only=True,
        network_mode="none",
        tmpfs={"/work": TMPFS, "/tmp": TMPFS},
    )
    try:
        container.start()
        status = container.wait(timeout=60)["StatusCode"]
        output = container.logs().decode()
    finally:
        container.remove(force=True)
    assert (status, output) == (0, "65534 65534 /work True\n")


def run_build() -> list[str]:
    """Run ``sandboxes/build.sh`` (the python image) and return its progress lines."""
    result = subprocess.run([BUILD], capture_output=True, text=True, timeout=500)
    assert result.returncode == 0, result.stderr
    return result.stderr.splitlines()


def test_build_is_idempotent():
    run_build()
    lines = run_build()
    assert len(lines) == 2, lines  # the base image and the python image
    assert all(line.endswith(": up to date") for line in lines), lines
