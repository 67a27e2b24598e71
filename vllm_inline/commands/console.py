"""What the interactive commands share (``demo``, ``chat``, ``check``): the model they run (the
embedded scripted one by default), a spinner while the engine starts, an answer streamed to the
terminal, and the sampling the demo asks for."""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from vllm_inline.testing import build_scripted_model

if TYPE_CHECKING:
    from typing_extensions import Self

    from vllm_inline.engine import Engine

__all__ = [
    "Spinner",
    "add_model_arguments",
    "demo_sampling",
    "resolve_model",
    "start_engine",
    "stream_answer",
]

_SHAPING = ("temperature", "top_p", "top_k", "min_p")
"""generation_config.json values that shape the sampling distribution."""


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """``--model`` and ``--verbose``: the arguments of ``demo`` and ``chat``."""
    parser.add_argument(
        "--model",
        default=os.environ.get("MODEL") or None,
        help="hub id or local path (default: $MODEL, else the embedded scripted model)",
    )
    parser.add_argument(
        "--verbose", action="store_true", help="show vLLM's own logs (INFO and warnings)"
    )


def resolve_model(model: str | None, scenario: str = "demo") -> str:
    """``model`` itself, or the path of a scripted model (built locally on first use, under a
    second, no download): by default the embedded demo model."""
    if model:
        return model
    return str(build_scripted_model(scenario))


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

    def __enter__(self) -> Self:
        if sys.stderr.isatty():
            self._thread.start()
        else:
            sys.stderr.write(self._message + "...\n")
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        if self._thread.is_alive():
            self._thread.join()


def start_engine(model: str | None) -> Engine:
    """The engine of ``model`` (the demo model by default), started behind a spinner, and a
    line saying what it chose."""
    from vllm_inline.engine import get_engine

    with Spinner(f"Starting vLLM and loading {model or 'the embedded demo model'}"):
        # No options: on a CPU the engine itself picks dtype, KV-cache size and eager mode.
        engine = get_engine(resolve_model(model))
        engine.start()
    policy = engine.stop_policy
    print(
        f"Engine ready: {model or 'embedded demo model (scripted, built locally)'}; "
        f"chat template: {policy.template_source}; stop tokens: {', '.join(policy.stop_tokens)}; "
        f"engine options chosen: {engine.platform_defaults and engine.platform_defaults.summary()}",
        flush=True,
    )
    return engine


def stream_answer(engine: Engine, messages: list[dict[str, Any]], **sampling: Any) -> str:
    """Print the answer to ``messages`` as it streams, then its finish line; return it."""
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


def demo_sampling(model_defaults: Mapping[str, Any]) -> tuple[dict[str, Any], str]:
    """What the demo asks for on top of the engine's defaults, and a line that says so.

    ``model_defaults`` are the sampling values of the model's ``generation_config.json``. When
    it sets none of those that shape the distribution, vLLM samples at temperature 1.0, where a
    small model rambles: the demo then decodes greedily instead.
    """
    own = {key: model_defaults[key] for key in _SHAPING if key in model_defaults}
    if own:
        shown = ", ".join(f"{key}={value}" for key, value in own.items())
        return {}, f"Sampling: {shown} (the model's generation_config.json)"
    return {"temperature": 0.0}, (
        "Sampling: greedy, temperature=0 (the model's generation_config.json sets no "
        "temperature, top_p, top_k or min_p; vLLM's default would be temperature=1.0)"
    )
