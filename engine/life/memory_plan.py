"""One memory plan for the engines of a process that start together.

A RAG app starts a chat model, an embedder and a reranker: three engines on one device. Sized
alone, each takes what it would take with the device to itself. On a GPU the first takes vLLM's
``gpu_memory_utilization=0.92`` and the second is refused at start (vLLM 0.30-0.33), or the first
takes all the memory free after its warm-up and the second runs out of memory (0.34); on a CPU
the first takes half of what is free, the next half of the rest. :func:`plan_memory` sizes them together from
the device's free memory and each model's weights, before any of them spawns a process.

**CPU** (run here). The KV caches share what is left after *all* the weights (and the
per-engine reserve of :mod:`.platform_defaults`): each engine gets what it would get alone (a
few full-length sequences) when that fits, else a share in proportion to it; when even one
sequence no longer fits, ``max_model_len`` is lowered as for one engine, or the plan fails.

**GPU** (derived from vLLM's code and unit-tested, not run on a GPU). vLLM's rules differ by
release; :mod:`.gpu_rules` holds both sets, chosen by the installed vLLM's version:

1. ``request_memory`` (``vllm/v1/worker/utils.py``, from ``Worker.init_device``): an engine
   requests ``ceil(total_memory * gpu_memory_utilization)`` bytes. Up to 0.33 it refuses to start
   when the device's free memory at that moment is less. 0.34 does the same without its new
   extensible KV cache, and skips the refusal with it (the request is only a cap).
2. With ``kv_cache_memory_bytes`` set, the KV cache is exactly that (``Worker.
   determine_available_memory``: the profile run still happens, its result is not used). Else,
   up to 0.33, it is the request minus what profiling measured (weights, activation peak,
   non-torch memory), which other processes' allocations during the profile would distort; on
   0.34 the extensible cache is sized after warm-up from the memory *then free*, capped by the
   request (1.0 of the device when ``gpu_memory_utilization`` is unset): whichever engine
   finishes its warm-up first takes what the others have not yet allocated.

So each engine gets both: ``kv_cache_memory_bytes`` and a ``gpu_memory_utilization`` covering its
weights, an estimated overhead (:data:`GPU_OVERHEAD` plus a tenth of the weights, for the CUDA
context, activations and graphs) and that KV cache. ``kv_cache_memory_bytes`` per engine is still
the right lever on 0.34: setting it turns the extensible cache off for that engine
(``VllmConfig._resolve_extensible_kv_cache``), so its KV cache does not depend on what the other
engines hold at the moment it measures, nor on the order they finish warming up in; and the
engine goes back to rule 1's refusal, which the plan is built to pass. What it gives up is the
extensible cache's measured sizing after CUDA graph capture (the overhead is estimated here
instead). The requests add up to at most the free memory less a margin, so every engine passes
check 1 whatever order they reach it in, on either rule set. Generation engines share the KV
room in proportion to a full-length sequence; pooling engines (embedders, rerankers) take a few
sequences' worth.

Anything the user set wins: an engine with its own memory option keeps it, and the plan counts what
it takes (its ``gpu_memory_utilization`` as the rules resolve it). A plan that cannot fit raises
:class:`~vllm_inline.engine.errors.InsufficientMemoryError` naming the model and the option, before
any process is spawned. :func:`check_alone_start` refuses, with the same error, a GPU engine
started alone next to one of this process that leaves it no room: up to 0.33 one holding vLLM's
default share (vLLM would refuse the new one at start, naming neither); on 0.34 one whose
extensible KV cache took all the memory free after its warm-up (vLLM would not refuse the new one
at start, but it would run out of memory loading its weights or find no room for a KV cache).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from vllm_inline.engine.errors import InsufficientMemoryError
from vllm_inline.engine.life.gpu_rules import ESTIMATED, GpuRules, gpu_rules
from vllm_inline.engine.life.platform_defaults import (
    DTYPE_BYTES,
    KV_MAX,
    KV_MIN,
    KV_SEQUENCES,
    KV_SHARE,
    RESERVE,
    Choice,
    MachineFacts,
    gib,
    start_dtype,
    weights_in_dtype,
)

__all__ = [
    "GPU_MARGIN",
    "GPU_OVERHEAD",
    "MEMORY_OPTIONS",
    "VLLM_DEFAULT_UTILIZATION",
    "EngineNeeds",
    "check_alone_start",
    "plan_memory",
    "sized_by_user",
]

GiB = 2**30

MEMORY_OPTIONS = ("gpu_memory_utilization", "kv_cache_memory_bytes")
"""The options that size an engine's memory: an engine with either set is sized by the user."""

VLLM_DEFAULT_UTILIZATION = ESTIMATED.default_utilization
"""vLLM's ``CacheConfig.gpu_memory_utilization`` default up to 0.33, and on 0.34 without the
extensible KV cache (:mod:`.gpu_rules`)."""

