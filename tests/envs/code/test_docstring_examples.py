"""Public tests extracted from HumanEval docstrings (``agentrl.envs.code.examples``).

That the reference solutions pass them is checked in a sandbox in ``test_grading.py``.
"""

import ast

import pytest

from agentrl.envs.code import load_problems
from agentrl.envs.code.examples import CONTRADICTED, PublicTest, public_check, public_tests

PROBLEMS = load_problems()


def assertions(index: int) -> list[str]:
    return [test.assertion for test in PROBLEMS[index].public_tests]


def test_150_of_the_164_problems_have_public_tests():
    without = [i for i, problem in enumerate(PROBLEMS) if not problem.public_tests]
    # no examples (38 41 50 83 160); results that are expressions (67), words (76 "true"), names
    # as arguments (80), another function's name (81 149), inputs in prose or another layout
    # (84 105 115); only examples the reference solution contradicts (116)
    assert without == [38, 41, 50, 67, 76, 80, 81, 83, 84, 105, 115, 116, 149, 160]
    assert sum(len(problem.public_tests) for problem in PROBLEMS) == 425


def test_the_doctest_examples_of_problem_0():
    assert assertions(0) == [
        "assert has_close_elements([1.0, 2.0, 3.0], 0.5) == False",
        "assert has_close_elements([1.0, 2.8, 3.0, 4.0, 5.0, 2.0], 0.3) == True",
    ]


@pytest.mark.parametrize(
    ("index", "assertion"),
    [
        # doctest: no printed result is None; a call inside another; a comment after the call
        (12, "assert longest([]) == None"),
        (32, "assert round(find_zero([1, 2]), 2) == -0.5"),
        # doctest written as the comparison
        (108, "assert count_nums([-1, 11, -11]) == 1"),
        # the prompt's escapes as written, so the call means what the prompt shows
        (51, "assert remove_vowels(\"abcdef\\nghijklm\") == 'bcdf\\nghjklm'"),
        # ==, ➞, =, ==> and "should return" (the full stop is no decimal point)
        (69, "assert search([5, 5, 4, 4, 4]) == -1"),
        (72, "assert will_it_fly([1, 2], 5) == False"),
        (102, "assert choose_num(13, 12) == -1"),
        (121, "assert solution([30, 13, 24, 321]) == 0"),
        (97, "assert multiply(148, 412) == 16"),
        # "# =>" with a remark in parentheses after the value
        (141, "assert file_name_check(\"1example.dll\") == 'No'"),
        # a call over several lines, written on one
        (
            87,
            "assert get_row([[1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 1, 6], [1, 2, 3, 4, 5, 1]], 1) == "
            "[(0, 0), (1, 4), (1, 0), (2, 5), (2, 0)]",
        ),
        # named inputs: Input/Output by name and by position; "For s = ..., the result should be"
        (120, "assert maximum([-3, -4, 5], 3) == [-4, -3, 5]"),
        (68, "assert pluck([4,2,3]) == [2, 1]"),
        (122, "assert add_elements([111,21,3,4000,5,6,7,8,9], 4) == 24"),
        (112, 'assert reverse_delete("abcde", "ae") == (\'bcd\',False)'),
        (94, "assert skjkasdkd([0,8,1,2,1,7]) == 7"),
    ],
)
def test_known_examples(index, assertion):
    assert assertion in assertions(index)


def test_the_counts_of_a_few_problems():
    counts = {i: len(PROBLEMS[i].public_tests) for i in (0, 31, 66, 94, 120, 130, 151, 158)}
    # 130: tri(1) = 3 and tri(4) = 3 are dropped; 151: "== 1 + 9 + 0 + 0 = 10" is no literal;
    # 158: '""aaaaaaa"' does not parse
    assert counts == {0: 2, 31: 7, 66: 6, 94: 6, 120: 3, 130: 1, 151: 3, 158: 2}


