"""``python -m vllm_inline chat``: a multi-turn chat in the terminal, streamed, with a spinner
while the engine starts; an empty line or EOF ends it."""

from __future__ import annotations

import argparse
from typing import Any

from vllm_inline.commands.console import (
    add_model_arguments,
    demo_sampling,
    start_engine,
    stream_answer,
)

__all__ = ["add_arguments", "chat", "run"]


add_arguments = add_model_arguments
"""The command's arguments: ``--model`` and ``--verbose``."""


def run(args: argparse.Namespace) -> int:
    """Run the command."""
    return chat(args.model)


def chat(model: str | None) -> int:
    """An interactive multi-turn chat; an empty line or EOF ends it."""
    engine = start_engine(model)
    sampling, line = demo_sampling(engine.model_defaults)
    print(line, flush=True)
    messages: list[dict[str, Any]] = []
    print("Type a message (empty line to quit).")
    while True:
        try:
            line = input("you> ").strip()
        except EOFError:
            break
        if not line:
            break
        messages.append({"role": "user", "content": line})
        print("assistant> ", end="", flush=True)
        answer = stream_answer(engine, messages, **sampling)
        messages.append({"role": "assistant", "content": answer})
    engine.shutdown()
    return 0