GPU_OVERHEAD = 1 * GiB
"""An engine's GPU memory besides weights and KV cache (CUDA context, activation peak, CUDA
graphs), estimated: vLLM measures it only while it starts. A tenth of the weights is added."""

GPU_MARGIN = 0.05
"""Share of the device's total memory the plan leaves free (allocator slack, other processes)."""

_POOLING_SEQUENCES = 8
"""Full-length sequences of KV cache a pooling engine (embedder, reranker) gets on a GPU."""


@dataclass(frozen=True)
class EngineNeeds:
    """One engine of a plan: its model, the options its user set, and the measured facts."""

    model: str
    """Model path or hub id (named in errors)."""
    user_kwargs: Mapping[str, Any]
    """The options the user gave the engine."""
    facts: MachineFacts
    """The device and the model, measured before the start (free memory, weights, KV size)."""

    @property
    def sized_by_user(self) -> bool:
        """True when the user set a memory option: the plan counts it, and changes nothing."""
        return sized_by_user(self.user_kwargs)

    @property
    def pooling(self) -> bool:
        """True for an embedder or reranker (``runner="pooling"``)."""
        return self.user_kwargs.get("runner") == "pooling"

    @property
    def dtype(self) -> str:
        if not self.facts.is_cpu:  # vLLM's "auto": the checkpoint's, as on the GPU
            return str(self.user_kwargs.get("dtype") or self.facts.checkpoint_dtype or "float16")
        return start_dtype(self.user_kwargs, self.facts)

    @property
    def weights(self) -> int:
        return weights_in_dtype(self.facts, self.dtype)

    @property
    def max_len(self) -> int:
        return int(self.user_kwargs.get("max_model_len") or self.facts.model_max_len or 0)

    @property
    def one_sequence(self) -> int:
        """KV-cache bytes of one full-length sequence (0 when unknown)."""
        per_token = (self.facts.kv_elements_per_token or 0) * DTYPE_BYTES.get(self.dtype, 4)
        return per_token * self.max_len


def sized_by_user(user_kwargs: Mapping[str, Any]) -> bool:
    """True when ``user_kwargs`` set one of :data:`MEMORY_OPTIONS`: nothing to plan for it."""
    return any(user_kwargs.get(name) is not None for name in MEMORY_OPTIONS)


def plan_memory(
    engines: Sequence[EngineNeeds], rules: GpuRules | None = None
) -> list[tuple[Choice, ...]]:
    """The memory options for each of ``engines`` (in order), started together on one device.

    Empty for an engine the user sized and for a single engine (its own defaults apply). Raises
    :class:`InsufficientMemoryError` naming the model and the option when they cannot all fit.
    ``rules``: vLLM's GPU rules (:mod:`.gpu_rules`); the installed vLLM's when ``None``.
    """
    planned = [e for e in engines if not e.sized_by_user]
    if len(engines) < 2 or not planned:
        return [() for _ in engines]
    facts = engines[0].facts
    if facts.free_memory_bytes is None or (not facts.is_cpu and not facts.total_memory_bytes):
        if not facts.is_cpu:
            _refuse_a_race(engines, rules or gpu_rules())
        return [() for _ in engines]  # nothing measured: each engine sizes itself
    plan = _plan_cpu(engines) if facts.is_cpu else _plan_gpu(engines, rules or gpu_rules())
    return [plan.get(id(e), ()) for e in engines]


def _refuse_a_race(engines: Sequence[EngineNeeds], rules: GpuRules) -> None:
    """With the GPU's memory unmeasured (no NVML: ROCm, another accelerator) nothing is planned.
    Up to 0.33 vLLM then refuses the second default engine at start, by itself. On 0.34 two
    uncapped engines would both size their KV cache from what is free after their warm-up, and
    the later one would run out of memory: refused here, naming it, before anything starts."""
    uncapped = [e for e in engines if rules.takes_all_free(e.user_kwargs)]
    if len(uncapped) > 1:
        raise InsufficientMemoryError(
            f"{uncapped[1].model}: the GPU's free memory could not be measured (no NVML), so the "
            f"{len(engines)} engines started together cannot be planned, and with "
            f"{rules.releases}'s extensible KV cache each engine without gpu_memory_utilization "
            f"would take all the memory free after its warm-up ({uncapped[0].model} too): this "
            "one would run out of memory. Pass gpu_memory_utilization to each (adding up to "
            "less than 1), or kv_cache_memory_bytes.",
            option="gpu_memory_utilization",
            requested_bytes=0,
            free_bytes=0,
        )


