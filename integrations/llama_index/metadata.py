"""What ``VLLM.metadata`` says beyond LlamaIndex's ``LLMMetadata``: whether the model takes
images, answered without starting an engine when it can be.
"""

from __future__ import annotations

import json
import os

from llama_index.core.base.llms.types import LLMMetadata
from llama_index.core.bridge.pydantic import Field

from vllm_inline.engine import Engine

__all__ = ["MultimodalLLMMetadata", "takes_images"]


class MultimodalLLMMetadata(LLMMetadata):
    """``LLMMetadata`` plus whether the model takes images (llama-index-core 0.14 has no field
    for it; multimodal input goes through ``ImageBlock``s in ``ChatMessage.blocks``)."""

    is_multimodal: bool = Field(
        default=False,
        description="True when the model takes ImageBlocks (a vision-language model).",
    )


def takes_images(engine: Engine, model: str) -> bool:
    """Whether ``model`` takes images: the running engine's answer; before it starts, whether the
    local model directory's ``config.json`` has a ``vision_config`` (a hub id counts as
    text-only until its engine runs). Starts nothing."""
    if engine.started:
        return bool(engine.accepts_images)
    try:
        with open(os.path.join(os.path.expanduser(model), "config.json"), encoding="utf-8") as f:
            return "vision_config" in json.load(f)
    except (OSError, ValueError):
        return False
