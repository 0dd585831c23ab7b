"""SWE-bench 5 rows of the shipped instances: SWE-bench's own code reads them as it reads its
datasets (``make_test_spec``), the names and markers are SWE-bench's, and the eval script resets,
applies and runs what it should. The harness running them is test_swebench_harness.py."""

from __future__ import annotations

import json

import pytest
from swebench.harness import constants
from swebench.harness.log_parsers import PARSER_REGISTRY
from swebench.harness.utils import make_test_spec

from agentrl.envs.swe import load_instances
from agentrl.envs.swe.env import SHIPPED_INSTANCES
from agentrl.envs.swe.row_formats import swebench_image
from agentrl.envs.swe.swebench_rows import (
    END_TEST_OUTPUT,
    EVAL_TYPE,
    LOG_PARSER,
    START_TEST_OUTPUT,
    files_to_run,
    main,
    swebench_row,
    write_rows,
)
from agentrl.envs.swe.testbed import swebench_images

INSTANCES = load_instances(SHIPPED_INSTANCES)
IMAGES = {image.instance.instance_id: image for image in swebench_images(INSTANCES)}
SWEBENCH_COLUMNS = [
    "repo",
    "instance_id",
    "base_commit",
    "patch",
    "test_patch",
    "problem_statement",
    "hints_text",
    "created_at",
    "version",
    "FAIL_TO_PASS",
    "PASS_TO_PASS",
    "environment_setup_commit",
]


def test_names_and_markers_are_swebench_own():
    assert START_TEST_OUTPUT == constants.START_TEST_OUTPUT
    assert END_TEST_OUTPUT == constants.END_TEST_OUTPUT
    assert constants.EvalType(EVAL_TYPE) is constants.EvalType.PASS_AND_FAIL
    assert LOG_PARSER in PARSER_REGISTRY


@pytest.mark.parametrize(
    ("namespace", "expected"),
    [
        (None, "sweb.eval.x86_64.toolz__1.2.0-1:latest"),
        ("SWEbench", "swebench/sweb.eval.x86_64.toolz_1776_1.2.0-1:latest"),
    ],
)
def test_image_names_follow_swebench_rule(namespace, expected):
    from swebench.image_builder.image_spec import ImageSpec

    assert swebench_image("toolz__1.2.0-1", namespace=namespace) == expected
    spec = ImageSpec(instance_id="toolz__1.2.0-1", dockerfile="FROM x", namespace=namespace)
    assert spec.name == expected


@pytest.mark.parametrize("instance_id", sorted(IMAGES))
def test_every_row_is_a_test_spec_for_swebench(instance_id):
    image = IMAGES[instance_id]
    row = swebench_row(image)
    assert set(SWEBENCH_COLUMNS) <= set(row)
    spec = make_test_spec(json.loads(json.dumps(row)))
    assert spec.image == image.name == f"sweb.eval.x86_64.{instance_id.lower()}:latest"
    assert (spec.log_parser, spec.eval_type) == (LOG_PARSER, EVAL_TYPE)
    assert all(" " not in test for test in spec.FAIL_TO_PASS + spec.PASS_TO_PASS)
    script = spec.eval_script_list
    # SWE-bench records the test command's exit status right after it, before the end marker.
    end = next(i for i, line in enumerate(script) if END_TEST_OUTPUT in line)
    assert script[end - 1] == f"{constants.TEST_EXIT_CODE_VAR}=$?"
    command = script[end - 2]
    assert command.startswith(image.project.spec.test_command + " ")
    assert set(command.split()[len(image.project.spec.test_command.split()) :]) == set(
        files_to_run(image.instance)
    )
    # Every test file the tests live in runs: a test absent from the output counts as failed.
    assert {t.split("::")[0] for t in spec.FAIL_TO_PASS + spec.PASS_TO_PASS} <= set(
        files_to_run(image.instance)
    )
    text = row["eval_script"]
    assert text.startswith("#!/bin/bash\nset -uxo pipefail\ncd /testbed\n")
    assert image.instance.test_patch in text
    added = image.instance.agentrl_taskgen.hidden_tests
    assert text.count(f"rm -f {' '.join(added)}\n") == 2  # before test_patch and at the end
    assert text.index(f"rm -f {' '.join(added)}") < text.index("git apply -v -")
    assert text.index("git apply -v -") < text.index(START_TEST_OUTPUT)


def test_the_cli_writes_the_rows_it_is_asked_for(tmp_path):
    main([str(tmp_path / "two.jsonl"), "toolz__1.2.0-1", "tabulate__0.10.0-2"])
    rows = [json.loads(line) for line in (tmp_path / "two.jsonl").read_text().splitlines()]
    assert [row["instance_id"] for row in rows] == ["toolz__1.2.0-1", "tabulate__0.10.0-2"]
    assert write_rows(INSTANCES[:1], tmp_path / "one.jsonl")[0]["image"] == (
        "sweb.eval.x86_64.inflection__0.5.1-1:latest"
    )
    with pytest.raises(SystemExit):
        main([str(tmp_path / "none.jsonl"), "no-such-instance"])
