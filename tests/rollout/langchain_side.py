"""LangChain's side of the agent tests; runs in ``.venv-langchain`` (langchain-openai 1.7.4,
made by scripts/setup-langchain-env), never in the project's venv.

An agent as LangChain users write one: ``ChatOpenAI(...).bind_tools([add])``, a loop that runs each
``AIMessage.tool_calls`` entry and answers it with a ``ToolMessage``, until a reply calls no tool.
Reads ``{"base_url", "model", "messages"}`` (OpenAI-format messages) as JSON on stdin; prints
``{"answer", "calls", "tool_calls", "tool_results"}``.
"""

import json
import sys

from langchain_core.messages import ToolMessage, convert_to_messages
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def main() -> None:
    request = json.load(sys.stdin)
    llm = ChatOpenAI(
        base_url=request["base_url"],
        api_key="agentrl",
        model=request["model"],
        max_tokens=64,
        max_retries=0,
    )
    agent = llm.bind_tools([add])
    messages = convert_to_messages(request["messages"])
    calls, results = 0, []
    for _ in range(3):
        reply = agent.invoke(messages)
        calls += 1
        messages.append(reply)
        if not reply.tool_calls:
            break
        for call in reply.tool_calls:
            try:
                result = str(add.invoke(call["args"]))
            except Exception as exc:  # bad arguments go back to the model, as agents do
                result = f"error: {exc}"
            results.append(result)
            messages.append(ToolMessage(result, tool_call_id=call["id"]))
    answer = reply.content if isinstance(reply.content, str) else ""
    print(
        json.dumps(
            {"answer": answer, "calls": calls, "tool_calls": len(results), "tool_results": results}
        )
    )


if __name__ == "__main__":
    main()
