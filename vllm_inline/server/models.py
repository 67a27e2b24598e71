"""The models a server serves: each a name clients send as ``model``, an engine, and what it
is for (chat and completions, embeddings, or scores)."""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Literal

from vllm_inline.engine import BadRequestError, Engine

__all__ = ["ModelNotFoundError", "ServedModel", "ServedModels"]

Kind = Literal["chat", "embedding", "rerank"]


@dataclass(frozen=True)
class ServedModel:
    """One model of the server."""

    name: str
    """The id clients send as ``model`` and ``/v1/models`` lists."""
    engine: Engine
    """The engine that answers for it (shared with the app's own objects on the same model)."""
    kind: Kind
    """``chat`` (chat and text completions), ``embedding`` or ``rerank`` (rerank and score)."""
    reasoning_parser: str | None = None
    """vLLM's reasoning parser for a chat model's answers (``vllm serve --reasoning-parser``):
    their reasoning text apart, in ``message.reasoning`` and the Responses ``reasoning`` item."""
    tool_parser: str | None = None
    """vLLM's tool parser for a chat model's tool calls (``vllm serve --tool-call-parser``);
    ``None``: the engine's default for the model's family, for a named or required tool."""
    auto_tools: bool = False
    """Parse tool calls out of an ``auto`` answer (``vllm serve --enable-auto-tool-choice``);
    without it the model's text comes back as text, tools or not, as from ``vllm serve``."""
    chat_template: str | None = None
    """The chat template of requests that send none (``vllm serve --chat-template``)."""
    lora: tuple[str, str] | None = None
    """``(name, path)`` of the LoRA adapter this model is (``vllm serve --lora-modules``): its
    requests run the adapter on :attr:`engine`."""
    parent: str | None = None
    """The served model an adapter belongs to (``/v1/models``' ``parent``)."""

    def request_options(self, kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """The options the server adds to a request's engine ``kwargs``: ``vllm serve``'s
        sampling defaults, the adapter, the server's chat template unless the request sent one, and the parsers as ``vllm serve``
        parses answers: its reasoning parser always, its tool parser when tools come, and an
        ``auto`` choice without auto tool parsing sent as ``"none"`` (the tools are still in
        the prompt; only the answer is not parsed for calls)."""
        out = self.sampling_defaults(kwargs)
        if self.lora is not None:
            out["lora"] = self.lora
        if self.chat_template is not None and kwargs.get("chat_template") is None:
            out["chat_template"] = self.chat_template
        if self.reasoning_parser is not None:
            out["reasoning_parser"] = self.reasoning_parser
        if not kwargs.get("tools"):
            return out
        if self.tool_parser is not None:
            out["tool_parser"] = self.tool_parser
        if kwargs.get("tool_choice") in (None, "auto") and not self.auto_tools:
            out["tool_choice"] = "none"
        return out

    def sampling_defaults(self, kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """``vllm serve``'s sampling where the request set none: the model's
        ``generation_config`` (the engine layers it) and no repetition penalty. The engine's own
        default of 1.1 is for ``ChatVLLM`` and ``VLLM`` users; a client of ``vllm serve`` gets
        1.0, and the penalty changes what it samples (and costs the engine core ~20 % more CPU
        per token: ``make bench-serve``)."""
        if "repetition_penalty" in kwargs or "repetition_penalty" in self._model_defaults:
            return {}
        return {"repetition_penalty": 1.0}

    @cached_property
    def _model_defaults(self) -> dict[str, Any]:
        return self.engine.model_defaults

    def check_chat_tool_choice(self, kwargs: Mapping[str, Any]) -> None:
        """On chat completions, an ``auto`` choice among tools on a model served without a tool
        parser is a 400 saying which options to start the server with, as ``vllm serve``'s
        (its ``render_chat_request``): the model's call would otherwise come back as text the
        client takes for an answer. (``/v1/responses`` answers text there, as ``vllm serve``'s.)
        A named or required choice still runs with the family's parser (a difference listed in
        docs/server.md: ``vllm serve`` refuses it)."""
        choice = kwargs.get("tool_choice")
        if kwargs.get("tools") and choice in (None, "auto") and self.tool_parser is None:
            raise BadRequestError(
                '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser '
                "to be set (OpenAIServer(tool_parser=..., enable_auto_tool_choice=True)); or "
                'send tool_choice "none".',
                parameter="tool_choice",
                value=choice or "auto",
            )

    @cached_property
    def fingerprint(self) -> str:
        """``system_fingerprint``, as ``vllm serve`` builds it: ``vllm-<version>-<hash>``, the
        hash of the model and its engine options (what changes the answers)."""
        from vllm_inline.engine.seam.versions import installed_vllm

        version = (installed_vllm() or ("vllm", "unknown"))[1]
        options = repr((self.engine.model, sorted(self.engine.vllm_kwargs.items())))
        return f"vllm-{version}-{hashlib.sha256(options.encode()).hexdigest()[:8]}"


class ModelNotFoundError(LookupError):
    """A request named a model this server does not serve for that route (404)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
        """What to show the client."""


class ServedModels:
    """The server's models, looked up by the name a request sends."""

    def __init__(self, models: Iterable[ServedModel]) -> None:
        self.all: list[ServedModel] = list(models)
        """Every served model, in the order given."""
        names = [m.name for m in self.all]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            msg = f"served model names must differ: {duplicates} given twice"
            raise ValueError(msg)

    def find(self, kind: Kind | None, name: Any) -> ServedModel:
        """The model of ``kind`` named ``name`` (``None``: the first of that kind, as ``vllm
        serve`` takes a request without ``model``); :class:`ModelNotFoundError` otherwise.
        ``kind=None``: a model of any kind, as ``vllm serve``'s tokenizer routes serve every
        model (without a name: the first chat model, else the first)."""
        if kind is None and name is None:
            chat = [m for m in self.all if m.kind == "chat"]
            return (chat or self.all)[0]
        of_kind = [m for m in self.all if kind is None or m.kind == kind]
        for model in of_kind:
            if name is None or model.name == name:
                return model
        if any(m.name == name for m in self.all):
            served = ", ".join(repr(m.name) for m in of_kind) or "none"
            raise ModelNotFoundError(
                f"The model `{name}` does not serve this route; models that do: {served}."
            )
        raise ModelNotFoundError(f"The model `{name}` does not exist.")

    def cards(self) -> dict[str, Any]:
        """``/v1/models``: every served model, in ``vllm serve``'s shape."""
        data = []
        created = int(time.time())
        for model in self.all:
            # An adapter's card has no max_model_len, as vllm serve's (its parent's has it).
            length = model.engine.max_model_len if model.engine.started and not model.lora else None
            data.append(
                {
                    "id": model.name,
                    "object": "model",
                    "created": created,
                    "owned_by": "vllm",
                    "root": model.lora[1] if model.lora else model.engine.model,
                    "parent": model.parent,
                    "max_model_len": length,
                    "permission": [_permission(created)],
                }
            )
        return {"object": "list", "data": data}


def _permission(created: int) -> dict[str, Any]:
    """``vllm serve``'s one model permission: anyone may sample it and read logprobs."""
    return {
        "id": f"modelperm-{uuid.uuid4().hex[:16]}",
        "object": "model_permission",
        "created": created,
        "allow_create_engine": False,
        "allow_sampling": True,
        "allow_logprobs": True,
        "allow_search_indices": False,
        "allow_view": True,
        "allow_fine_tuning": False,
        "organization": "*",
        "group": None,
        "is_blocking": False,
    }
