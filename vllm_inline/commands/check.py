"""``python -m vllm_inline check --model M``: does vllm-inline run ``M`` right? A table and
exit code 0/1 (:mod:`vllm_inline.checks`; docs/models.md)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from vllm_inline.commands.console import Spinner

__all__ = ["add_arguments", "check", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``check`` command's arguments."""
    parser.add_argument(
        "--model",
        default=os.environ.get("MODEL") or None,
        help="hub id or local path (default: $MODEL)",
    )
    parser.add_argument(
        "--tool-parser", help="vLLM tool parser for the tool round trip (default: the family's)"
    )
    parser.add_argument(
        "--max-tokens", type=int, default=48, help="tokens compared with transformers (48)"
    )
    parser.add_argument(
        "--vllm-kwargs",
        type=json.loads,
        default=None,
        help="engine options as JSON, e.g. '{\"max_model_len\": 4096}' (default: none)",
    )
    parser.add_argument(
        "--verbose", action="store_true", help="show vLLM's own logs (INFO and warnings)"
    )


def run(args: argparse.Namespace) -> int:
    """Run the command."""
    return check(args.model, args.vllm_kwargs, args.tool_parser, args.max_tokens)


def check(
    model: str | None, vllm_kwargs: dict[str, Any] | None, tool_parser: str | None, max_tokens: int
) -> int:
    """Run :func:`vllm_inline.checks.run_check`, print its table; 0 when no row failed."""
    if not model:
        print("check needs --model PATH_OR_ID (or MODEL=...)", file=sys.stderr)
        return 2
    from vllm_inline.checks import run_check
    from vllm_inline.engine import shutdown_all

    with Spinner(f"Checking {model} (starts vLLM, then loads it with transformers)"):
        report = run_check(
            model, vllm_kwargs=vllm_kwargs, tool_parser=tool_parser, max_tokens=max_tokens
        )
    print(report.render(), flush=True)
    shutdown_all()
    return 0 if report.passed else 1
