"""An LCEL chain streaming its answer to stdout, token by token.

python examples/lcel_stream.py                           # embedded scripted model
python examples/lcel_stream.py --model Qwen/Qwen3-0.6B   # a real model
"""

from __future__ import annotations

import argparse

from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate

from vllm_inline.commands.console import resolve_model
from vllm_inline.integrations.langchain import ChatVLLM


def main(model: str | None = None, question: str = "What does vllm-inline do?") -> str:
    # resolve_model(None) builds the embedded demo model. No engine options are needed: on a
    # CPU the engine picks dtype, KV-cache size and eager mode; any vllm_kwargs you pass win.
    llm = ChatVLLM(
        model=resolve_model(model),
        temperature=0.7,
        max_tokens=256,
    )
    prompt = ChatPromptTemplate.from_messages(
        [("system", "You are a concise assistant."), ("human", "{question}")]
    )
    chain = prompt | llm | StrOutputParser()

    pieces = []
    for piece in chain.stream({"question": question}):
        print(piece, end="", flush=True)
        pieces.append(piece)
    print()
    return "".join(pieces)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="hub id or local path (default: embedded demo model)")
    parser.add_argument("--question", default="What does vllm-inline do?")
    args = parser.parse_args()
    main(args.model, args.question)
