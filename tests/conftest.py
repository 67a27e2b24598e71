"""Shared fixtures: scripted tiny models on real vLLM engines, one engine per model per session.

Every test that needs an engine asks for ``scripted("<scenario>")``; the model is built once
(:func:`vllm_inline.testing.scripted_model`) and its engine comes from :func:`get_engine` with
the kit's ``CPU_TEST_ENGINE_KWARGS`` (float32, a 512-token context, eager mode, a 128 MiB KV
cache), so the engine tests and both integrations share the same engines.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from vllm_inline.testing import ScriptedModel, scripted_model


@pytest.fixture(scope="session")
def scripted_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = os.environ.get("VLLMINLINE_TEST_MODELS")
    return Path(root) if root else tmp_path_factory.mktemp("scripted-models")


@pytest.fixture(scope="session")
def scripted(scripted_root: Path) -> Iterator[Callable[[str], ScriptedModel]]:
    """``scripted("llama3")`` -> :class:`ScriptedModel` (model built once, engine shared)."""
    cache: dict[str, ScriptedModel] = {}

    def get(name: str) -> ScriptedModel:
        if name not in cache:
            cache[name] = scripted_model(name, root=scripted_root)
        return cache[name]

    yield get
    from vllm_inline.engine import shutdown_all

    shutdown_all()
