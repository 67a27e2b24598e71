"""vLLM's rules for an engine's GPU memory, by release: what :mod:`.memory_plan` plans against.

Derived from vLLM's code (``tests/test_memory_plan.py::test_the_rules_are_vllms`` reads them in
every source tree it is given, and fails when a release changes them) and unit-tested, not run
on a GPU. Two rule sets:

**0.30 to 0.33** (:data:`ESTIMATED`). ``Worker.init_device`` -> ``request_memory``
(``vllm/v1/worker/gpu_worker.py``, ``vllm/v1/worker/utils.py``): an engine requests
``ceil(total * gpu_memory_utilization)`` (default ``CacheConfig.gpu_memory_utilization = 0.92``)
and refuses to start when the device's free memory is less. ``determine_available_memory``: the
KV cache is ``kv_cache_memory_bytes`` when set, else the request less what profiling measured.

**0.34** (:data:`EXTENSIBLE`). ``VllmConfig._resolve_extensible_kv_cache``
(``vllm/config/vllm.py``) turns the *extensible KV cache* on by default on CUDA and ROCm, unless
``kv_cache_memory_bytes`` or ``num_gpu_blocks_override`` is set (asking for it together with one
of those is a ``ValueError``). ``CacheConfig.gpu_memory_utilization`` defaults to ``None``, and
``resolved_gpu_memory_utilization`` makes it 1.0 with the extensible cache, 0.92
(``DEFAULT_GPU_MEMORY_UTILIZATION``) without. ``request_memory`` requests that share and skips
the free-memory refusal with the extensible cache ("the budget is only a cap"). The cache is
sized after warm-up and CUDA graph capture from the memory then free, capped by the request
(``measure_kv_cache_blocks`` in ``vllm/v1/worker/extensible_kv_cache.py``, committed by
``finalize_extensible_kv_cache`` from ``EngineCore._initialize_kv_caches``): an engine with no
memory option takes all the free memory but a margin of at least 1 GiB. Without the extensible
cache (``kv_cache_memory_bytes`` set), an engine follows the 0.30-0.33 rules.

Pure: :func:`gpu_rules` picks the set from the installed vLLM's version (its metadata, read by
:mod:`vllm_inline.engine.seam.versions`), or from a version given.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vllm_inline.engine.seam.versions import at_least, installed_at_least

__all__ = ["ESTIMATED", "EXTENSIBLE", "EXTENSIBLE_SINCE", "GpuRules", "gpu_rules"]

EXTENSIBLE_SINCE = "0.34.0"
"""The first release whose KV cache is extensible by default on CUDA and ROCm."""


@dataclass(frozen=True)
class GpuRules:
    """How vLLM sizes one engine's GPU memory from its options, for a range of releases."""

    releases: str
    """The releases the rules hold for (named in messages)."""
    extensible_by_default: bool
    """True from 0.34: the KV cache is extensible unless an option turns it off."""
    default_utilization: float = 0.92
    """``gpu_memory_utilization`` when unset and the cache is not extensible."""
    extensible_utilization: float = 1.0
    """``gpu_memory_utilization`` when unset and the cache is extensible."""
    extensible_margin: int = 1 << 30
    """Memory an extensible cache leaves free at least (``KV_CACHE_MARGIN_FLOOR_BYTES`` on
    CUDA; more on ROCm)."""

    def extensible(self, options: Mapping[str, Any]) -> bool:
        """Whether an engine started with ``options`` gets the extensible KV cache."""
        if not self.extensible_by_default:
            return False
        if any(
            options.get(n) is not None for n in ("kv_cache_memory_bytes", "num_gpu_blocks_override")
        ):
            return False  # asking for it as well is vLLM's ValueError at start
        if options.get("enable_elastic_ep"):
            return False  # elastic EP reuses the profiled size: vLLM turns it off
        # Not modelled: a kv_transfer_config whose connector cannot use it (vLLM turns it off,
        # or refuses to start when it is asked for); such an engine is read as extensible.
        return options.get("enable_extensible_kv_cache") is not False

    def utilization(self, options: Mapping[str, Any]) -> float:
        """The share of the device the engine requests (``resolved_gpu_memory_utilization``)."""
        if options.get("gpu_memory_utilization") is not None:
            return float(options["gpu_memory_utilization"])
        return self.extensible_utilization if self.extensible(options) else self.default_utilization

    def refuses_short_start(self, options: Mapping[str, Any]) -> bool:
        """Whether ``request_memory`` refuses to start the engine when the free memory is below
        its request (not with the extensible cache: the request is only a cap there)."""
        return not self.extensible(options)

    def takes_all_free(self, options: Mapping[str, Any]) -> bool:
        """Whether the engine sizes its KV cache from all the memory free after its warm-up
        (extensible, no ``gpu_memory_utilization`` to cap it): nothing is left for another."""
        return self.extensible(options) and options.get("gpu_memory_utilization") is None


ESTIMATED = GpuRules(releases="vLLM 0.30 to 0.33", extensible_by_default=False)
"""vLLM 0.30 to 0.33: the KV cache sized from a profiling estimate, refused when short."""
EXTENSIBLE = GpuRules(releases="vLLM 0.34", extensible_by_default=True)
"""vLLM 0.34: the extensible KV cache by default, sized after warm-up, never refused at start."""


def gpu_rules(version: str | None = None) -> GpuRules:
    """The rules of vLLM ``version``, or of the installed vLLM when ``None``."""
    newer = (
        installed_at_least(EXTENSIBLE_SINCE)
        if version is None
        else at_least(version, EXTENSIBLE_SINCE)
    )
    return EXTENSIBLE if newer else ESTIMATED
