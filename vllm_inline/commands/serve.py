"""``python -m vllm_inline serve``: the OpenAI-compatible server (:mod:`vllm_inline.server`)
alone, for the models named on the command line, under uvicorn.

The arguments follow ``vllm serve``'s where there is one (``--api-key``, ``--served-model-name``,
``--host``, ``--port``); the server itself needs the ``server`` extra (FastAPI, uvicorn).
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence
from typing import Any

from vllm_inline.testing import build_scripted_model

__all__ = [
    "EXTRA_ARGUMENTS",
    "add_arguments",
    "app_from_environment",
    "argument_problem",
    "build_app",
    "byte_count",
    "chat_template_text",
    "limits_of",
    "responses_store_of",
    "run",
    "seconds",
    "serve",
    "whole_count",
    "worker_count",
]

EXTRA_ARGUMENTS = True
"""Options ``serve`` does not define are ``vllm serve``'s, for :func:`argument_problem` to read
(the entry point asks a command that has one before :func:`run`)."""
ARGS_VARIABLE = "VLLMINLINE_SERVE_ARGS"
"""The ``serve`` arguments, as JSON, in each worker of ``--workers N``."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``serve`` command's arguments."""
    parser.add_argument(
        "model_tag",
        nargs="?",
        metavar="MODEL",
        help="chat model: hub id or local path, as `vllm serve MODEL` takes it (or --model)",
    )
    parser.add_argument(
        "--model",
        default=os.environ.get("MODEL") or None,
        help="chat model: hub id or local path (default: $MODEL, else the embedded demo model)",
    )
    parser.add_argument("--embedding-model", help="an embedding model to serve on /v1/embeddings")
    parser.add_argument("--rerank-model", help="a reranker to serve on /v1/rerank and /v1/score")
    parser.add_argument(
        "--served-model-name", help="the id clients send as `model` for the chat model"
    )
    parser.add_argument(
        "--vllm-kwargs",
        type=json.loads,
        default=None,
        help="engine options as JSON, e.g. '{\"max_model_len\": 4096}' (default: the engine's choice)",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument(
        "--api-key",
        default=os.environ.get("VLLM_API_KEY") or None,
        help="require `Authorization: Bearer KEY` on /v1 (default: $VLLM_API_KEY)",
    )
    parser.add_argument(
        "--max-body-bytes", type=int, default=1 << 20, help="refuse larger bodies (413; 1 MiB)"
    )
    parser.add_argument(
        "--max-tokens-cap", type=int, help="refuse a larger max_tokens (default: the context)"
    )
    parser.add_argument("--max-n", type=int, default=8, help="refuse a larger n (default: 8)")
    # /v1/responses (vllm_inline.server.responses): where responses are kept; and what parts
    # reasoning from the answer (as vllm serve's flag: chat and responses).
    parser.add_argument(
        "--responses-store",
        default=None,
        help="the SQLite file every worker keeps /v1/responses answers in, or :memory: (one "
        "worker) (default: $VLLMINLINE_RESPONSES_STORE, else ~/.cache/vllm_inline/responses.sqlite3)",
    )
    parser.add_argument(
        "--responses-store-max-bytes",
        type=byte_count,
        default=None,
        help="the most stored JSON the store keeps; past it the oldest responses are deleted "
        "(default: 256 MiB)",
    )
    parser.add_argument(
        "--responses-store-ttl-seconds",
        type=seconds,
        default=None,
        help="how long a stored response is kept (default: 30 days, as OpenAI)",
    )
    parser.add_argument(
        "--reasoning-parser",
        default=None,
        help="vLLM's reasoning parser for the chat model's answers (message.reasoning, "
        "/v1/responses reasoning items), e.g. qwen3 (default: none)",
    )
    parser.add_argument(
        "--tool-call-parser",
        default=None,
        help="vLLM's tool parser for the chat model's tool calls, as vllm serve's flag, e.g. "
        "hermes (default: none; a named or required tool uses the model family's)",
    )
    parser.add_argument(
        "--enable-auto-tool-choice",
        action="store_true",
        help="parse tool calls out of `auto` answers with --tool-call-parser, as vllm serve's "
        "flag (without it a model's text comes back as text)",
    )
    parser.add_argument(
        "--tool-parser-plugin",
        default=None,
        help="a Python file that registers a tool parser with vLLM, as vllm serve's flag",
    )
    parser.add_argument(
        "--strict-fields",
        action="store_true",
        help="refuse request fields the server does not know (400) instead of ignoring them "
        "with a warning, as vllm serve does",
    )
    parser.add_argument(
        "--trust-request-chat-template",
        action="store_true",
        help="take a request's chat_template (as vllm serve's flag; default: refused)",
    )
    parser.add_argument(
        "--trust-request-mm-kwargs",
        action="store_true",
        help="take a request's mm_processor_kwargs and media_io_kwargs (as vllm serve's flag)",
    )
    parser.add_argument(
        "--keep-alive",
        help="serve from the host's engines (docs/host.md): each model loaded once per host, "
        'shared with your notebooks and scripts, kept this long after the last user ("10m", '
        "seconds, -1: until `engines stop`; default: $VLLMINLINE_KEEP_ALIVE, else the server's "
        "own engines)",
    )
    parser.add_argument(
        "--workers",
        type=worker_count,
        default=1,
        help="worker processes, all on one engine per model (vllm_inline.workers; default: 1)",
    )
    parser.add_argument(
        "--verbose", action="store_true", help="show vLLM's own logs (INFO and warnings)"
    )


def run(args: argparse.Namespace) -> int:
    """Run the command."""
    return serve(args)


def argument_problem(args: argparse.Namespace, extra: Sequence[str] = ()) -> str | None:
    """What is wrong with a combination of ``serve`` arguments, as argparse would say it;
    ``None`` when they fit together. ``extra``: ``vllm serve``'s options, read by vLLM's parser
    (:mod:`vllm_inline.commands.serve_flags`). Checked before anything starts."""
    args.lora_modules, args.chat_template, args.cors, args.uvicorn = {}, None, {}, {}
    if extra:
        from vllm_inline.commands import serve_flags

        problem = serve_flags.apply(args, serve_flags.read(extra))
        if problem:
            return problem
    if args.chat_template is not None:
        try:
            args.chat_template = chat_template_text(args.chat_template)
        except ValueError as e:
            return f"--chat-template {args.chat_template!r}: {e}"
    tag, model = getattr(args, "model_tag", None), getattr(args, "model", None)
    if tag and model and tag != model and model != os.environ.get("MODEL"):
        return f"the model is given twice: {tag!r} and --model {model!r}"
    if tag:
        args.model = tag
    if args.enable_auto_tool_choice and not args.tool_call_parser:
        return "--enable-auto-tool-choice requires --tool-call-parser (as in vllm serve)"
    plugin = args.tool_parser_plugin
    if plugin and not os.path.isfile(plugin):
        return f"--tool-parser-plugin {plugin!r}: no such file"
    if plugin and args.keep_alive is not None:
        return (
            "--tool-parser-plugin registers a parser in this process, and --keep-alive runs the "
            "engine in the host's: leave one out"
        )
    return None


def chat_template_text(given: str) -> str:
    """``--chat-template``: a file's text, or the template itself (as ``vllm serve`` takes
    it), checked to parse as the chat template renderer parses it; :class:`ValueError` says
    why not."""
    from jinja2 import TemplateSyntaxError
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    if os.path.isfile(given):
        with open(given, encoding="utf-8") as f:
            text = f.read()
    elif "{{" in given or "{%" in given:
        text = given
    else:
        raise ValueError("no such file, and no Jinja template either")
    try:  # the environment transformers renders chat templates in
        ImmutableSandboxedEnvironment(extensions=[loopcontrols]).parse(text)
    except TemplateSyntaxError as e:
        raise ValueError(f"does not parse: {e.message} (line {e.lineno})") from None
    return text


def whole_count(text: str, what: str) -> int:
    """``text`` as a whole number of ``what``, 1 or more, or argparse's error saying so."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(
            f"must be a whole number of {what}, 1 or more; got {text!r}"
        )
    return value


def worker_count(text: str) -> int:
    """``--workers``: a whole number, 1 or more."""
    return whole_count(text, "worker processes")


def byte_count(text: str) -> int:
    """``--responses-store-max-bytes``: a whole number of bytes, 1 or more."""
    return whole_count(text, "bytes")


def seconds(text: str) -> float:
    """``--responses-store-ttl-seconds``: a number of seconds above 0."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number of seconds above 0; got {text!r}")
    return value


