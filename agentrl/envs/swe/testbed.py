"""SWE-bench's image layout for generated SWE instances: the images' names and build contexts.

SWE-bench (5.x) evaluates an instance in the container image its row names (column ``image``); its
own images are named by :func:`~agentrl.envs.swe.row_formats.swebench_image` (SWE-bench's ``ImageSpec.name``):
``sweb.eval.x86_64.<instance_id>:latest``, lower-cased. An official image holds the repository
at ``/testbed``, a git checkout at ``base_commit``, the user root, and a conda environment
``testbed`` with the project installed, which the row's ``eval_script`` activates.

Ours, built by ``sandboxes/build.sh swe-testbed`` (also run by ``swe`` and ``all``) from
``sandboxes/swe-testbed/Containerfile``: the project's image
(``localhost/agentrl-swe-<name>:<version>``) plus one layer, ``/testbed``, the instance's base tree
(:func:`~agentrl.envs.swe.repo.build_base_tree`: the bug in, the hidden tests out) as a git
repository whose HEAD is ``base_commit`` (one deterministic commit, no history that could hold
the fix); the user root. What differs from an official image, and why:

* no conda: no conda channel is reachable here. The project's environment is the image's own
  Python (Debian's ``python3`` with pytest), already on ``PATH``, so the rows' ``eval_script``
  (:mod:`~agentrl.envs.swe.swebench_rows`) activates nothing;
* the project is not pip-installed: its tests import it from ``/testbed``, where ``python3 -m
  pytest`` runs (the shipped projects are pure Python and have no dependencies beyond pytest).

The same Containerfile builds each shipped project's image in SWE-smith's layout
(:mod:`agentrl.envs.swe.swesmith_rows`): ``/testbed`` is the project's clean tree, the sdist with
its tests, committed as ``environment_setup_commit`` (:func:`~agentrl.envs.swe.repo.build_environment_tree`);
the instances' SWE-smith rows apply their bug to it.

``sandboxes/swe-r2e/Containerfile`` builds each shipped instance's image in R2E-Gym's layout
(:mod:`agentrl.envs.swe.r2e_rows`): ``/testbed`` the base tree at ``base_commit`` with R2E-Gym's
``run_tests.sh`` and a ``.venv``, ``/r2e_tests`` the hidden tests.

The build context of one image is written by :func:`write_context` (the CLI's ``context``);
``sandboxes/build.sh`` reads the images to build from the CLI's ``list``::

    python -m agentrl.envs.swe.testbed list [--instances FILE]
        one line per instance: its image, its project's image, base_commit, instance_id, the
        recipe (swe-testbed); then one per project in SWE-smith's layout: its image, the
        project's image, environment_setup_commit, swesmith-<name>-<version>, swe-testbed; then
        one per instance in R2E-Gym's layout: its image, the project's image, base_commit,
        r2e-<instance_id>, swe-r2e
    python -m agentrl.envs.swe.testbed context DIR ID... [--instances FILE]
        DIR/<id>/testbed: the base tree (or the clean tree), committed; for an r2e- id also
        DIR/<id>/r2e_tests and testbed/run_tests.sh
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from agentrl.envs.swe import r2e_rows, swesmith_rows
from agentrl.envs.swe.env import SHIPPED_INSTANCES
from agentrl.envs.swe.instances import SWEInstance, load_instances
from agentrl.envs.swe.projects import TESTBED_BUILD_COMMAND, Project, load_projects, project_of
from agentrl.envs.swe.repo import build_base_tree, build_environment_tree
from agentrl.envs.swe.row_formats import swebench_image

TESTBED = "/testbed"
"""Where an official SWE-bench image holds the repository (the harness' working directory)."""


@dataclass(frozen=True)
class SWEBenchImage:
    """One instance's image in SWE-bench's layout, and what it is built from."""

    instance: SWEInstance
    project: Project

    @property
    def name(self) -> str:
        """The image, by SWE-bench's naming rule (local, no namespace)."""
        return swebench_image(self.instance.instance_id)

    @property
    def build_command(self) -> str:
        """The command that builds every shipped instance's image (as root with Podman)."""
        return TESTBED_BUILD_COMMAND


def swebench_images(instances: Sequence[SWEInstance]) -> list[SWEBenchImage]:
    """The image of each instance, with its project (from the shipped project files)."""
    projects = load_projects()
    return [SWEBenchImage(instance, project_of(instance, projects)) for instance in instances]


@dataclass(frozen=True)
class SWESmithImage:
    """One project's image in SWE-smith's layout: its clean tree at ``/testbed``."""

    instance: SWEInstance
    """Any instance of the project (they share the clean tree)."""
    project: Project

    @property
    def name(self) -> str:
        return swesmith_rows.image_name(self.instance)

    @property
    def key(self) -> str:
        """Its build context's name (and ``agentrl.swe.instance`` label)."""
        return f"swesmith-{self.project.spec.name}-{self.project.spec.version}"


def swesmith_images(images: Sequence[SWEBenchImage]) -> list[SWESmithImage]:
    """One image per project of ``images`` (the instances' SWE-bench-layout images)."""
    by_project: dict[str, SWESmithImage] = {}
    for image in images:
        key = str(image.project.path)
        by_project.setdefault(key, SWESmithImage(image.instance, image.project))
    return list(by_project.values())


def write_swesmith_context(image: SWESmithImage, dest: str | Path) -> Path:
    """Write ``image``'s build context into ``dest`` (created): ``dest/testbed``, the clean tree
    committed; raises RuntimeError when its commit is not ``environment_setup_commit``."""
    dest = Path(dest)
    dest.mkdir(parents=True)
    sha = build_environment_tree(image.project.sdist, dest / "testbed")
    if sha != image.instance.environment_setup_commit:
        raise RuntimeError(
            f"{image.key}: the clean tree is commit {sha}, "
            f"not environment_setup_commit {image.instance.environment_setup_commit}"
        )
    return dest


def write_context(image: SWEBenchImage, dest: str | Path) -> Path:
    """Write ``image``'s build context into ``dest`` (created): ``dest/testbed``, the base tree
    committed; raises RuntimeError when its commit is not ``base_commit``. Returns ``dest``."""
    dest = Path(dest)
    dest.mkdir(parents=True)
    sha = build_base_tree(image.project.sdist, image.instance, dest / "testbed")
    if sha != image.instance.base_commit:
        raise RuntimeError(
            f"{image.instance.instance_id}: the rebuilt base tree is commit {sha}, "
            f"not base_commit {image.instance.base_commit}"
        )
    return dest


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m agentrl.envs.swe.testbed",
        description="Images of SWE instances in SWE-bench's layout: list them, write contexts.",
    )
    parser.add_argument("--instances", default=str(SHIPPED_INSTANCES), help="instances file")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("list", help="image, project image, base_commit, instance_id per line")
    context = commands.add_parser("context", help="write DIR/<instance_id>/testbed")
    context.add_argument("dir")
    context.add_argument("instance_ids", nargs="+")
    args = parser.parse_args(argv)

    instances = load_instances(args.instances)
    images = swebench_images(instances)
    smiths = swesmith_images(images)
    r2es = r2e_rows.r2e_commits(instances)
    if args.command == "list":
        for image in images:
            print(
                image.name,
                image.project.image,
                image.instance.base_commit,
                image.instance.instance_id,
                "swe-testbed",
            )
        for smith in smiths:
            setup_commit = smith.instance.environment_setup_commit
            print(smith.name, smith.project.image, setup_commit, smith.key, "swe-testbed")
        for r2e in r2es:
            print(r2e.image, r2e.project.image, r2e.instance.base_commit, r2e.key, "swe-r2e")
        return
    by_id = {image.instance.instance_id: image for image in images}
    by_key = {smith.key: smith for smith in smiths}
    by_r2e = {r2e.key: r2e for r2e in r2es}
    unknown = sorted(set(args.instance_ids) - set(by_id) - set(by_key) - set(by_r2e))
    if unknown:
        parser.error(f"no such instance in {args.instances}: {', '.join(unknown)}")
    for key in args.instance_ids:
        if key in by_key:
            write_swesmith_context(by_key[key], Path(args.dir) / key)
        elif key in by_r2e:
            r2e_rows.write_context(by_r2e[key], Path(args.dir) / key)
        else:
            write_context(by_id[key], Path(args.dir) / key)


if __name__ == "__main__":
    main()