def _plan_cpu(engines: Sequence[EngineNeeds]) -> dict[int, tuple[Choice, ...]]:
    free = int(engines[0].facts.free_memory_bytes or 0)
    total = int(engines[0].facts.total_memory_bytes or 0)
    planned = [e for e in engines if not e.sized_by_user]
    # vLLM's CPU worker: kv_cache_memory_bytes is the KV cache itself; gpu_memory_utilization
    # a share of the node's RAM reserved for the engine (cpu_worker.CPUWorker.__init__).
    held = sum(
        int(e.user_kwargs.get("kv_cache_memory_bytes") or 0) + e.weights
        if e.user_kwargs.get("kv_cache_memory_bytes") is not None
        else math.ceil(float(e.user_kwargs["gpu_memory_utilization"]) * total)
        for e in engines
        if e.sized_by_user
    )
    room = free - held - sum(e.weights for e in planned) - RESERVE * len(planned)
    if room <= 0:
        biggest = max(planned, key=lambda e: e.weights)
        raise InsufficientMemoryError(
            f"{biggest.model}: the free memory ({gib(free)}) does not hold the weights of the "
            f"{len(engines)} engines started together ({gib(free - room)} with their reserve). "
            "Start fewer models, or smaller ones (a bfloat16 or quantized checkpoint).",
            option="model",
            requested_bytes=free - room,
            free_bytes=free,
        )
    budget = int(room * KV_SHARE)
    wants = {id(e): _cpu_want(e) for e in planned}
    scale = min(1.0, budget / max(sum(wants.values()), 1))
    others = len(engines) - 1
    plan = {}
    for e in planned:
        kv = int(wants[id(e)] * scale)
        why = (
            f"planned with {others} other engine(s): "
            f"{'as alone' if scale == 1 else f'{scale:.0%} of its share'}, of what "
            f"{gib(free)} free leaves after all {len(engines)} engines' weights"
        )
        plan[id(e)] = _fit_cpu(e, kv, why, free)
    return plan


def _cpu_want(e: EngineNeeds) -> int:
    """What :mod:`.platform_defaults` would give the engine alone, before the free-memory cap."""
    if not e.one_sequence:
        return GiB  # its size is unknown: the fixed 1 GiB of an engine alone
    return min(max(e.one_sequence * KV_SEQUENCES, KV_MIN), KV_MAX)


def _fit_cpu(e: EngineNeeds, kv: int, why: str, free: int) -> tuple[Choice, ...]:
    if not e.one_sequence or kv >= e.one_sequence:
        return (Choice("kv_cache_memory_bytes", kv, why),)
    per_token = e.one_sequence // e.max_len
    block = e.facts.block_size
    fit = kv // per_token // block * block
    if e.user_kwargs.get("max_model_len") or fit < block:
        option = "max_model_len" if e.user_kwargs.get("max_model_len") else "kv_cache_memory_bytes"
        raise InsufficientMemoryError(
            f"{e.model}: its share of the memory planned for the engines started together "
            f"({gib(kv)}) does not hold one sequence of max_model_len={e.max_len} "
            f"({gib(e.one_sequence)}). Pass a smaller max_model_len, or {option} for it "
            "yourself, or start fewer models together.",
            option=option,
            requested_bytes=e.one_sequence,
            free_bytes=free,
        )
    return (
        Choice("kv_cache_memory_bytes", fit * per_token, why),
        Choice("max_model_len", fit, f"{fit} tokens fit in its planned KV cache ({why})"),
    )


def _sized_on_gpu(e: EngineNeeds) -> bool:
    """Sized by its user on a GPU: a memory option, a block count, or vLLM 0.34's extensible KV
    cache asked for (which ``kv_cache_memory_bytes`` would contradict)."""
    options = e.user_kwargs
    return (
        e.sized_by_user
        or options.get("num_gpu_blocks_override") is not None
        or options.get("enable_extensible_kv_cache") is True
    )