def responses_store_of(args: argparse.Namespace) -> Any:
    """The ``responses_store`` of the server: the ``--responses-store`` path (``None``: the
    default), or, with a size or expiry flag, a function that opens it with them (at the first
    ``/v1/responses`` request that needs it, as a path is)."""
    where = getattr(args, "responses_store", None)
    limits = {
        name: value
        for name, flag in (("max_bytes", "responses_store_max_bytes"),
                           ("ttl_seconds", "responses_store_ttl_seconds"))
        if (value := getattr(args, flag, None)) is not None
    }  # fmt: skip
    if not limits:
        return where
    from functools import partial

    from vllm_inline.server.responses import open_store

    return partial(open_store, where, **limits)


def serve(args: argparse.Namespace) -> int:
    """Build the app for ``args`` and run it until stopped."""
    try:
        import uvicorn

        from vllm_inline import server  # noqa: F401
    except ImportError as e:
        print(f"serve needs the server extra: pip install 'vllm-inline[server]' ({e})")
        return 2
    if getattr(args, "keep_alive", None) is not None:
        from vllm_inline.engine.host.directory import KEEP_ALIVE_VARIABLE, parse_keep_alive

        parse_keep_alive(args.keep_alive, "--keep-alive")
        os.environ[KEEP_ALIVE_VARIABLE] = args.keep_alive  # every engine, in every worker
    if args.workers > 1:
        from vllm_inline.workers import run

        if getattr(args, "responses_store", None) == ":memory:":
            print("--responses-store :memory: is one process's; with --workers use a file")
            return 2

        return run(
            f"{__name__}:app_from_environment",
            factory=True,
            workers=args.workers,
            host=args.host,
            port=args.port,
            environment={ARGS_VARIABLE: json.dumps(vars(args))},
            uvicorn_options=getattr(args, "uvicorn", None),
        )
    uvicorn.run(build_app(args), host=args.host, port=args.port, **getattr(args, "uvicorn", {}))
    return 0


