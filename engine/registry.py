"""The process's engines, one per model and options: :func:`get_engine`."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Mapping
from typing import Any

from vllm_inline.engine.engine import Engine
from vllm_inline.engine.errors import ModelLoadError
from vllm_inline.engine.host.directory import KEEP_ALIVE_VARIABLE, parse_keep_alive

__all__ = ["get_engine"]

_engines: dict[str, Engine] = {}
_engines_lock = threading.Lock()


def _key(model: str, vllm_kwargs: Mapping[str, Any], attached: bool) -> str:
    return json.dumps([str(model), dict(vllm_kwargs), attached], sort_keys=True, default=repr)


def get_engine(model: str, *, keep_alive: Any = None, **vllm_kwargs: Any) -> Engine:
    """The process's :class:`Engine` for ``model`` and these ``AsyncEngineArgs`` options.

    The same model and options return the same object. Nothing starts until first use.

    ``keep_alive`` (or, when it is not given, ``$VLLMINLINE_KEEP_ALIVE``) puts the engine in a
    host process of its own that every process of the user on this host attaches to (an
    :class:`~vllm_inline.engine.host.attached.AttachedEngine`): the model is loaded once and
    stays loaded that long after the last process using it is gone: a duration (``"10m"``,
    ``"1h"``), seconds, ``0`` (until the last process is gone) or ``-1`` (until ``python -m
    vllm_inline engines stop``). docs/host.md says when to use it.
    """
    if not isinstance(model, (str, os.PathLike)) or not str(model):
        raise ModelLoadError(f"model={model!r} is invalid: pass a local path or a hub id.")
    if keep_alive is None:
        seconds = parse_keep_alive(os.environ.get(KEEP_ALIVE_VARIABLE) or None, KEEP_ALIVE_VARIABLE)
    else:
        seconds = parse_keep_alive(keep_alive)
    name = os.fspath(model)
    if seconds is not None:
        from vllm_inline.engine.host.attach import normalized_model

        name = normalized_model(name)
    key = _key(name, vllm_kwargs, seconds is not None)
    with _engines_lock:
        engine = _engines.get(key)
        if engine is not None and seconds is not None and keep_alive is not None:
            set_keep_alive = getattr(engine, "set_keep_alive", None)
            if set_keep_alive is not None:  # the latest asked for wins, as in Ollama
                set_keep_alive(keep_alive)
        if engine is None:
            if seconds is None:
                engine = Engine(name, vllm_kwargs)
            else:
                from vllm_inline.engine.host.attached import AttachedEngine

                engine = AttachedEngine(name, vllm_kwargs, seconds)
            _engines[key] = engine
        return engine
