"""LoRA adapters per request: which adapter a call names, its id, and loading it safely.

A call passes ``lora=`` as a local adapter directory (``"/adapters/sql"``), a ``(name, path)``
pair, a ``{"name": ..., "path": ...}`` mapping, or the name of an adapter this engine has seen
before. Each engine keeps a :class:`LoRARegistry` (``Engine.adapters``): the same directory
always gets the same id (ids count from 1) and two directories never share one, nor a vLLM name.

Nothing here imports vLLM at import time: :meth:`LoRARegistry.resolve` checks the argument
before any work; :func:`lora_request` runs on the engine loop and loads an adapter once
(vLLM's ``add_lora``), so a bad adapter (rank above ``max_lora_rank``, target modules the model
does not have, an engine started without ``enable_lora``) is a :class:`BadRequestError` naming the
path, and the engine keeps serving. Loading it inside a batch instead would kill the engine.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import os
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vllm_inline.engine.errors import BadRequestError
from vllm_inline.engine.life import group
from vllm_inline.engine.life.runtime import Runtime
from vllm_inline.engine.seam.vllm_types import LoRARequest

__all__ = ["Adapter", "LoRARegistry", "lora_request"]

_CONFIG = "adapter_config.json"
_BASE_OK, _BASE_FAILED = -1, -2  # markers in Runtime.loaded_adapters (adapter ids are >= 1)

logger = logging.getLogger("vllm_inline")


@dataclass(frozen=True)
class Adapter:
    """A LoRA adapter as this engine knows it."""

    name: str
    """vLLM's ``lora_name``: unique in the engine. vLLM compares adapters by name up to 0.33
    and by name and ``lora_int_id`` from 0.34; names and ids are one-to-one here (one id per
    directory, one directory per name), so both compare the same adapters as equal."""
    id: int
    """vLLM's ``lora_int_id``: 1, 2, ... in the order the engine first saw the paths; in a
    worker of an engine group, a number drawn from the path, the same in every worker (they
    share the engine core, which knows adapters by this id)."""
    path: str
    """Absolute, symlink-resolved adapter directory."""


class LoRARegistry:
    """One engine's adapters: path -> :class:`Adapter`, plus the names they were given."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_path: dict[str, Adapter] = {}
        self._by_name: dict[str, Adapter] = {}
        self._ids = itertools.count(1)

    def resolve(self, lora: Any) -> Adapter | None:
        """The adapter ``lora`` names (``None`` for the base model); refused before any work."""
        if lora is None:
            return None
        name, path = _split(lora)
        if path is None:  # a bare string that is no directory: a name seen before?
            with self._lock:
                known = self._by_name.get(name)
            if known is not None:
                return known
            raise BadRequestError(
                f"lora={lora!r} is neither an adapter directory (no such directory) nor the "
                "name of an adapter this engine has seen. Pass a local PEFT adapter directory "
                "(with adapter_config.json), or (name, path) once to name it.",
                parameter="lora",
                value=lora,
            )
        if not os.path.isdir(path):
            raise BadRequestError(
                f"LoRA adapter path {path!r} does not exist or is not a directory. Pass a local "
                "PEFT adapter directory (adapter_config.json + adapter_model.safetensors).",
                parameter="lora",
                value=path,
            )
        if not os.path.isfile(os.path.join(path, _CONFIG)):
            raise BadRequestError(
                f"LoRA adapter directory {path!r} has no {_CONFIG}: it is not a PEFT adapter.",
                parameter="lora",
                value=path,
            )
        key = os.path.realpath(path)
        with self._lock:
            adapter = self._by_path.get(key)
            if adapter is None:
                wanted = name or os.path.basename(key) or "adapter"
                taken = self._by_name.get(wanted)
                if taken is not None and name:
                    raise BadRequestError(
                        f"LoRA adapter name {name!r} already refers to {taken.path!r}; "
                        f"choose another name for {path!r}.",
                        parameter="lora",
                        value=path,
                    )
                number = _shared_id(key) if group.joined() else next(self._ids)
                vllm_name = wanted if taken is None else f"{wanted}-{number}"
                adapter = self._by_path[key] = Adapter(vllm_name, number, key)
                self._by_name.setdefault(vllm_name, adapter)
            if name:
                self._by_name.setdefault(name, adapter)  # an alias for the same directory
            return adapter


