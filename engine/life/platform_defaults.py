"""Engine options chosen for the machine: what a CPU needs when the user did not say.

vLLM's defaults are written for a GPU. On a CPU they fail or crawl: ``dtype="auto"`` loads a
bfloat16 checkpoint in bfloat16, which kills the worker with SIGILL on CPUs without bf16
instructions; ``gpu_memory_utilization=0.92`` reserves 92 % of the node's RAM for the KV cache and
refuses to start when other processes hold a few GiB; and compiling the model (no ``enforce_eager``)
adds minutes to the start. :func:`choose_engine_kwargs` decides, from the user's options and the
measured facts (:class:`MachineFacts`), the options to pass instead, with one reason per choice. It
is a pure function: the facts are measured in :mod:`vllm_inline.engine.seam.vllm_engine`.

Parallel layouts need one more choice on a CPU. vLLM binds each tensor/pipeline-parallel rank's
OpenMP threads to its own NUMA node, and refuses to start when there are fewer nodes than ranks
(the usual case: one node) unless ``VLLM_CPU_OMP_THREADS_BIND`` lists a CPU set per rank. When the
user set no binding, one is chosen from the CPUs this process may use, and set in the engine
processes' environment only.

On a GPU nothing changes. Anything the user sets wins. A request for more memory than the machine
has fails with :class:`~vllm_inline.engine.errors.InsufficientMemoryError` before any start.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vllm_inline.engine.errors import InsufficientMemoryError, ParallelLayoutError

__all__ = [
    "BF16_FLAGS",
    "Choice",
    "MachineFacts",
    "PlatformDefaults",
    "choose_engine_kwargs",
    "cpu_supports_bf16",
    "gib",
    "start_dtype",
    "weights_in_dtype",
]

GiB = 2**30
MiB = 2**20

BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})
"""CPU flags (``/proc/cpuinfo``) that mean native bfloat16: x86 AVX-512 BF16 or AMX, Arm BF16."""

DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2}
RESERVE = 1 * GiB
"""Left free for the engine's own process, activations and the caller (beyond weights)."""
KV_SHARE = 0.5
"""Share of what is left after weights and reserve that the KV cache may take."""
KV_MIN = 64 * MiB
KV_MAX = 4 * GiB
"""Cap of the default KV cache: allocating it is slow on a CPU (vLLM's 92 % share of 24 GiB
took 130 s to the first answer here, against 32 s with 1 GiB)."""
KV_SEQUENCES = 4
"""Full-length sequences the default KV cache holds, so a few requests batch together."""


@dataclass(frozen=True)
class MachineFacts:
    """What :func:`choose_engine_kwargs` decides from: the platform and the model, measured."""

    is_cpu: bool
    """True on vLLM's CPU platform."""
    free_memory_bytes: int | None = None
    """Memory available on the engine's memory node now (what vLLM's CPU worker checks)."""
    total_memory_bytes: int | None = None
    """Memory of that node in all (``gpu_memory_utilization`` is a share of it on a CPU)."""
    cpu_flags: frozenset[str] = frozenset()
    """The CPU's feature flags (``/proc/cpuinfo``), e.g. ``avx512_bf16``."""
    checkpoint_dtype: str | None = None
    """The checkpoint's dtype from its config (``"bfloat16"``, ``"float32"``, ...)."""
    weights_bytes: int | None = None
    """Size of the checkpoint's weight files, if known."""
    kv_elements_per_token: int | None = None
    """KV-cache elements one token takes: 2 (K and V) x layers x KV heads x head size."""
    model_max_len: int | None = None
    """The model's own context window (``max_position_embeddings`` and friends)."""
    attention_heads: int | None = None
    """The model's attention heads (the tensor-parallel size must divide them)."""
    allowed_cpus: tuple[int, ...] = ()
    """The CPUs this process may run on (``os.sched_getaffinity``)."""
    memory_nodes: int | None = None
    """NUMA memory nodes this process may use (vLLM's automatic binding takes one per rank)."""
    threads_bind: str | None = None
    """``VLLM_CPU_OMP_THREADS_BIND`` as set in the environment (None: unset)."""
    block_size: int = 64
    """vLLM's KV block size (``block_size``, else ``CacheConfig.DEFAULT_BLOCK_SIZE``: 16 to 0.33,
    64 from 0.34; unknown: 64, a multiple of both). A window chosen here fills whole blocks."""


@dataclass(frozen=True)
class Choice:
    """One option vllm-inline set, and why."""

    name: str
    """The ``AsyncEngineArgs`` option."""
    value: Any
    """The value chosen."""
    reason: str
    """Why, in a few words (shown in the start-up log and by ``python -m vllm_inline check``)."""
    env: bool = False
    """True when ``name`` is an environment variable of the engine's processes, not an option."""


