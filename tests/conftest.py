"""Shared fixtures: scripted tiny models on real vLLM engines, one engine per model per session.

Every test that needs an engine asks for ``scripted("<scenario>")``; the model is built once
(:mod:`vllm_inline.scripted`) and the engine comes from :func:`get_engine` with
:data:`ENGINE_KWARGS`, so the engine tests and both integrations share the same engines.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

# The CPU facts from ../shared/TESTING.md: float32 only; a small explicit KV cache (the
# gpu_memory_utilization share is taken of one NUMA node and fails at start); eager mode and
# a short context keep start-up near 20 s.
ENGINE_KWARGS: dict = {
    "dtype": "float32",
    "max_model_len": 512,
    "enforce_eager": True,
    "kv_cache_memory_bytes": 128 * 2**20,
}


@dataclass(frozen=True)
class Scripted:
    """A scripted model and its shared engine."""

    name: str
    path: str
    scenario: object
    engine_kwargs: dict

    @property
    def engine(self):
        from vllm_inline.engine import get_engine

        return get_engine(self.path, **self.engine_kwargs)


@pytest.fixture(scope="session")
def scripted_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = os.environ.get("VLLMINLINE_TEST_MODELS")
    return Path(root) if root else tmp_path_factory.mktemp("scripted-models")


@pytest.fixture(scope="session")
def scripted(scripted_root: Path) -> Iterator[Callable[[str], Scripted]]:
    """``scripted("llama3")`` -> :class:`Scripted` (model built once, engine shared)."""
    from vllm_inline.scripted import SCENARIOS, build_scripted_model

    cache: dict[str, Scripted] = {}

    def get(name: str) -> Scripted:
        if name not in cache:
            path = build_scripted_model(name, root=scripted_root)
            cache[name] = Scripted(name, str(path), SCENARIOS[name], dict(ENGINE_KWARGS))
        return cache[name]

    yield get
    from vllm_inline.engine import shutdown_all

    shutdown_all()
