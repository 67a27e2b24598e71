"""``python -m vllm_inline demo``: stream one answer token by token from the embedded scripted
model (built locally, no download) or from ``--model``, through the engine, then LangChain and
LlamaIndex on the same engine."""

from __future__ import annotations

import argparse

from vllm_inline.commands.console import (
    add_model_arguments,
    demo_sampling,
    start_engine,
    stream_answer,
)

__all__ = ["DEMO_MAX_TOKENS", "DEMO_QUESTION", "add_arguments", "demo", "run"]

DEMO_QUESTION = "What does vllm-inline do?"
DEMO_MAX_TOKENS = 128


add_arguments = add_model_arguments
"""The command's arguments: ``--model`` and ``--verbose``."""


def run(args: argparse.Namespace) -> int:
    """Run the command."""
    return demo(args.model)


def demo(model: str | None) -> int:
    """Stream one answer from the engine, then the same through LangChain and LlamaIndex."""
    engine = start_engine(model)
    sampling, line = demo_sampling(engine.model_defaults)
    print(line, flush=True)
    messages = [{"role": "user", "content": DEMO_QUESTION}]
    print(f"\n== vllm_inline.engine: {DEMO_QUESTION}")
    stream_answer(engine, messages, max_tokens=DEMO_MAX_TOKENS, **sampling)
    from vllm_inline.commands import demo_frameworks

    demo_frameworks.run(engine, DEMO_QUESTION, max_tokens=DEMO_MAX_TOKENS, **sampling)
    engine.shutdown()
    return 0
