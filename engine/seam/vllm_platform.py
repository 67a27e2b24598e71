"""vLLM's view of the machine: the facts the CPU defaults are chosen from.

Imported only when an engine starts (it imports vLLM and torch). The choices themselves are made
by the pure :func:`vllm_inline.engine.life.platform_defaults.choose_engine_kwargs`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from vllm import AsyncEngineArgs
from vllm.platforms import current_platform

__all__ = ["block_size", "is_cpu", "measure_facts"]


def is_cpu() -> bool:
    """True on vLLM's CPU platform."""
    return bool(current_platform.is_cpu())


def _cpu_flags() -> frozenset[str]:
    """The CPU's feature flags: ``/proc/cpuinfo`` (x86 ``flags``, Arm ``Features``), plus the
    AVX-512 BF16 test vLLM's CPU backend itself uses (``torch.cpu._is_avx512_bf16_supported``)."""
    flags: set[str] = set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    flags.update(value.split())
                    break
    except OSError:
        pass
    import torch

    probe = getattr(torch.cpu, "_is_avx512_bf16_supported", None)
    if callable(probe) and probe():
        flags.add("avx512_bf16")
    return frozenset(flags)


def _weights_bytes(model: str) -> int | None:
    """Size of the checkpoint's weight files: a local directory, or a hub id already cached."""
    path = os.path.expanduser(model)
    if not os.path.isdir(path):
        try:
            from huggingface_hub import snapshot_download

            path = snapshot_download(model, local_files_only=True)
        except Exception:  # noqa: BLE001 - not cached: the size is unknown, not an error
            return None
    sizes = {ext: 0 for ext in (".safetensors", ".bin", ".pt")}
    for name in os.listdir(path):
        ext = os.path.splitext(name)[1]
        if ext in sizes:
            sizes[ext] += os.path.getsize(os.path.join(path, name))
    # A repository can hold both formats; vLLM loads one (safetensors first).
    return next((size for size in sizes.values() if size), None)


def block_size(kwargs: Mapping[str, Any]) -> int:
    """The KV block size the engine will have: the ``block_size`` option, else vLLM's default
    (``CacheConfig.DEFAULT_BLOCK_SIZE``: 16 up to 0.33, 64 from 0.34), read from vLLM rather
    than assumed. (vLLM's CPU platform overrides it for MLA models, to 16, a divisor of both.)"""
    from vllm.config import CacheConfig

    return int(kwargs.get("block_size") or CacheConfig.DEFAULT_BLOCK_SIZE)


def _model_facts(model: str, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """KV elements per token, context window and checkpoint dtype, from vLLM's ModelConfig."""
    from vllm.config import ParallelConfig

    config = AsyncEngineArgs(model=model, **kwargs).create_model_config()
    parallel = ParallelConfig()
    layers = config.get_num_layers_by_block_type(parallel, "attention")
    if config.use_mla:
        elements = layers * config.get_head_size()  # one latent vector per token, no separate V
    else:
        elements = 2 * layers * config.get_total_num_kv_heads() * config.get_head_size()
    text_config = config.hf_text_config
    dtype = getattr(text_config, "dtype", None) or getattr(text_config, "torch_dtype", None)
    return {
        "attention_heads": int(config.model_arch_config.total_num_attention_heads),
        "kv_elements_per_token": int(elements),
        "model_max_len": int(config.max_model_len),
        "checkpoint_dtype": str(dtype).replace("torch.", "") if dtype is not None else None,
    }


def measure_facts(model: str, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The device and the model as the engine's choices need them, measured now.

    On a CPU: the memory node vLLM's CPU worker allocates on, the CPUs, the checkpoint. On a
    GPU: the first device's free and total memory through NVML (as vLLM's ``NvmlCudaPlatform``
    reads it, without a CUDA context in this process) and the checkpoint, for
    :mod:`vllm_inline.engine.life.memory_plan`.
    """
    try:
        model_facts = _model_facts(model, kwargs)
    except Exception as e:  # noqa: BLE001 - vLLM's own start reports a bad config better
        import logging

        logging.getLogger("vllm_inline").debug("model facts unavailable: %r", e)
        model_facts = {}
    if not current_platform.is_cpu():
        free, total = _gpu_memory()
        return {
            "is_cpu": False, "free_memory_bytes": free, "total_memory_bytes": total,
            "weights_bytes": _weights_bytes(model), "block_size": block_size(kwargs),
            **model_facts,
        }  # fmt: skip
    from vllm.utils.cpu_resource_utils import get_memory_node_info, get_visible_memory_node

    node = get_memory_node_info(0)  # the node vLLM's CPU worker checks and allocates on
    return {
        "is_cpu": True,
        "allowed_cpus": tuple(sorted(os.sched_getaffinity(0))),
        "memory_nodes": len(get_visible_memory_node()),
        "threads_bind": os.environ.get("VLLM_CPU_OMP_THREADS_BIND"),
        "free_memory_bytes": int(node.available_memory),
        "total_memory_bytes": int(node.total_memory),
        "cpu_flags": _cpu_flags(),
        "weights_bytes": _weights_bytes(model),
        "block_size": block_size(kwargs),
        **model_facts,
    }


def _gpu_memory() -> tuple[int | None, int | None]:
    """Free and total bytes of the first visible GPU, or ``(None, None)`` where NVML cannot
    tell (then nothing is planned: each engine sizes itself)."""
    try:
        from vllm.utils.import_utils import import_pynvml

        pynvml = import_pynvml()  # type: ignore[no-untyped-call]  # unannotated in vLLM
        pynvml.nvmlInit()
        try:
            visible = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0] or "0"
            handle = pynvml.nvmlDeviceGetHandleByIndex(int(visible))
            info = pynvml.nvmlDeviceGetMemoryInfo(handle)
            return int(info.free), int(info.total)
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no NVML (another accelerator): leave memory unplanned
        return None, None