def _plan_gpu(engines: Sequence[EngineNeeds], rules: GpuRules) -> dict[int, tuple[Choice, ...]]:
    facts = engines[0].facts
    free, total = int(facts.free_memory_bytes or 0), int(facts.total_memory_bytes or 0)
    planned = [e for e in engines if not _sized_on_gpu(e)]
    if not planned:
        return {}
    for e in engines:
        if _sized_on_gpu(e) and rules.takes_all_free(e.user_kwargs):
            raise InsufficientMemoryError(
                f"{e.model}: enable_extensible_kv_cache=True with no gpu_memory_utilization "
                f"sizes its KV cache from all the GPU memory free after its warm-up "
                f"({rules.releases}), leaving none for the {len(engines) - 1} other engine(s) "
                "started with it. Pass gpu_memory_utilization for it too (the share it may "
                "take), or leave enable_extensible_kv_cache unset and the plan sizes it.",
                option="gpu_memory_utilization",
                requested_bytes=total,
                free_bytes=free,
            )
    # What an engine the user sized may take: its request (a cap with the extensible cache).
    held = sum(
        math.ceil(total * rules.utilization(e.user_kwargs)) for e in engines if _sized_on_gpu(e)
    )
    fixed = {id(e): e.weights + GPU_OVERHEAD + e.weights // 10 for e in planned}
    rounding = len(planned) * (total // 10_000 + 1)  # each share is rounded up to 0.0001
    room = free - int(total * GPU_MARGIN) - held - sum(fixed.values()) - rounding
    need = {id(e): e.one_sequence for e in planned}
    short = room - sum(need.values())
    if short < 0:
        worst = max(planned, key=lambda e: fixed[id(e)] + need[id(e)])
        option = "max_model_len" if need[id(worst)] > fixed[id(worst)] else "gpu_memory_utilization"
        raise InsufficientMemoryError(
            f"{worst.model}: the {len(engines)} engines started together need "
            f"{gib(free - short)} (weights, vLLM's overhead, one sequence of KV cache each) "
            f"of the GPU's {gib(free)} free. Pass a smaller max_model_len, or size them "
            "yourself (gpu_memory_utilization, kv_cache_memory_bytes), or start fewer models.",
            option=option,
            requested_bytes=free - short,
            free_bytes=free,
        )
    pooling = {id(e): e.one_sequence * (_POOLING_SEQUENCES - 1) for e in planned if e.pooling}
    pooled = min(sum(pooling.values()), short // 2)
    chat = [e for e in planned if not e.pooling]
    left = short - pooled
    weight = sum(need[id(e)] or 1 for e in chat)
    plan: dict[int, tuple[Choice, ...]] = {}
    others = len(engines) - 1
    for e in planned:
        if e.pooling:
            extra = pooling[id(e)] * pooled // max(sum(pooling.values()), 1)
        else:
            extra = left * (need[id(e)] or 1) // weight
        kv = need[id(e)] + extra
        utilization = math.ceil((fixed[id(e)] + kv) / total * 10_000) / 10_000
        why = f"planned with {others} other engine(s) on the GPU's {gib(free)} free"
        plan[id(e)] = (
            Choice("gpu_memory_utilization", utilization, f"{why}: weights, overhead, KV cache"),
            Choice("kv_cache_memory_bytes", kv, why),
        )
    return plan


def check_alone_start(
    model: str,
    user_kwargs: Mapping[str, Any],
    facts: MachineFacts,
    running: Sequence[tuple[str, Mapping[str, Any]]],
    rules: GpuRules | None = None,
) -> None:
    """Refuse a GPU engine started alone next to an engine of this process (``running``: model
    and the options it started with) that leaves it no room, with the message that says what
    vLLM would do (``rules``: :mod:`.gpu_rules`, the installed vLLM's when ``None``).

    Up to 0.33 (and on 0.34 without the extensible cache): the new engine has no memory option
    and the other holds vLLM's default share; vLLM would refuse it at start with a message that
    names neither engine. An engine the user sized meets vLLM's own check. On 0.34: the other's
    extensible KV cache, uncapped, took all the memory free after its warm-up; vLLM would not
    refuse the new engine at start, whatever its options, but it would run out of memory loading
    its weights or find no room for its KV cache, minutes later."""
    if facts.is_cpu:
        return
    rules = rules or gpu_rules()
    total, free = facts.total_memory_bytes or 0, int(facts.free_memory_bytes or 0)
    how = (
        "Start the engines together: shut that one down first (engine.shutdown()), then "
        "start_engines(first.engine, second.engine) plans their memory"
    )
    for other, options in running:
        if rules.takes_all_free(options):
            raise InsufficientMemoryError(
                f"{model}: the engine for {other} in this process sized its KV cache from all the "
                f"GPU memory free after its warm-up ({rules.releases}'s extensible KV cache, "
                "with no gpu_memory_utilization to cap it), so this one would run out of memory "
                "loading its weights or find no room for its KV cache (vLLM does not refuse it at "
                f"start). {how}; or pass gpu_memory_utilization to that one (the share it may "
                "take) and start this one in what it leaves.",
                option="gpu_memory_utilization",
                requested_bytes=math.ceil(rules.utilization(user_kwargs) * total),
                free_bytes=free,
            )
        if sized_by_user(user_kwargs) or not rules.refuses_short_start(user_kwargs):
            continue
        if options.get("gpu_memory_utilization") is None and not rules.extensible(options):
            share = rules.utilization(options)
            raise InsufficientMemoryError(
                f"{model}: the engine for {other} in this process already holds vLLM's default "
                f"share of the GPU (gpu_memory_utilization={share}), so vLLM would refuse to "
                f"start this one. {how}; or pass gpu_memory_utilization to each (adding up to "
                "less than 1).",
                option="gpu_memory_utilization",
                requested_bytes=math.ceil(rules.utilization(user_kwargs) * total),
                free_bytes=free,
            )