@dataclass(frozen=True)
class PlatformDefaults:
    """The options an engine starts with: the user's, plus :attr:`chosen`."""

    kwargs: dict[str, Any]
    """Every option passed to vLLM's ``AsyncEngineArgs`` (user's and chosen)."""
    environment: dict[str, str] = field(default_factory=dict)
    """Environment variables set while the engine starts, so that the processes it spawns
    inherit them (the caller's own environment is left as it was)."""
    chosen: tuple[Choice, ...] = ()
    """The options vllm-inline set because the user did not; empty on a GPU."""
    facts: MachineFacts | None = field(default=None, compare=False)
    """The facts the choice was made from."""

    def summary(self) -> str:
        """``dtype=float32 (reason); ...`` or ``none (reason)`` for the start-up log."""
        if not self.chosen:
            on_gpu = self.facts is not None and not self.facts.is_cpu
            return "none (not a CPU: vLLM's defaults)" if on_gpu else "none (all set by the user)"
        return "; ".join(f"{c.name}={_show(c.name, c.value)} ({c.reason})" for c in self.chosen)


def _show(name: str, value: Any) -> str:
    if name == "kv_cache_memory_bytes" and isinstance(value, int):
        return gib(value) if value >= GiB else f"{value // MiB} MiB"
    return str(value)


def gib(n: int) -> str:
    """``n`` bytes as ``"1.25 GiB"``."""
    return f"{n / GiB:.2f} GiB"


def cpu_supports_bf16(flags: frozenset[str]) -> bool:
    """True when the CPU flags name native bfloat16 instructions."""
    return bool(flags & BF16_FLAGS)


def _dtype(user: Mapping[str, Any], facts: MachineFacts) -> Choice | None:
    if user.get("dtype") is not None:
        return None  # even "auto": the user asked for the checkpoint's dtype
    if cpu_supports_bf16(facts.cpu_flags):
        flag = min(facts.cpu_flags & BF16_FLAGS)
        return Choice("dtype", "bfloat16", f"the CPU has {flag}: half the memory of float32")
    reason = "this CPU lacks avx512_bf16/amx_bf16: bfloat16 would kill the worker with SIGILL"
    return Choice("dtype", "float32", reason)


def start_dtype(user: Mapping[str, Any], facts: MachineFacts) -> str:
    """The dtype a CPU engine runs in: the user's (``"auto"``: the checkpoint's), else ours."""
    choice = _dtype(user, facts)
    dtype = str(choice.value if choice else user["dtype"])
    dtype = str(facts.checkpoint_dtype or "float32") if dtype == "auto" else dtype
    return dtype.replace("torch.", "")


def weights_in_dtype(facts: MachineFacts, dtype: str) -> int:
    """The checkpoint's weight bytes once loaded in ``dtype`` (0 when unknown)."""
    weights = facts.weights_bytes or 0
    source = DTYPE_BYTES.get(str(facts.checkpoint_dtype or "").replace("torch.", ""))
    target = DTYPE_BYTES.get(dtype)
    if weights and source and target and source != target:
        weights = weights * target // source
    return weights


def _check_user_memory(user: Mapping[str, Any], facts: MachineFacts) -> None:
    """Refuse a memory request the machine cannot meet, naming the option."""
    free = facts.free_memory_bytes
    if free is None:
        return
    kv = user.get("kv_cache_memory_bytes")
    if kv is not None and int(kv) > free:
        raise InsufficientMemoryError(
            f"kv_cache_memory_bytes={int(kv)} ({gib(int(kv))}) is more than the free memory "
            f"({gib(free)}). Pass a smaller kv_cache_memory_bytes, or leave it out and "
            "vllm-inline sizes the KV cache to fit.",
            option="kv_cache_memory_bytes",
            requested_bytes=int(kv),
            free_bytes=free,
        )
    share = user.get("gpu_memory_utilization")
    if kv is None and share is not None and facts.total_memory_bytes:
        wanted = int(float(share) * facts.total_memory_bytes)
        if wanted > free:
            # vLLM's CPU worker refuses this too, but only after spawning and loading.
            raise InsufficientMemoryError(
                f"gpu_memory_utilization={share} reserves {gib(wanted)} (that share of the "
                f"{gib(facts.total_memory_bytes)} of RAM on a CPU), more than the free memory "
                f"({gib(free)}). Pass a smaller share, or leave it out and vllm-inline sizes "
                "the KV cache to fit.",
                option="gpu_memory_utilization",
                requested_bytes=wanted,
                free_bytes=free,
            )


