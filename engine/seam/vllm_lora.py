"""vLLM's LoRA API as :mod:`vllm_inline.engine.request.lora` uses it: requests, adapters loaded
outside a batch, and the base model's empty adapter on the CPU. Imported only when an adapter or the
base model is asked for on a LoRA engine."""

from __future__ import annotations

from vllm.lora.request import LoRARequest
from vllm.platforms import current_platform
from vllm.v1.engine.async_llm import AsyncLLM

__all__ = ["add_lora", "base_lora_request", "lora_enabled", "make_lora_request"]

_BASE_LORA_ID = 2**31 - 1  # far above the ids .lora hands out (1, 2, ...)
_base_adapter_dir: str | None = None


def lora_enabled(llm: AsyncLLM) -> bool:
    """True when the engine was started with ``enable_lora``."""
    return llm.vllm_config.lora_config is not None


def make_lora_request(name: str, lora_id: int, path: str) -> LoRARequest:
    return LoRARequest(name, lora_id, path)


async def add_lora(llm: AsyncLLM, request: LoRARequest) -> None:
    """Load an adapter into the engine outside any batch: a bad adapter fails this call with
    a bare ``Exception`` (the worker's message) and the engine keeps serving, whereas the same
    adapter first met inside a batch kills the engine core."""
    await llm.add_lora(request)


def base_lora_request(llm: AsyncLLM) -> LoRARequest | None:
    """What a base-model request passes as ``lora_request``: ``None``, except on the CPU.

    vLLM's CPU LoRA kernels (``vllm/lora/ops/torch_ops``, 0.32) read the "no adapter" index -1
    as the last adapter slot, so a base-model request batched next to adapter requests silently
    gets an adapter's weights (vllm-project/vllm PRs #48421, #49656, open). On the CPU the base
    model therefore runs through an adapter with no weights, in the extra slot
    :func:`start_engine` reserved: no request ever carries index -1.
    """
    if not lora_enabled(llm) or not current_platform.is_cpu():
        return None
    return LoRARequest("vllm-inline-base", _BASE_LORA_ID, _base_adapter())


def _base_adapter() -> str:
    """A PEFT adapter directory whose weights change nothing, in this process's owner directory
    (:mod:`.ipc_directory`), so it goes with the engine's other files however the process ends
    (a file of the temporary directory with an ``atexit`` stayed behind when a signal ended the
    process: ``serve`` re-raises SIGTERM once down). Made again if that directory was."""
    global _base_adapter_dir
    import os

    if _base_adapter_dir is not None and os.path.isdir(_base_adapter_dir):
        return _base_adapter_dir
    import json

    import numpy as np
    from safetensors.numpy import save_file

    from vllm_inline.engine.seam import ipc_directory

    owner = ipc_directory.owner_directory()
    if owner.startswith("@"):  # no directory could be made: the temporary one, for this run
        import atexit
        import shutil
        import tempfile

        path = tempfile.mkdtemp(prefix="vllm-inline-base-lora-")
        atexit.register(shutil.rmtree, path, True)
    else:
        path = os.path.join(owner, "base-lora")
        os.makedirs(path, mode=0o700, exist_ok=True)
    config = {"peft_type": "LORA", "r": 1, "lora_alpha": 1, "target_modules": ["o_proj"]}
    with open(os.path.join(path, "adapter_config.json"), "w") as f:
        json.dump(config, f)
    # vLLM needs one tensor; zeros on a module no model has: the slot stays all zero.
    zero = np.zeros((1, 1), np.float32)
    prefix = "base_model.model.vllm_inline_base.o_proj"
    tensors = {f"{prefix}.lora_A.weight": zero, f"{prefix}.lora_B.weight": zero}
    save_file(tensors, os.path.join(path, "adapter_model.safetensors"))
    _base_adapter_dir = path
    return path