def app_from_environment() -> Any:
    """The app of a worker of ``serve --workers N``, from the launcher's arguments."""
    return build_app(argparse.Namespace(**json.loads(os.environ[ARGS_VARIABLE])))


def limits_of(args: argparse.Namespace) -> Any:
    """The server's :class:`~vllm_inline.server.Limits` from the ``serve`` arguments."""
    from vllm_inline.server import Limits

    return Limits(
        api_key=args.api_key,
        max_body_bytes=args.max_body_bytes,
        max_tokens_cap=args.max_tokens_cap,
        max_n=args.max_n,
        strict_fields=args.strict_fields,
        trust_request_chat_template=args.trust_request_chat_template,
        trust_request_mm_kwargs=args.trust_request_mm_kwargs,
    )


def build_app(args: argparse.Namespace) -> Any:
    """The FastAPI app that serves the models of ``args``."""
    from vllm_inline.server import create_app

    chat: Any = args.model or str(build_scripted_model("demo"))
    if args.served_model_name:
        from vllm_inline.engine import get_engine

        chat = {args.served_model_name: get_engine(chat, **(args.vllm_kwargs or {}))}
    limits = limits_of(args)
    if getattr(args, "tool_parser_plugin", None):
        from vllm_inline.engine.seam.vllm_parsing import import_tool_parser

        import_tool_parser(args.tool_parser_plugin)
    app = create_app(
        chat,
        embedding=args.embedding_model,
        rerank=args.rerank_model,
        limits=limits,
        vllm_kwargs=args.vllm_kwargs,
        responses_store=responses_store_of(args),
        reasoning_parser=getattr(args, "reasoning_parser", None),
        tool_parser=getattr(args, "tool_call_parser", None),
        enable_auto_tool_choice=bool(getattr(args, "enable_auto_tool_choice", False)),
        chat_template=getattr(args, "chat_template", None),
        lora_modules=getattr(args, "lora_modules", None),
    )
    cors = getattr(args, "cors", None)
    if cors:
        from fastapi.middleware.cors import CORSMiddleware

        # vllm serve's defaults: no origin, every method and header, no credentials.
        app.add_middleware(
            CORSMiddleware,
            allow_origins=cors.get("allowed_origins", []),
            allow_methods=cors.get("allowed_methods", ["*"]),
            allow_headers=cors.get("allowed_headers", ["*"]),
            allow_credentials=cors.get("allow_credentials", False),
        )
    return app
