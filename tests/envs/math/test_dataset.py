import json
import subprocess
import sys

import datasets
import pytest

from agentrl.envs.math import generate_problems, last_boxed, read_dataset, to_problems
from agentrl.envs.math.dataset import gsm8k_answer

GSM8K_ROWS = [
    {"question": "Tom has 3 apples and buys 4. How many?", "answer": "3 + 4 = 7\n#### 7"},
    {"question": "What is 1000 + 234?", "answer": "It is 1,234.\n#### 1,234"},
]
MATH_ROWS = [
    {
        "problem": "Compute $1/2 + 1/4$.",
        "solution": "We get $\\boxed{\\frac{3}{4}}$.",
        "level": "Level 1",
    },
    {"problem": "Solve $x^2=4$, $x>0$.", "solution": "So $x = \\boxed{2}$ since", "answer": "2"},
]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_gsm8k_jsonl(tmp_path):
    problems = to_problems(read_dataset(write_jsonl(tmp_path / "g.jsonl", GSM8K_ROWS)))
    assert [p.answer for p in problems] == ["7", "1234"]
    assert problems[0].question.startswith("Tom")


def test_math_parquet_uses_answer_column_or_last_boxed(tmp_path):
    path = tmp_path / "m.parquet"
    datasets.Dataset.from_list(MATH_ROWS).to_parquet(str(path))
    problems = to_problems(read_dataset(path))
    assert [p.answer for p in problems] == ["\\frac{3}{4}", "2"]


def test_column_mapping_and_datasetdict(tmp_path):
    ds = datasets.DatasetDict(
        {"test": datasets.Dataset.from_list([{"prompt": "2+2?", "target": "4", "uid": "a"}])}
    )
    problems = to_problems(
        read_dataset(ds, split="test"), columns={"question": "prompt", "answer": "target"}
    )
    assert (problems[0].question, problems[0].answer) == ("2+2?", "4")


def test_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="not found"):
        read_dataset(tmp_path / "missing.jsonl")
    with pytest.raises(ValueError, match="unsupported dataset file type"):
        (tmp_path / "x.txt").write_text("hi")
        read_dataset(tmp_path / "x.txt")
    odd = datasets.Dataset.from_list([{"q": "1", "a": "2"}])
    with pytest.raises(ValueError, match="cannot tell the dataset format"):
        to_problems(odd)
    with pytest.raises(ValueError, match="not in the dataset"):
        to_problems(odd, columns={"question": "nope", "answer": "a"})
    with pytest.raises(ValueError, match="####"):
        gsm8k_answer("no marker")


def test_a_dataset_of_another_type_is_refused_clearly():
    import gymnasium

    import agentrl  # noqa: F401  (registers environments)

    with pytest.raises(
        ValueError, match=r"a file path or a datasets\.Dataset / DatasetDict, got list"
    ):
        gymnasium.make("agentrl/Math-v0", dataset=[{"question": "1+1?", "answer": "2"}])
    ds = datasets.Dataset.from_list([{"question": "1+1?", "answer": "2"}])
    env = gymnasium.make("agentrl/Math-v0", dataset=ds, dataset_format="plain")
    assert env.unwrapped.problems[0].answer == "2"


def test_the_generated_set_does_not_load_datasets():
    """``datasets`` and pyarrow hold about 80 MB resident: a training process on the generated
    set (the demo's) does not import them."""
    probe = (
        "import sys, gymnasium, agentrl\n"
        "gymnasium.make('agentrl/Math-v0', mode='multi', generated_difficulty=2).reset(seed=0)\n"
        "print('datasets' in sys.modules, 'pyarrow' in sys.modules)"
    )
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["False", "False"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("\\boxed{4}", "4"),
        ("a \\boxed{1} then \\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("\\boxed{{a}{b}}", "{a}{b}"),
        ("\\fbox{7}", "7"),
        ("\\boxed{unterminated", None),
        ("nothing", None),
    ],
)
def test_last_boxed(text, expected):
    assert last_boxed(text) == expected


def test_generated_set_is_deterministic_and_consistent():
    a, b = generate_problems(50, seed=1, difficulty=2), generate_problems(50, seed=1, difficulty=2)
    assert a == b and a != generate_problems(50, seed=2, difficulty=2)
    for p in generate_problems(200, seed=0, difficulty=1):
        numbers = [int(w.strip(".")) for w in p.question.split() if w.strip(".").isdigit()]
        start, n = numbers[0], numbers[1]
        if "more" in p.question:
            assert int(p.answer) == start + n
        elif "gives away" in p.question:
            assert int(p.answer) == start - n
        else:
            assert int(p.answer) == start * n
