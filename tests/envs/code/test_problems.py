import ast
import gzip
import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentrl.config import ConfigError
from agentrl.envs.code import assemble_program, extract_code, load_problems
from agentrl.envs.code.harness import decode, encode
from agentrl.envs.code.problems import defines_function

PROBLEMS = load_problems()


def test_loads_the_164_humaneval_problems():
    assert len(PROBLEMS) == 164
    assert PROBLEMS[0].task_id == "HumanEval/0"
    assert PROBLEMS[0].entry_point == "has_close_elements"


def test_selection_by_id_and_index_keeps_its_order():
    chosen = load_problems(selection=["HumanEval/7", 3])
    assert [p.task_id for p in chosen] == ["HumanEval/7", "HumanEval/3"]


@pytest.mark.parametrize("key", ["HumanEval/999", "Humaneval/1", 164, -1])
def test_unknown_problem_is_a_config_error_naming_it(key):
    with pytest.raises(ConfigError, match=repr(key).replace("/", ".")):
        load_problems(selection=[key])


def test_loads_a_humaneval_format_file(tmp_path):
    row = {
        "task_id": "Mine/0",
        "prompt": "def one():\n    '''Return 1.'''\n",
        "entry_point": "one",
        "canonical_solution": "    return 1\n",
        "test": "def check(candidate):\n    assert candidate() == 1\n",
    }
    path = tmp_path / "mine.jsonl.gz"
    with gzip.open(path, "wt") as handle:
        handle.write(json.dumps(row) + "\n")
    (problem,) = load_problems(path)
    assert problem.task_id == "Mine/0" and problem.test == row["test"]
    with pytest.raises(ConfigError, match="not found"):
        load_problems(tmp_path / "missing.jsonl")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("```python\nx = 1\n```", "x = 1\n"),
        ("```py\nx = 1\n```\nthen\n```\ny = 2\n```", "y = 2\n"),  # the last block counts
        ("```python\nx = 1\n```\n```text\nnot code\n```", "x = 1\n"),  # other languages do not
        ("  ```python\n      return 1\n  ```", "return 1\n"),  # dedented
        ("```python\nx = 1\n```\n```python\ncut off", "x = 1\n"),  # unclosed: ignored
        ("```python\n\n```", None),
        ("no code here", None),
        ("inline ```python x``` is not a block", None),
    ],
)
def test_extract_code(text, expected):
    assert extract_code(text) == expected


def test_the_last_block_defining_the_function_wins_over_a_later_example():
    text = "```python\ndef f(x):\n    return x\n```\nUsage:\n```python\nprint(f(1))\n```"
    assert extract_code(text, "f") == "def f(x):\n    return x\n"
    assert extract_code(text, "g") == extract_code(text) == "print(f(1))\n"


def test_whole_function_follows_the_prompt_and_a_body_completes_it():
    problem = PROBLEMS[2]  # truncate_number(number: float) -> float
    whole = "def truncate_number(number):\n    return number % 1.0\n"
    program = assemble_program(problem, whole)
    assert program.startswith(problem.prompt.rstrip()) and program.endswith(whole)
    assert assemble_program(problem, "return number % 1.0\n").endswith(
        "\n    return number % 1.0\n"
    )
    assert assemble_program(problem, "    return 0.5\n") == problem.prompt + "    return 0.5\n"


def test_defines_function_even_when_the_code_does_not_parse():
    assert defines_function("import math\ndef f(x):\n    return x\n", "f")
    assert not defines_function("def g():\n    def f(): pass\n", "f")  # nested: a body
    assert defines_function("def f(x):\n    return (\n", "f")
    assert not defines_function("    return f(\n", "f")


@pytest.mark.parametrize("problem", PROBLEMS, ids=lambda p: p.task_id)
def test_every_canonical_solution_in_a_fence_assembles_to_prompt_plus_solution(problem):
    """What a model replying with the canonical body gets graded on is HumanEval's program."""
    program = assemble_program(problem, extract_code(f"```python\n{problem.canonical_solution}```"))
    expected = problem.prompt + problem.canonical_solution
    assert ast.dump(ast.parse(program)) == ast.dump(ast.parse(expected))


builtin_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text()
    | st.binary()
    | st.complex_numbers(),
    lambda children: (
        st.lists(children, max_size=4)
        | st.lists(children, max_size=4).map(tuple)
        | st.dictionaries(st.text(max_size=3) | st.integers(), children, max_size=4)
        | st.frozensets(st.integers() | st.text(max_size=3), max_size=4)
        | st.sets(st.integers() | st.text(max_size=3), max_size=4)
    ),
    max_leaves=20,
)


def _same(a, b):
    """Equal, of the same types all the way down (NaN equal to NaN)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, complex):
        return _same(a.real, b.real) and _same(a.imag, b.imag)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b


@given(builtin_values)
def test_values_cross_the_pipe_unchanged(value):
    assert _same(decode(json.loads(json.dumps(encode(value)))), value)


def test_only_plain_builtins_come_out_of_decode():
    class AlwaysEqual(int):
        def __eq__(self, other):
            return True

        __hash__ = int.__hash__

    crossed = decode(json.loads(json.dumps(encode([AlwaysEqual(3), (AlwaysEqual(4),)]))))
    assert crossed == [3, (4,)] and type(crossed[0]) is int and crossed[0] != 5
    with pytest.raises(TypeError, match="cannot be passed"):
        encode(object())
    with pytest.raises(ValueError, match="malformed"):
        decode({"eval": "__import__('os')"})
