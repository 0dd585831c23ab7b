"""examples/math_agent.py stays a few dozen lines of plain openai-SDK code, and its calculator
answers arithmetic and refuses anything else (test_examples.py trains it for a step)."""

import importlib.util
from pathlib import Path

EXAMPLE = Path(__file__).parents[2] / "examples" / "math_agent.py"


def load():
    spec = importlib.util.spec_from_file_location("math_agent", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_agent_is_plain_openai_code_of_a_few_dozen_lines():
    source = EXAMPLE.read_text()
    assert len(source.splitlines()) <= 80
    assert "agentrl" not in source.split('"""', 2)[2]  # nothing of agentrl past the docstring


def test_the_calculator_answers_arithmetic_and_refuses_the_rest():
    calculate = load().calculate
    assert calculate("12 * (3 + 4)") == "84"
    assert calculate("-6 / 4") == "-1.5"
    assert calculate("2 ** 64").startswith("error")
    assert calculate("__import__('os')").startswith("error")
    assert calculate("1 / 0").startswith("error")
    assert calculate("1 +").startswith("error")
