"""``vllm serve``'s command line, read with vLLM's own argument parser.

``python -m vllm_inline serve`` takes ``vllm serve``'s options; the launcher imports neither vLLM
nor torch, so it runs this module in a child process (``python -m
vllm_inline.engine.seam.vllm_cli ARG...``), which parses the arguments with ``vllm serve``'s
parser and prints, as JSON, the options given that differ from their defaults: the engine's
(``AsyncEngineArgs`` fields, for ``get_engine``) and the server's. A bad option ends it with
argparse's own message and status 2, as ``vllm serve`` would.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence
from typing import Any

from vllm import AsyncEngineArgs
from vllm.utils.argparse_utils import FlexibleArgumentParser

try:
    from vllm.entrypoints.common.cli_args import (  # type: ignore[import-not-found]
        make_arg_parser,
    )
except ImportError:  # vLLM < 0.33 keeps it with the launchers
    from vllm.entrypoints.launchers.cli_args import make_arg_parser

__all__ = ["ENGINE_FIELDS", "options", "read", "serve_parser"]

ENGINE_FIELDS = frozenset(f.name for f in dataclasses.fields(AsyncEngineArgs))
"""The destinations that are engine options (``AsyncEngineArgs``' fields)."""


def serve_parser() -> argparse.ArgumentParser:
    """``vllm serve``'s argument parser, as its CLI builds it."""
    flexible: Any = FlexibleArgumentParser  # untyped in vLLM
    parser: argparse.ArgumentParser = make_arg_parser(flexible(prog="vllm serve"))
    return parser


def read(argv: Sequence[str]) -> dict[str, dict[str, Any]]:
    """The options ``argv`` gives that differ from their defaults: ``{"engine": {...},
    "server": {...}}`` by destination (``max_model_len``, ``lora_modules``, ...)."""
    parser = serve_parser()
    given = vars(parser.parse_args(list(argv)))
    defaults = vars(parser.parse_args([]))
    out: dict[str, dict[str, Any]] = {"engine": {}, "server": {}}
    for dest, value in given.items():
        if value != defaults.get(dest):
            out["engine" if dest in ENGINE_FIELDS else "server"][dest] = value
    return out


def options() -> list[tuple[str, tuple[str, ...], bool]]:
    """Every option of ``vllm serve``: its destination, its flags, and whether it is the
    engine's."""
    return [
        (action.dest, tuple(action.option_strings), action.dest in ENGINE_FIELDS)
        for action in serve_parser()._actions  # argparse keeps no public list of them
        if action.dest != "help"
    ]


def _jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if hasattr(value, "model_dump"):
        return value.model_dump()
    return str(value)


if __name__ == "__main__":
    json.dump(read(sys.argv[1:]), sys.stdout, default=_jsonable)
