"""``python -m vllm_inline run APP --workers N``: your ASGI app in N worker processes on one
engine per model (:mod:`vllm_inline.workers`)."""

from __future__ import annotations

import argparse
import os
import sys

from vllm_inline.commands.serve import worker_count

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``run`` command's arguments."""
    parser.add_argument("app", help="the app as uvicorn takes it: module:attribute")
    parser.add_argument("--workers", type=worker_count, required=True, help="worker processes")
    parser.add_argument(
        "--factory", action="store_true", help="app is a function returning the app"
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument(
        "--graceful-timeout", type=float, default=30.0, help="seconds a worker drains on SIGTERM"
    )
    parser.add_argument(
        "--verbose", action="store_true", help="show vLLM's own logs (INFO and warnings)"
    )


def run(args: argparse.Namespace) -> int:
    """Run the command."""
    from vllm_inline.workers import run as run_workers

    sys.path.insert(0, os.getcwd())  # as uvicorn does: the app's module from here
    return run_workers(
        args.app,
        workers=args.workers,
        host=args.host,
        port=args.port,
        factory=args.factory,
        graceful_timeout=args.graceful_timeout,
    )
