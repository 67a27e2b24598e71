"""The engine settings a scripted model runs with on a CPU, and a handle for tests.

:func:`scripted_model` builds (or reuses) a scenario's model and returns a
:class:`ScriptedModel`: its path, its :class:`~vllm_inline.testing.Scenario` (what a correct
integration returns) and the engine options to pass to ``ChatVLLM``/``VLLM`` as
``vllm_kwargs``. Every object made with the same path and options shares one engine, so a test
session starts each model's engine once.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .builder import build_scripted_model
from .scenarios import SCENARIOS, Scenario

if TYPE_CHECKING:
    from vllm_inline.engine import Engine

__all__ = ["CPU_TEST_ENGINE_KWARGS", "ScriptedModel", "scripted_model"]

# Why each one: bfloat16 can kill a CPU worker (SIGILL); the default memory share
# (`gpu_memory_utilization`, taken of one NUMA node on a CPU) fails at start, so the KV cache gets
# an explicit size; eager mode and a short context keep the start near 20 s. A scripted model
# needs nothing larger.
CPU_TEST_ENGINE_KWARGS: dict[str, Any] = {
    "dtype": "float32",
    "max_model_len": 512,
    "enforce_eager": True,
    "kv_cache_memory_bytes": 128 * 2**20,
}
"""vLLM engine options for a scripted model on a CPU (they work on a GPU too): float32, a
512-token context, eager mode and a 128 MiB KV cache. Copy before changing:
``{**CPU_TEST_ENGINE_KWARGS, "enable_lora": True}``."""


@dataclass(frozen=True)
class ScriptedModel:
    """A built scripted model, what it answers, and the options of its (shared) engine."""

    name: str
    """The scenario's name (a key of :data:`~vllm_inline.testing.SCENARIOS`)."""
    path: str
    """The model directory: pass it as ``model=`` to ``ChatVLLM``, ``VLLM`` or ``get_engine``."""
    scenario: Scenario
    """What the model emits and what a correct integration returns (``scenario.answer``)."""
    engine_kwargs: dict[str, Any] = field(default_factory=lambda: dict(CPU_TEST_ENGINE_KWARGS))
    """vLLM engine options: pass them as ``vllm_kwargs=`` so every object shares one engine."""

    @property
    def engine(self) -> Engine:
        """The shared engine of this model (started on first use, ~20 s on a CPU)."""
        from vllm_inline.engine import get_engine

        return get_engine(self.path, **self.engine_kwargs)


def scripted_model(
    name: str, root: str | os.PathLike[str] | None = None, **engine_kwargs: Any
) -> ScriptedModel:
    """Build (or reuse) scenario ``name``'s model under ``root`` and return its handle.

    ``engine_kwargs`` are added to :data:`CPU_TEST_ENGINE_KWARGS` (and win over them). ``root``
    defaults to :func:`~vllm_inline.testing.default_root`; a test session may pass a temporary
    directory. Building takes well under a second; no engine is started here.
    """
    path = build_scripted_model(name, root)  # KeyError names an unknown scenario
    return ScriptedModel(
        name, str(path), SCENARIOS[name], {**CPU_TEST_ENGINE_KWARGS, **engine_kwargs}
    )
