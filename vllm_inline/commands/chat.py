"""``python -m vllm_inline chat``: a multi-turn chat in the terminal, streamed, with a spinner
while the engine starts; an empty line or EOF ends it."""

from __future__ import annotations

import argparse
import os
from typing import Any

from vllm_inline.commands.console import demo_sampling, start_engine, stream_answer

__all__ = ["add_arguments", "chat", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``chat`` command's arguments."""
    parser.add_argument(
        "--model",
        default=os.environ.get("MODEL") or None,
        help="hub id or local path (default: $MODEL, else the embedded scripted model)",
    )
    parser.add_argument(
        "--verbose", action="store_true", help="show vLLM's own logs (INFO and warnings)"
    )


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
