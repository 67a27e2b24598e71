"""A tiny local vision-language model: a random-weight Idefics3 (the SmolVLM architecture).

:func:`build_vision_model` writes a complete Hugging Face directory that vLLM and
``transformers`` both load: ``Idefics3ForConditionalGeneration`` with random weights from a
fixed seed, a small byte-level BPE tokenizer with Idefics3's special tokens, Idefics3's chat
template, and an ``Idefics3Processor`` whose image processor is the PIL one
(``Idefics3ImageProcessorPil``), so neither side needs torchvision.

Sizes: the vision tower has 1 layer, hidden size 64, 1 head, 64-pixel tiles of 16-pixel patches;
``scale_factor=2`` turns a tile's 16 patches into 4 image tokens. The text model is a Llama with
1 layer, hidden size 256 and 4 heads of 64 (the CPU attention kernel rejects smaller heads). An
image is resized to at most 128 pixels and split into 64-pixel tiles plus a global view, so a
square image costs 5 x 4 ``<image>`` tokens with their row/column markers.

Its output is noise, but deterministic noise: greedy decoding gives the same ids in vLLM and in
``transformers.generate`` on the same directory, and two different images give different ids,
which is what an end-to-end test of image input needs. Unlike the scripted models this builder
needs ``torch`` and ``transformers`` (it builds in a few seconds); it is cached under
:func:`~vllm_inline.testing.default_root` by a digest of the kit's sources.

Engine options: :data:`VISION_ENGINE_KWARGS` (float32, eager, a 512-token context, a 128 MiB KV
cache, one image per prompt by default in vLLM's profiling: see ``docs/multimodal.md``).
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
from typing import Any

from .cache import build_once, kit_digest
from .harness import CPU_TEST_ENGINE_KWARGS

__all__ = ["IDEFICS3_CHAT_TEMPLATE", "VISION_ENGINE_KWARGS", "build_vision_model"]

IDEFICS3_CHAT_TEMPLATE = (
    "<|begin_of_text|>{% for message in messages %}{{message['role'] | capitalize}}"
    "{% if message['content'][0]['type'] == 'image' %}{{':'}}{% else %}{{': '}}{% endif %}"
    "{% for line in message['content'] %}{% if line['type'] == 'text' %}{{line['text']}}"
    "{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}"
    "<end_of_utterance>\n{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)
"""Idefics3's chat template (HuggingFaceM4/Idefics3-8B-Llama3): content is a list of parts,
``{"type": "image"}`` becomes ``<image>``, which the processor expands into image tokens."""

VISION_ENGINE_KWARGS: dict[str, Any] = {
    **CPU_TEST_ENGINE_KWARGS,
    "limit_mm_per_prompt": {"image": 2},
}
"""vLLM engine options for the tiny Idefics3 on a CPU: :data:`CPU_TEST_ENGINE_KWARGS` and at most
two images per prompt (vLLM profiles memory for the limit; a third image is refused)."""

_BUILD_VERSION = "1"
_SEED = 16
_VOCAB = 512
_TEXT_HIDDEN = 256
_HEADS = 4
_HEAD_DIM = 64
_SPECIALS = ("<|begin_of_text|>", "<end_of_utterance>", "<fake_token_around_image>", "<image>")
_MARKERS = ("<global-img>", *(f"<row_{i}_col_{j}>" for i in range(1, 7) for j in range(1, 7)))
_CORPUS = (
    "User: What is in this image? Describe the picture in one sentence.\n"
    "Assistant: A red square on a blue background. The weather in Oslo is sunny. "
    "System: You are a helpful assistant. Tool: the answer is 42. Hello! Thanks.\n"
)


def _digest() -> str:
    return hashlib.sha256(f"{_BUILD_VERSION}:{kit_digest()}".encode()).hexdigest()[:16]


def build_vision_model(root: str | os.PathLike[str] | None = None) -> pathlib.Path:
    """Build (or reuse) the tiny Idefics3 under ``root`` and return its directory.

    ``root`` defaults to :func:`~vllm_inline.testing.default_root`. Needs ``torch`` and
    ``transformers`` (not torchvision); takes a few seconds the first time.
    """
    return build_once(root, f"idefics3-{_digest()}", "vision.json", _write_model)


def _build_tokenizer() -> Any:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=_VOCAB - len(_SPECIALS) - len(_MARKERS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(_CORPUS) * 4, trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in _SPECIALS])
    # As in Idefics3's own tokenizer, the tile markers are added tokens but not special ones.
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in _MARKERS])
    fast = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]  # unannotated in transformers
        tokenizer_object=tok,
        bos_token="<|begin_of_text|>",
        eos_token="<end_of_utterance>",
        pad_token="<end_of_utterance>",
        clean_up_tokenization_spaces=False,
        model_max_length=4096,
    )
    fast.chat_template = IDEFICS3_CHAT_TEMPLATE
    return fast


def _write_model(out: pathlib.Path) -> None:
    import torch
    from transformers import (
        GenerationConfig,
        Idefics3Config,
        Idefics3ForConditionalGeneration,
        Idefics3Processor,
    )
    from transformers.models.idefics3.image_processing_pil_idefics3 import (
        Idefics3ImageProcessorPil,
    )

    tokenizer = _build_tokenizer()
    vocab = len(tokenizer)
    ids = tokenizer.convert_tokens_to_ids
    text_config = {
        "model_type": "llama",
        "vocab_size": vocab,
        "hidden_size": _TEXT_HIDDEN,
        "intermediate_size": 512,
        "num_hidden_layers": 1,
        "num_attention_heads": _HEADS,
        "num_key_value_heads": _HEADS,
        "head_dim": _HEAD_DIM,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-5,
        "bos_token_id": ids("<|begin_of_text|>"),
        "eos_token_id": ids("<end_of_utterance>"),
        "pad_token_id": ids("<end_of_utterance>"),
        "tie_word_embeddings": False,
    }
    vision_config = {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 1,
        "num_attention_heads": 1,
        "image_size": 64,
        "patch_size": 16,
    }
    config = Idefics3Config(
        vision_config=vision_config,
        text_config=text_config,
        scale_factor=2,
        image_token_id=ids("<image>"),
        pad_token_id=ids("<end_of_utterance>"),
        tie_word_embeddings=False,
    )
    torch.manual_seed(_SEED)
    # transformers leaves these constructors unannotated, and types .to() for its own models.
    model: Any = Idefics3ForConditionalGeneration(config)  # type: ignore[no-untyped-call]
    model = model.to(torch.float32).eval()
    model.generation_config = GenerationConfig(  # type: ignore[no-untyped-call]  # as above
        bos_token_id=ids("<|begin_of_text|>"),
        eos_token_id=ids("<end_of_utterance>"),
        pad_token_id=ids("<end_of_utterance>"),
        # Plain greedy decoding by default, in vLLM (vllm-inline's default is 1.1) and in
        # transformers, so that both give the same ids.
        repetition_penalty=1.0,
    )
    model.save_pretrained(str(out), safe_serialization=True)
    image_processor = Idefics3ImageProcessorPil(
        size={"longest_edge": 128}, max_image_size={"longest_edge": 64}
    )
    processor = Idefics3Processor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        image_seq_len=4,
        chat_template=IDEFICS3_CHAT_TEMPLATE,
    )
    processor.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    manifest = {
        "architecture": "Idefics3ForConditionalGeneration",
        "seed": _SEED,
        "vocab_size": vocab,
    }
    (out / "vision.json").write_text(json.dumps(manifest, indent=2) + "\n")  # last: marks complete