def _kv_cache(
    user: Mapping[str, Any], facts: MachineFacts, dtype: str
) -> tuple[Choice | None, Choice | None]:
    """The KV-cache size (and, if the model's window does not fit, a shorter max_model_len)."""
    if user.get("kv_cache_memory_bytes") is not None or "gpu_memory_utilization" in user:
        return None, None  # the user sized it: vLLM checks the share against the node itself
    free = facts.free_memory_bytes
    per_token = (facts.kv_elements_per_token or 0) * DTYPE_BYTES.get(dtype, 4)
    weights = weights_in_dtype(facts, dtype)
    if free is None:
        return Choice("kv_cache_memory_bytes", GiB, "free memory unknown: a fixed 1 GiB"), None
    room = free - weights - RESERVE
    budget = int(max(room, 0) * KV_SHARE)
    user_len = user.get("max_model_len")
    max_len = int(user_len or facts.model_max_len or 0)
    if not per_token or not max_len:
        kv = max(min(GiB, budget), KV_MIN)
        return Choice(
            "kv_cache_memory_bytes",
            kv,
            f"model size unknown: {_show('kv_cache_memory_bytes', kv)}, "
            f"under half the free memory ({gib(free)})",
        ), None
    one_sequence = per_token * max_len
    if one_sequence <= budget:
        kv = min(max(one_sequence * KV_SEQUENCES, KV_MIN), KV_MAX, budget)
        kv = max(kv, one_sequence)
        return (
            Choice(
                "kv_cache_memory_bytes",
                kv,
                f"{kv // one_sequence} sequence(s) of max_model_len={max_len}, "
                f"of {gib(free)} free (not vLLM's 92 % of RAM)",
            ),
            None,
        )
    if user_len:
        if one_sequence > room:
            raise InsufficientMemoryError(
                f"max_model_len={max_len} needs a KV cache of {gib(one_sequence)} for one "
                f"sequence, more than the free memory ({gib(free)}) leaves after the weights "
                f"({gib(weights)}). Pass a smaller max_model_len.",
                option="max_model_len",
                requested_bytes=one_sequence,
                free_bytes=free,
            )
        return (
            Choice(
                "kv_cache_memory_bytes",
                one_sequence,
                f"one sequence of the max_model_len={max_len} you set, of {gib(free)} free",
            ),
            None,
        )
    fit = (min(budget, KV_MAX) // per_token) // (block := facts.block_size) * block
    if fit < block:
        raise InsufficientMemoryError(
            f"The free memory ({gib(free)}) leaves no room for a KV cache after the weights "
            f"({gib(weights)}). Free some memory or pass kv_cache_memory_bytes and "
            "max_model_len yourself.",
            option="kv_cache_memory_bytes",
            requested_bytes=per_token * block,
            free_bytes=free,
        )
    kv = fit * per_token
    return (
        Choice(
            "kv_cache_memory_bytes",
            kv,
            f"one sequence, in at most 4 GiB and half of what {gib(free)} free leaves after "
            "the weights",
        ),
        Choice(
            "max_model_len",
            fit,
            f"the model's {max_len} tokens need {gib(one_sequence)} of KV cache; "
            f"{fit} fit in {_show('kv_cache_memory_bytes', kv)}",
        ),
    )


def _size(user: Mapping[str, Any], name: str) -> int:
    return int(user.get(name) or 1)


def _check_layout(user: Mapping[str, Any], facts: MachineFacts) -> None:
    """Refuse a parallel layout that cannot start here, before any process is spawned."""
    tp = _size(user, "tensor_parallel_size")
    if facts.attention_heads and facts.attention_heads % tp:
        # vLLM refuses it too, as a ValueError from deep in its config that names no option.
        raise ParallelLayoutError(
            f"tensor_parallel_size={tp} does not divide the model's {facts.attention_heads} "
            "attention heads: each rank takes an equal share. Pass a tensor_parallel_size that "
            f"divides {facts.attention_heads}.",
            option="tensor_parallel_size",
            value=tp,
        )
    if not facts.is_cpu:
        return
    pp = _size(user, "pipeline_parallel_size")
    if pp > 1 and user.get("enforce_eager"):
        raise ParallelLayoutError(
            f"pipeline_parallel_size={pp} with enforce_eager=True fails at the first request on "
            "a CPU: vLLM's CPU worker sets up the tensors the stages hand over only while it "
            "compiles the model. Leave enforce_eager out (or False) with pipeline parallel.",
            option="enforce_eager",
            value=True,
        )
    if not facts.allowed_cpus:
        return
    ranks = tp * pp
    local_dp = int(user.get("data_parallel_size_local") or _size(user, "data_parallel_size"))
    cpus = len(facts.allowed_cpus)
    if ranks * local_dp > cpus:
        sizes = {
            "tensor_parallel_size": tp,
            "pipeline_parallel_size": pp,
            "data_parallel_size": local_dp,
        }
        option = max(sizes, key=sizes.__getitem__)  # the largest: lowering it helps most
        raise ParallelLayoutError(
            f"tensor_parallel_size={tp} x pipeline_parallel_size={pp} x data_parallel_size "
            f"(local)={local_dp} "
            f"needs {ranks * local_dp} CPU workers, one CPU at least each, but this process may "
            f"use {cpus} CPU(s) ({list(facts.allowed_cpus)}). Lower {option}, or run on more "
            "CPUs.",
            option=option,
            value=sizes[option],
        )


def _thread_binding(user: Mapping[str, Any], facts: MachineFacts) -> Choice | None:
    """A CPU set per tensor/pipeline-parallel rank, when vLLM's automatic binding would refuse."""
    ranks = _size(user, "tensor_parallel_size") * _size(user, "pipeline_parallel_size")
    if ranks == 1 or facts.threads_bind not in (None, "", "auto"):
        return None  # one rank needs no binding; a binding the user set wins
    local_dp = int(user.get("data_parallel_size_local") or _size(user, "data_parallel_size"))
    if facts.memory_nodes is not None and facts.memory_nodes >= ranks * local_dp:
        return None  # vLLM binds one NUMA node per rank itself
    cpus = sorted(facts.allowed_cpus)
    workers = ranks * local_dp
    # One CPU is left to the engine core's scheduler and this process when there is one to
    # spare (vLLM's automatic binding reserves CPUs for them too); the rest is split evenly.
    per = (len(cpus) - (1 if len(cpus) > workers else 0)) // workers
    groups = [cpus[i * per : (i + 1) * per] for i in range(workers)]
    value = "|".join(",".join(str(c) for c in group) for group in groups)
    return Choice(
        "VLLM_CPU_OMP_THREADS_BIND",
        value,
        f"{workers} CPU workers and {facts.memory_nodes or 1} NUMA node(s): vLLM's automatic "
        f"binding needs a node per worker, so {per} of the CPUs {cpus} each",
        env=True,
    )


def choose_engine_kwargs(
    user_kwargs: Mapping[str, Any], facts: MachineFacts, planned: Sequence[Choice] = ()
) -> PlatformDefaults:
    """The engine options for these facts: the user's, plus CPU defaults for what is unset.

    On a CPU, for each option the user did not set: ``dtype`` (bfloat16 when the CPU has bf16
    instructions, else float32), ``kv_cache_memory_bytes`` (a few full-length sequences, at most
    half of the free memory left after the weights, at most 4 GiB; ``max_model_len`` is lowered
    when even one sequence does not fit) and ``enforce_eager=True``; for more than one tensor or
    pipeline-parallel rank, ``VLLM_CPU_OMP_THREADS_BIND`` in the engine processes' environment.
    ``planned``: the memory options of a plan for engines started together
    (:mod:`.memory_plan`), in place of the KV-cache choice, on a GPU too.
    Raises :class:`InsufficientMemoryError` when the user asks for more memory than is free, and
    :class:`ParallelLayoutError` for a parallel layout that cannot run here.
    """
    planned = [c for c in planned if c.name not in user_kwargs]  # the user's own options win
    kwargs = {**user_kwargs, **{c.name: c.value for c in planned}}
    _check_layout(user_kwargs, facts)
    if not facts.is_cpu:
        return PlatformDefaults(kwargs=kwargs, chosen=tuple(planned), facts=facts)
    _check_user_memory(kwargs, facts)
    chosen: list[Choice] = []
    dtype_choice = _dtype(user_kwargs, facts)
    if dtype_choice is not None:
        chosen.append(dtype_choice)
    chosen.extend(planned)
    chosen.extend(c for c in _kv_cache(kwargs, facts, start_dtype(user_kwargs, facts)) if c)
    if "enforce_eager" not in user_kwargs:
        if _size(user_kwargs, "pipeline_parallel_size") > 1:
            reason = "pipeline parallel on a CPU needs the compiled model (see _check_layout)"
            chosen.append(Choice("enforce_eager", False, reason))
        else:
            reason = "compiling the model adds minutes to a CPU start"
            chosen.append(Choice("enforce_eager", True, reason))
    binding = _thread_binding(user_kwargs, facts)
    if binding is not None:
        chosen.append(binding)
    kwargs.update({c.name: c.value for c in chosen if not c.env})
    environment = {c.name: str(c.value) for c in chosen if c.env}
    return PlatformDefaults(
        kwargs=kwargs, environment=environment, chosen=tuple(chosen), facts=facts
    )