def test_contradicted_examples_are_dropped_and_nothing_else():
    for task_id, calls in CONTRADICTED.items():
        problem = next(p for p in PROBLEMS if p.task_id == task_id)
        everything = public_tests("", problem.prompt, problem.entry_point)
        assert {test.call for test in everything} >= calls
        assert [test for test in everything if test.call not in calls] == list(problem.public_tests)


def test_every_public_test_is_one_line_of_python_calling_the_function_on_literals():
    for problem in PROBLEMS:
        for test in problem.public_tests:
            assert "\n" not in test.assertion
            assert isinstance(ast.parse(test.assertion).body[0], ast.Assert)
            ast.literal_eval(test.expected)
            calls = [
                node
                for node in ast.walk(ast.parse(test.call, mode="eval"))
                if isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == problem.entry_point
            ]
            assert calls, test
            for call in calls:
                for argument in call.args:
                    ast.literal_eval(argument)


def prompt(docstring: str, signature: str = "f(x)") -> str:
    return f'def {signature}:\n    """{docstring}\n    """\n'


@pytest.mark.parametrize(
    ("docstring", "expected"),
    [
        (">>> f(1)\n    2", [("f(1)", "2")]),
        (">>> f(1) == 2", [("f(1)", "2")]),
        (">>> g(f(1))\n    2", [("g(f(1))", "2")]),
        (">>> f(1)[0]\n    2", []),  # not a call
        (">>> x = f(1)", []),  # a statement
        (
            "f(1) ==> 2\n    f(2) -> [3]\n    f(4) ➞ 'a'",
            [("f(1)", "2"), ("f(2)", "[3]"), ("f(4)", "'a'")],
        ),
        ("* f(1) => 2.\n    for f(2) = 3,", [("f(1)", "2"), ("f(2)", "3")]),
        (
            "f(1) returns 2;\n    f(2) should return (3, 4) (a pair)",
            [("f(1)", "2"), ("f(2)", "(3, 4)")],
        ),
        ("f(1) returns 2; f(2) returns 3", [("f(2)", "3")]),  # one example a line
        ("f(1)   # returns 'x'", [("f(1)", "'x'")]),
        ("f(')') == 1", [("f(')')", "1")]),  # brackets in strings
        ("f(a) == 1\n    f(1) == b\n    f(1) == 2 + 3\n    f(1) == true", []),
        ("f(1) == 2 is why", []),  # words after the value
        ("f(1) is 2", []),  # no separator
        ("f(1) == 2\n    >>> f(1)\n    2", [("f(1)", "2")]),  # counted once
        ("For x = 3, the output should be 4.", [("f(3)", "4")]),
        ("Input: x = [1, 2]\n    Output: 3 # the sum", [("f([1, 2])", "3")]),
        ("Input: 5\n    Output: 6", [("f(5)", "6")]),
        ("Input: y = 5\n    Output: 6", []),  # not the parameter's name
        ("Input: grid : 5\n    Output: 6", []),
    ],
)
def test_extraction_rules(docstring, expected):
    found = public_tests("Mine/0", prompt(docstring), "f")
    assert [(test.call, test.expected) for test in found] == expected


def test_inputs_by_name_are_passed_in_the_parameters_order():
    text = "For b = 2, a = 1 the result should be 3"
    (test,) = public_tests("Mine/0", prompt(text, "f(a, b)"), "f")
    assert test == PublicTest("f(1, 2)", "3")
    assert public_tests("Mine/0", prompt("For a = 1 the result should be 3", "f(a, b)"), "f") == ()


@pytest.mark.parametrize(
    "source", ["def f(x):\n    return (\n", "def g(x):\n    '''f(1) == 2'''\n", "def f(x): pass\n"]
)
def test_no_docstring_or_no_function_gives_none(source):
    assert public_tests("Mine/0", source, "f") == ()


def test_public_check_is_humaneval_check_code():
    tests = PROBLEMS[0].public_tests
    code = public_check(tests)
    assert code.splitlines() == ["def check(candidate):", *(f"    {t.assertion}" for t in tests)]
    assert public_check(()) == "def check(candidate):\n    pass\n"
