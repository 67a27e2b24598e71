"""``python -m vllm_inline``: the demo and an interactive streaming chat in the terminal.

``demo`` streams an answer token by token from the embedded scripted model (built locally, no
download) or from ``--model``; ``chat`` is a multi-turn chat with a spinner while the engine
starts.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

__all__ = ["main"]

DEMO_QUESTION = "What does vllm-inline do?"


def engine_kwargs_for(model: str | None) -> dict[str, Any]:
    """vLLM options that work on this machine: float32 and a small KV cache on a CPU."""
    import torch

    if torch.cuda.is_available():
        return {"max_model_len": 4096} if model else {"max_model_len": 512}
    # On the CPU bfloat16 kills the worker (SIGILL) and the default memory share fails at start.
    return {
        "dtype": "float32",
        "max_model_len": 512 if model is None else 2048,
        "enforce_eager": True,
        "kv_cache_memory_bytes": (128 if model is None else 1024) * 2**20,
    }


def resolve_model(model: str | None) -> str:
    """``model`` itself, or the path of the embedded demo model (built on first use)."""
    if model:
        return model
    from .scripted import build_scripted_model

    return str(build_scripted_model("demo"))


class Spinner:
    """A one-line progress indicator on stderr while something slow runs."""

    def __init__(self, message: str) -> None:
        self._message = message
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._spin, daemon=True)

    def _spin(self) -> None:
        start = time.monotonic()
        for frame in itertools.cycle("|/-\\"):
            if self._done.wait(0.1):
                break
            sys.stderr.write(f"\r{frame} {self._message} ({time.monotonic() - start:4.1f} s)")
            sys.stderr.flush()
        sys.stderr.write("\r" + " " * (len(self._message) + 16) + "\r")
        sys.stderr.flush()

    def __enter__(self) -> Spinner:
        if sys.stderr.isatty():
            self._thread.start()
        else:
            sys.stderr.write(self._message + "...\n")
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        if self._thread.is_alive():
            self._thread.join()


def _start_engine(model: str | None):
    from .engine import get_engine

    path = resolve_model(model)
    engine = get_engine(path, **engine_kwargs_for(model))
    with Spinner(f"Starting vLLM for {model or 'the embedded demo model'}"):
        engine.start()
    return engine


def _stream_answer(engine, messages: list[dict[str, Any]], **sampling: Any) -> str:
    start = time.perf_counter()
    first: float | None = None
    text = []
    last = None
    for delta in engine.stream(messages, **sampling):
        if first is None and delta.text:
            first = time.perf_counter() - start
        print(delta.text, end="", flush=True)
        text.append(delta.text)
        last = delta
    print()
    if last is not None and last.usage is not None:
        ttft = f"{first * 1000:.0f} ms" if first is not None else "n/a"
        print(
            f"[finish_reason={last.finish_reason} prompt_tokens={last.usage.prompt_tokens} "
            f"completion_tokens={last.usage.completion_tokens} time_to_first_token={ttft}]",
            flush=True,
        )
    return "".join(text)


def demo(model: str | None) -> int:
    """Stream one answer from the engine, then the same through LangChain and LlamaIndex."""
    engine = _start_engine(model)
    messages = [{"role": "user", "content": DEMO_QUESTION}]
    print(f"\n== vllm_inline.engine: {DEMO_QUESTION}")
    _stream_answer(engine, messages, max_tokens=128)
    from . import _demo_frameworks

    _demo_frameworks.run(engine, DEMO_QUESTION)
    engine.shutdown()
    return 0


def chat(model: str | None) -> int:
    """An interactive multi-turn chat; an empty line or EOF ends it."""
    engine = _start_engine(model)
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
        answer = _stream_answer(engine, messages)
        messages.append({"role": "assistant", "content": answer})
    engine.shutdown()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vllm_inline", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, help_text in (("demo", "stream a demo answer"), ("chat", "interactive chat")):
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--model", default=os.environ.get("MODEL") or None,
                       help="hub id or local path (default: the embedded scripted model)")
    args = parser.parse_args(argv)
    return demo(args.model) if args.command == "demo" else chat(args.model)
