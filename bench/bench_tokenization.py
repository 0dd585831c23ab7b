"""Delta tokenization vs re-rendering and re-encoding the whole conversation at every turn.

One simulated tool-using episode per length (8, 32, 128 turns): each turn the engine emits an
assistant message (reasoning plus a Hermes tool call, ~70 tokens) and the environment answers with
a tool result (~90 tokens). Both sides get the same engine output as token ids.

* **baseline** (what many frameworks do): before every generation, render the whole conversation
  with the chat template and encode it (``apply_chat_template(..., tokenize=True)``).
* **agentrl**: :class:`~agentrl.tokenization.TrajectoryBuilder` appends the engine's ids and the
  delta ids of each tool result (rendered after a fixed base conversation).

Prints the time per episode of each (best of ``--repeats``), their ratio (target >= 10x at 32 turns)
and whether both fed the engine the same ids at every turn.

    python -m bench.bench_tokenization [--repeats 3] [--template smollm2|tool_role_eom|...]
"""

from __future__ import annotations

import argparse
import json
import random
import time

from agentrl.models import load_tokenizer
from agentrl.tokenization import ChatFormat, TrajectoryBuilder, builtin_template

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the local corpus and return the best passages.",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}, "k": {"type": "integer"}},
                "required": ["query"],
            },
        },
    }
]
WORDS = [
    "the",
    "of",
    "retrieval",
    "passage",
    "tool",
    "answer",
    "model",
    "token",
    "search",
    "France",
]


def episode(turns: int, seed: int = 0) -> tuple[list[dict], list[tuple[str, dict]]]:
    """Reset messages and ``turns`` pairs of (assistant text, tool message)."""
    rng = random.Random(seed)

    def words(n: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(n))

    reset = [
        {"role": "system", "content": "You are a research agent. " + words(30)},
        {"role": "user", "content": "Question: " + words(20) + "?"},
    ]
    steps = []
    for _ in range(turns):
        call = json.dumps({"name": "search", "arguments": {"query": words(6), "k": 3}})
        assistant = f"<think>\n{words(30)}\n</think>\n\n<tool_call>\n{call}\n</tool_call>"
        steps.append((assistant, {"role": "tool", "name": "search", "content": words(80)}))
    return reset, steps


def run_baseline(tokenizer, template, reset, steps) -> list[list[int]]:
    conversation, fed = list(reset), []
    for assistant, tool in steps:
        fed.append(
            tokenizer.apply_chat_template(
                conversation,
                tools=TOOLS,
                chat_template=template,
                add_generation_prompt=True,
                tokenize=True,
                return_dict=False,
            )
        )
        conversation += [{"role": "assistant", "content": assistant}, tool]
    return fed


def run_delta(fmt: ChatFormat, reset, steps, outputs: list[list[int]]) -> list[list[int]]:
    builder, fed = TrajectoryBuilder(fmt, reset, TOOLS), []
    for (_, tool), ids in zip(steps, outputs, strict=True):
        fed.append(builder.prompt_ids())
        builder.add_completion(ids, [0.0] * len(ids), version=0)
        builder.add_messages([tool])
    return fed


def best_of(repeats: int, fn, *args) -> tuple[float, list[list[int]]]:
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn(*args)
        times.append(time.perf_counter() - start)
    return min(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--template", default="smollm2", help="smollm2 or a built-in template")
    parser.add_argument("--turns", type=int, nargs="+", default=[8, 32, 128])
    args = parser.parse_args()

    tokenizer = load_tokenizer("smollm2")
    template = None if args.template == "smollm2" else builtin_template(args.template)
    fmt = ChatFormat.of(tokenizer, template)
    print(
        f"template: {args.template}; best of {args.repeats}; end-of-turn ids {set(fmt.end_of_turn_ids)}"
    )
    print(
        f"{'turns':>5} {'final ids':>9} {'baseline ms':>12} {'agentrl ms':>11} {'ratio':>7}  same ids"
    )
    for turns in args.turns:
        reset, steps = episode(turns)
        # The engine's output, as ids (tool-calling turns end with the template's closing id).
        outputs = [[*fmt.encode(text), *fmt.closing_ids(text, TOOLS)] for text, _ in steps]
        base_s, base_fed = best_of(args.repeats, run_baseline, tokenizer, template, reset, steps)
        ours_s, ours_fed = best_of(args.repeats, run_delta, fmt, reset, steps, outputs)
        same = "yes" if [list(x) for x in base_fed] == ours_fed else "NO"
        print(
            f"{turns:>5} {len(ours_fed[-1]):>9} {base_s * 1e3:>12.1f} {ours_s * 1e3:>11.1f} "
            f"{base_s / ours_s:>6.1f}x  {same}"
        )


if __name__ == "__main__":
    main()
