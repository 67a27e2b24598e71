"""``vllm serve``'s own options on ``python -m vllm_inline serve``: each one either has a meaning
here or is refused naming it and why (docs/server.md's table, generated from vLLM's parser by
tests/test_serve_flags.py, so an option a new vLLM adds fails that test until it is listed).

The options ``serve`` does not define itself are read by vLLM's own parser in a child process
(:mod:`vllm_inline.engine.seam.vllm_cli`): the launcher imports neither vLLM nor torch. Every
engine option (``AsyncEngineArgs``: ``--max-model-len``, ``-tp``, ``--enable-lora``, ...) goes to
the engines, under ``--vllm-kwargs``' values.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["REFUSED", "TAKEN", "apply", "read", "table"]

TAKEN: Mapping[str, str] = {
    "model_tag": "the chat model (as `serve MODEL`)",
    "config": "a YAML file of these options, read by vLLM's parser",
    "api_server_count": "`--workers`: processes on one engine per model",
    "lora_modules": "each adapter served as a model of its own (`model: NAME`), listed in "
    "/v1/models with the chat model as its parent; its path must exist",
    "chat_template": "the chat model's template for requests that send none (a file or the "
    "template itself; it must parse)",
    "allowed_origins": "CORS, as vllm serve",
    "allowed_methods": "CORS, as vllm serve",
    "allowed_headers": "CORS, as vllm serve",
    "allow_credentials": "CORS, as vllm serve",
    "ssl_keyfile": "TLS (uvicorn's)",
    "ssl_certfile": "TLS (uvicorn's)",
    "ssl_ca_certs": "TLS (uvicorn's)",
    "ssl_cert_reqs": "TLS (uvicorn's)",
    "ssl_ciphers": "TLS (uvicorn's)",
    "root_path": "uvicorn's root_path, behind a proxy that strips a path prefix",
    "uvicorn_log_level": "uvicorn's log level",
    "disable_uvicorn_access_log": "uvicorn's access log off",
}
"""The server options of ``vllm serve`` that mean something here (the engine's all do)."""

_VLLM_SERVER = "a part of vLLM's own OpenAI server that this server does not have"
REFUSED: Mapping[str, str] = {
    "headless": "multi-node serving of vLLM's own server",
    "grpc": "vLLM's gRPC server",
    "grpc_port": "vLLM's gRPC server",
    "uds": "a Unix socket instead of a port is not served",
    "data_parallel_supervisor_port": "vLLM's data-parallel supervisor",
    "dp_supervisor_probe_interval_s": "vLLM's data-parallel supervisor",
    "dp_supervisor_probe_timeout_s": "vLLM's data-parallel supervisor",
    "dp_supervisor_probe_failure_threshold": "vLLM's data-parallel supervisor",
    "enable_scale_out": "vLLM's scale-out",
    "chat_template_content_format": "the engine detects the template's content format",
    "default_chat_template_kwargs": "send chat_template_kwargs per request",
    "response_role": "the answer's role is `assistant`",
    "return_tokens_as_token_ids": "send return_tokens_as_token_ids per request",
    "exclude_tools_when_tool_choice_none": "tools stay in the prompt, as vLLM's default",
    "tool_strict_level": "strict tools are per tool (`strict: true`)",
    "tool_server": "hosted tools are not run (dropped, as vllm serve without a tool server)",
    "max_log_len": "the server logs no request contents",
    "enable_prompt_tokens_details": "cached prompt tokens are always reported",
    "enable_per_request_metrics": _VLLM_SERVER,
    "enable_server_load_tracking": _VLLM_SERVER,
    "enable_force_include_usage": "send stream_options.include_usage per request",
    "sse_keep_alive_interval": _VLLM_SERVER,
    "enable_tokenizer_info_endpoint": _VLLM_SERVER,
    "enable_log_outputs": "the server logs no request contents",
    "enable_log_deltas": "the server logs no request contents",
    "cohere_is_reasoning_model": "the Cohere API is not served",
    "cohere_format": "the Cohere API is not served",
    "anthropic_disabled_thinking_effort": "the Anthropic API is not served",
    "log_error_stack": _VLLM_SERVER,
    "fingerprint_mode": "system_fingerprint is vllm serve's default",
    "fingerprint_value": "system_fingerprint is vllm serve's default",
    "disable_access_log_for_endpoints": _VLLM_SERVER,
    "middleware": "add middleware in your own app (vllm_inline.server.OpenAIServer)",
    "enable_ssl_refresh": _VLLM_SERVER,
    "enable_request_id_headers": _VLLM_SERVER,
    "disable_fastapi_docs": _VLLM_SERVER,
    "h11_max_incomplete_event_size": _VLLM_SERVER,
    "h11_max_header_count": _VLLM_SERVER,
    "enable_offline_docs": _VLLM_SERVER,
    "enable_flash_late_interaction": _VLLM_SERVER,
}
"""The server options of ``vllm serve`` refused here, and why."""


def read(extra: Sequence[str]) -> dict[str, dict[str, Any]]:
    """``extra`` (the options ``serve`` does not define) read by ``vllm serve``'s parser in a
    child process; its error (argparse's, naming the option) ends this process with status 2."""
    child = subprocess.run(
        [sys.executable, "-m", "vllm_inline.engine.seam.vllm_cli", *extra],
        capture_output=True,
        text=True,
        check=False,
    )
    if child.returncode != 0:
        lines = [line for line in child.stderr.splitlines() if "error:" in line]
        sys.stderr.write((lines[-1] if lines else child.stderr) + "\n")
        raise SystemExit(2)
    given: dict[str, dict[str, Any]] = json.loads(child.stdout)
    return given


def apply(args: argparse.Namespace, given: Mapping[str, Mapping[str, Any]]) -> str | None:
    """Put ``vllm serve``'s options (:func:`read`) on ``serve``'s ``args``; what is wrong, as
    argparse would say it, or ``None``."""
    engine = dict(given.get("engine", {}))
    names = engine.pop("served_model_name", None)
    if names:
        if args.served_model_name and [args.served_model_name] != list(names):
            return "--served-model-name is given twice"
        args.served_model_name = names[0]
    args.vllm_kwargs = {**engine, **(args.vllm_kwargs or {})}
    server = dict(given.get("server", {}))
    if "model_tag" in server:  # a word vLLM's parser took for the model: after the options
        return (
            f"{server['model_tag']!r} is not an option's value here: give the model first, "
            "then vllm serve's options (`serve MODEL --max-model-len 4096 ...`)"
        )
    for dest in server:
        if dest in REFUSED:
            return f"--{dest.replace('_', '-')} is not served here: {REFUSED[dest]}"
        if dest not in TAKEN:
            return f"--{dest.replace('_', '-')} is not known to vllm-inline {_version()}"
    if server.get("api_server_count") is not None:
        if args.workers != 1:
            return "--api-server-count and --workers say the same: give one"
        args.workers = server["api_server_count"]
    adapters = server.get("lora_modules") or []
    args.lora_modules = {a["name"]: a["path"] for a in adapters}
    for name, path in args.lora_modules.items():
        if not os.path.isdir(path):
            return f"--lora-modules {name}={path}: no such directory"
    if adapters and not args.vllm_kwargs.get("enable_lora"):
        return "--lora-modules needs --enable-lora (as in vllm serve)"
    args.chat_template = server.get("chat_template")
    args.cors = {
        key: server[key]
        for key in ("allowed_origins", "allowed_methods", "allowed_headers", "allow_credentials")
        if key in server
    }
    args.uvicorn = {
        key: server[key]
        for key in ("ssl_keyfile", "ssl_certfile", "ssl_ca_certs", "ssl_cert_reqs", "ssl_ciphers",
                    "root_path")
        if key in server
    }  # fmt: skip
    if "uvicorn_log_level" in server:
        args.uvicorn["log_level"] = server["uvicorn_log_level"]
    if server.get("disable_uvicorn_access_log"):
        args.uvicorn["access_log"] = False
    return None


def _version() -> str:
    from vllm_inline import __version__

    return __version__


def table(options: Sequence[tuple[str, Sequence[str], bool]], own: set[str], version: str) -> str:
    """docs/server.md's table of ``vllm serve``'s options (``options``: each one's destination,
    flags and whether it is the engine's; ``own``: the flags ``serve`` defines itself)."""
    engine = [flags for _, flags, is_engine in options if is_engine and not own & set(flags)]
    rows = []
    for dest, flags, is_engine in options:
        shown = ", ".join(f"`{f}`" for f in flags) or f"`{dest.upper()}` (positional)"
        if own & set(flags):
            rows.append(f"| {shown} | `serve`'s own option, as `vllm serve`'s |")
        elif not is_engine and dest in TAKEN:
            rows.append(f"| {shown} | {TAKEN[dest]} |")
        elif not is_engine:
            rows.append(f"| {shown} | refused: {REFUSED.get(dest, 'not known here')} |")
    examples = ", ".join(f"`{flags[0]}`" for flags in engine[:6] if flags)
    intro = (
        f"vLLM {version}'s `vllm serve` has {len(options)} options. Its {len(engine)} engine "
        f"options ({examples}, ...: every `AsyncEngineArgs` field) go to the engines, under "
        "`--vllm-kwargs`' values. The others:"
    )
    return "\n".join(
        [
            intro,
            "",
            "| option | here |",
            "|---|---|",
            *rows,
        ]
    )
