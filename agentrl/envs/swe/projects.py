"""The projects generated SWE tasks come from, and the sandbox image of each one.

A project is a ``projects/<sdist stem>.json`` file (:class:`~agentrl.envs.swe.repo.SdistProject`)
next to its source distribution. Its image, ``localhost/agentrl-swe-<name>:<version>``, is the SWE
base image (python3, pytest, git, a C toolchain) plus the project's ``apt_packages``, built by
``sandboxes/build.sh swe`` (every shipped project) or ``sandboxes/build.sh swe-project FILE``. The
image holds no source of the project: an episode's sandbox gets its instance's base tree from the
host (:mod:`agentrl.envs.swe.workspace`), so nothing in the image can reveal a fix.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from agentrl.envs.swe.instances import SWEInstance
from agentrl.envs.swe.repo import SdistProject

SHIPPED_PROJECTS = Path(__file__).parent / "data" / "projects"
"""The shipped projects' directory (``agentrl/envs/swe/data/projects``)."""

BUILD_SCRIPT = Path(__file__).resolve().parents[3] / "sandboxes" / "build.sh"
TESTBED_BUILD_COMMAND = f"sudo {BUILD_SCRIPT} swe-testbed"
"""The command that builds every shipped instance's image in SWE-bench's layout."""


@dataclass(frozen=True)
class Project:
    """A project file, where it was read from, and its image."""

    spec: SdistProject
    path: Path

    @property
    def sdist(self) -> Path:
        """The source distribution, next to the project file."""
        return self.path.with_name(self.spec.sdist)

    @property
    def image(self) -> str:
        return project_image(self.spec.name, self.spec.version)

    @property
    def build_command(self) -> str:
        """The command that builds :attr:`image` (as root with Podman)."""
        return f"sudo {BUILD_SCRIPT} swe-project {self.path}"


def project_image(name: str, version: str) -> str:
    """The image of project ``name`` at ``version``, as ``sandboxes/build.sh`` names it."""
    repository = re.sub(r"[^a-z0-9_.-]+", "-", name.lower())
    tag = re.sub(r"[^A-Za-z0-9_.-]+", "-", version)
    return f"localhost/agentrl-swe-{repository}:{tag}"


def load_projects(directory: str | Path = SHIPPED_PROJECTS) -> dict[tuple[str, str], Project]:
    """Every ``*.json`` project file in ``directory``, keyed by ``(name, version)``."""
    directory = Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"no SWE projects directory at {directory}")
    projects = {}
    for path in sorted(directory.glob("*.json")):
        try:
            spec = SdistProject.model_validate_json(path.read_text())
        except ValueError as exc:
            raise ValueError(f"{path} is not a valid SWE project file: {exc}") from exc
        projects[(spec.name, spec.version)] = Project(spec, path)
    return projects


def project_of(instance: SWEInstance, projects: dict[tuple[str, str], Project]) -> Project:
    """The project ``instance`` was generated from; a clear error when it is not known."""
    taskgen = instance.agentrl_taskgen
    if taskgen is None:
        raise ValueError(
            f"instance {instance.instance_id!r} was not made by agentrl's task generator "
            "(no agentrl_taskgen field): agentrl/SWE-v0 rebuilds repositories from the source "
            "distributions of generated tasks only"
        )
    for project in projects.values():
        if project.spec.name == taskgen.project and project.spec.sdist == taskgen.sdist:
            return project
    known = ", ".join(f"{name}=={version}" for name, version in projects) or "none"
    raise ValueError(
        f"instance {instance.instance_id!r} needs project {taskgen.project} from "
        f"{taskgen.sdist}, which is not among the projects ({known})"
    )
