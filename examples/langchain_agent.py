"""A LangChain agent with one tool, on vLLM in this process.

    python examples/langchain_agent.py                               # scripted tool-calling model
    python examples/langchain_agent.py --model Qwen/Qwen2.5-1.5B-Instruct

The default model is the scripted ``chatml_tools`` model (Qwen2.5 chat format, built locally):
it calls ``get_weather`` for Oslo, then answers from the tool's result. ``ChatVLLM`` picks the
``hermes`` tool parser for ChatML models and ``llama3_json`` for Llama 3; set ``tool_parser=``
for other families.
"""

from __future__ import annotations

import argparse

from langchain.agents import create_agent
from langchain_core.tools import tool

from vllm_inline.commands.console import resolve_model
from vllm_inline.integrations.langchain import ChatVLLM


@tool
def get_weather(city: str) -> str:
    """Get the current weather in a given city."""
    return f"It is sunny in {city}."


def main(model: str | None = None, question: str = "What is the weather in Oslo?") -> list:
    llm = ChatVLLM(
        model=resolve_model(model, scenario="chatml_tools"),
        max_tokens=256,
    )
    agent = create_agent(llm, tools=[get_weather], system_prompt="You are a helpful assistant.")

    messages = []
    # stream_mode="values": the whole message list after each step (model call, tool run).
    for state in agent.stream({"messages": [("user", question)]}, stream_mode="values"):
        messages = state["messages"]
        messages[-1].pretty_print()
    return messages


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model", help="hub id or local path (default: scripted tool-calling model)"
    )
    parser.add_argument("--question", default="What is the weather in Oslo?")
    args = parser.parse_args()
    main(args.model, args.question)
