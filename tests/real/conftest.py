"""Real checkpoints from the package registry (``make test-real``).

``make test`` runs with ``-m 'not parallel and not real'`` (pyproject): it neither runs nor imports
these modules. Every test here is marked ``real``.

The checkpoints are built once per machine (:mod:`checkpoints`); when the registry cannot be
reached every test that needs one is skipped with that reason. Engines are shared through
:func:`vllm_inline.engine.get_engine` like in the rest of the suite: the tests start Gemma 3 with
the engine's own CPU defaults (the README snippet: no ``vllm_kwargs``), Gemma 3 in float32
(``test_real_parity.GEMMA_OPTIONS``) and MiniLM on its CPU defaults, each once per session, and
shut them down at the end; ``python -m vllm_inline check`` starts a fourth in its own process.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from checkpoints import RegistryUnavailable, cache_root, gemma_dir, minilm_dir


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    if "not real" in config.getoption("markexpr"):
        return True
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.fspath).parents:
            item.add_marker(pytest.mark.real)


def _built(build: Callable[[Path], Path]) -> str:
    try:
        return str(build(cache_root()))
    except RegistryUnavailable as e:
        pytest.skip(str(e))


@pytest.fixture(scope="session")
def gemma() -> str:
    """Gemma 3 270M (base), a float32 checkpoint directory built from the registry's GGUF."""
    return _built(gemma_dir)


@pytest.fixture(scope="session")
def minilm() -> str:
    """all-MiniLM-L6-v2, its Sentence-Transformers directory from the registry."""
    return _built(minilm_dir)


@pytest.fixture(scope="session", autouse=True)
def _shutdown_engines() -> Iterator[None]:
    yield
    from vllm_inline.engine import shutdown_all

    shutdown_all()