def _shared_id(path: str) -> int:
    """An adapter id from its path: the same in every process, 1 to 2**31 - 2."""
    digest = hashlib.sha256(path.encode()).digest()
    return 1 + int.from_bytes(digest[:8], "big") % (2**31 - 2)


async def lora_request(runtime: Runtime, adapter: Adapter | None) -> LoRARequest | None:
    """vLLM's ``LoRARequest`` for ``adapter`` (or for the base model on the CPU, see
    ``vllm_lora.base_lora_request``), loading the adapter into the engine on first use.

    Runs on the engine loop; which adapters are loaded is kept on the ``runtime``, so a
    restarted engine loads them again.
    """
    from vllm_inline.engine.seam import vllm_lora

    llm, loaded = runtime.running_llm(), runtime.loaded_adapters
    if adapter is None:
        base = vllm_lora.base_lora_request(llm)
        if base is None or _BASE_OK in loaded:
            return base
        if _BASE_FAILED in loaded:
            return None
        try:
            await vllm_lora.add_lora(llm, base)
        except Exception:
            logger.warning(
                "vllm-inline: the base model's empty LoRA adapter does not load on this "
                "model; on the CPU, base-model requests batched with adapter requests may "
                "get an adapter's weights (a vLLM CPU bug).",
                exc_info=True,
            )
            loaded.add(_BASE_FAILED)
            return None
        loaded.add(_BASE_OK)
        return base
    if not vllm_lora.lora_enabled(llm):
        raise BadRequestError(
            f"lora={adapter.path!r}: this engine was started without LoRA support. Pass "
            "vllm_kwargs={'enable_lora': True, 'max_lora_rank': <the adapters' largest "
            "rank>, 'max_loras': <adapters per batch>}.",
            parameter="lora",
            value=adapter.path,
        )
    request = vllm_lora.make_lora_request(adapter.name, adapter.id, adapter.path)
    if adapter.id not in loaded:
        try:
            await vllm_lora.add_lora(llm, request)
        except Exception as e:  # vLLM raises a bare Exception carrying the worker's message
            raise BadRequestError(
                f"LoRA adapter {adapter.path!r} cannot be used with this engine: "
                f"{_worker_message(e)} (check its adapter_config.json: rank <= the engine's "
                "max_lora_rank, target modules this model has).",
                parameter="lora",
                value=adapter.path,
            ) from e
        loaded.add(adapter.id)
    return request


def _split(lora: Any) -> tuple[str, str | None]:
    """``(name or "", path or None)`` of a ``lora`` argument; refuses other shapes."""
    if isinstance(lora, (str, os.PathLike)):
        text = os.fspath(lora)
        if not text:
            raise BadRequestError.invalid("lora", lora, "a non-empty adapter path or name")
        expanded = os.path.expanduser(text)
        looks_like_path = (
            os.path.isdir(expanded) or text.startswith(("/", ".", "~")) or os.sep in text
        )
        return ("", os.path.abspath(expanded)) if looks_like_path else (text, None)
    if isinstance(lora, Mapping):
        name, path = lora.get("name"), lora.get("path")
        extra = set(lora) - {"name", "path"}
        if extra or not isinstance(path, (str, os.PathLike)):
            raise BadRequestError.invalid("lora", lora, "{'name': str, 'path': local directory}")
    elif isinstance(lora, tuple) and len(lora) == 2:
        name, path = lora
    else:
        raise BadRequestError.invalid(
            "lora", lora, "a local adapter path, a (name, path) pair or {'name':..., 'path':...}"
        )
    if name is not None and (not isinstance(name, str) or not name):
        raise BadRequestError.invalid("lora", lora, "the adapter name must be a non-empty string")
    if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
        raise BadRequestError.invalid("lora", lora, "the adapter path must be a local directory")
    return (name or "", os.path.abspath(os.path.expanduser(os.fspath(path))))


def _worker_message(e: BaseException) -> str:
    """The worker's own words out of vLLM's 'Call to add_lora method failed: ...' wrapper."""
    text = str(e)
    found = re.search(r"Worker failed with error '(.*)', please check", text, re.DOTALL)
    return found.group(1) if found else text
