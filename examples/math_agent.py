"""A plain `openai`-SDK agent with a calculator tool, trained on Math-v0's problems by
`agentrl train examples/math_agent_grpo_cpu.yaml` (agent.entry: examples/math_agent.py:solve).

Nothing in it knows about agentrl: it gets a task (the problem as chat messages) and an
`openai.AsyncOpenAI` client, loops over tool calls, and returns its final answer, which Math-v0's
verifier grades. Point the client anywhere OpenAI-compatible and it runs the same.
"""

import ast
import json
import operator

import openai

CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculate",
        "description": "Evaluate an arithmetic expression, e.g. 12 * (3 + 4).",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}
OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
             ast.Div: operator.truediv, ast.USub: operator.neg}  # fmt: skip


def calculate(expression: str) -> str:
    """+ - * / and parentheses over numbers; anything else is an error message for the model."""

    def value(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
            return OPERATORS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in OPERATORS:
            return OPERATORS[type(node.op)](value(node.operand))
        raise ValueError("only numbers, + - * / and parentheses")

    try:
        return str(value(ast.parse(expression, mode="eval").body))
    except (SyntaxError, ValueError, ZeroDivisionError) as exc:
        return f"error: {exc}"


async def solve(task, client: openai.AsyncOpenAI, max_turns: int = 3) -> str:
    """Ask, run the calculator for each tool call, ask again; the last reply is the answer."""
    messages = list(task.messages)
    for _ in range(max_turns):
        response = await client.chat.completions.create(
            model=task.model, messages=messages, tools=[CALCULATOR], max_tokens=96
        )
        reply = response.choices[0].message
        messages.append(reply.model_dump(exclude_none=True))
        if not reply.tool_calls:
            return reply.content or ""
        for call in reply.tool_calls:
            try:
                expression = str(json.loads(call.function.arguments).get("expression", ""))
            except (ValueError, AttributeError):
                expression = call.function.arguments
            messages.append(
                {"role": "tool", "tool_call_id": call.id, "content": calculate(expression)}
            )
    return ""
