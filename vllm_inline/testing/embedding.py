"""A tiny local embedding model: a real checkpoint that vLLM's pooling runner loads like any other.

:func:`build_embedding_model` writes a sentence-transformers style directory: a ``LlamaModel``
(the architecture of gte-Qwen/e5-mistral style embedders: no LM head, so vLLM picks the pooling
runner by itself) with random weights drawn from a fixed seed, a small byte-level BPE tokenizer,
and ``modules.json`` + ``1_Pooling/config.json`` + a ``Normalize`` module, from which vLLM reads
**mean pooling** and **L2 normalisation** (``PoolerConfig.seq_pooling_type="MEAN"``,
``use_activation=True``). Without those two files vLLM's defaults for a ``LlamaModel`` are
last-token pooling and normalisation.

The token embeddings are large (standard deviation 1) and every other weight small (0.02), so the
residual stream is mostly the token's own embedding and a mean-pooled vector is close to a bag of
words: texts that share words have similar vectors, and a retrieval query finds the document it
shares words with (what the RAG tests need), while the attention layers still mix context in
(so batching bugs that mix sequences would show).

Hidden size 128 = 2 heads of 64 (:mod:`.random_llama` holds what it shares with the reranker). Building takes
well under a second (numpy, ``tokenizers`` and ``safetensors``; no torch) and is safe when
several processes build at once. Like the scripted models, it is cached under
:func:`~vllm_inline.testing.default_root` by a digest of the kit's sources.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib

from .cache import build_once, kit_digest
from .random_llama import llama_config, llama_layers, train_tokenizer

__all__ = ["EMBEDDING_HIDDEN_SIZE", "build_embedding_model"]

EMBEDDING_HIDDEN_SIZE = 128
"""Vector size of the built model (its hidden size)."""

_BUILD_VERSION = "1"
_HEADS = 2
_LAYERS = 2
_INTERMEDIATE = 256
_VOCAB = 600
_SEED = 1234


def _digest() -> str:
    return hashlib.sha256(f"{_BUILD_VERSION}:{kit_digest()}".encode()).hexdigest()[:16]


def build_embedding_model(root: str | os.PathLike[str] | None = None) -> pathlib.Path:
    """Build (or reuse) the tiny embedding model under ``root`` and return its directory.

    ``root`` defaults to the scripted models' cache (:func:`~vllm_inline.testing.default_root`).
    The directory is written to a temporary name and renamed into place, so one that exists is
    complete.
    """
    return build_once(root, f"embedder-{_digest()}", "modules.json", _write_model)


def _write_model(out: pathlib.Path) -> None:
    import numpy as np
    from safetensors.numpy import save_file
    from tokenizers import processors

    tok = train_tokenizer(_VOCAB, ("<pad>", "</s>"))
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    vocab = tok.get_vocab_size(with_added_tokens=True)
    hidden = EMBEDDING_HIDDEN_SIZE
    rng = np.random.default_rng(_SEED)
    tensors = {"embed_tokens.weight": rng.standard_normal((vocab, hidden)).astype(np.float32)}
    tensors.update(
        llama_layers(
            rng,
            prefix="",
            layers=_LAYERS,
            hidden=hidden,
            heads=_HEADS,
            intermediate=_INTERMEDIATE,
            attention_std=(0.02, 0.02, 0.02, 0.02),
            mlp_std=0.02,
        )
    )
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})

    pad, eos = tok.token_to_id("<pad>"), tok.token_to_id("</s>")
    config = llama_config(
        architecture="LlamaModel",
        vocab=vocab,
        hidden=hidden,
        heads=_HEADS,
        intermediate=_INTERMEDIATE,
        layers=_LAYERS,
        bos=eos,
        eos=eos,
        pad=pad,
    )
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": "</s>",
        "pad_token": "<pad>",
        "clean_up_tokenization_spaces": False,
        "model_max_length": 2048,
    }
    pooling = {
        "word_embedding_dimension": hidden,
        "pooling_mode_cls_token": False,
        "pooling_mode_mean_tokens": True,
        "pooling_mode_max_tokens": False,
        "pooling_mode_lasttoken": False,
    }
    modules = [
        {"idx": i, "name": str(i), "path": path, "type": f"sentence_transformers.models.{kind}"}
        for i, (path, kind) in enumerate(
            (("", "Transformer"), ("1_Pooling", "Pooling"), ("2_Normalize", "Normalize"))
        )
    ]
    tok.save(str(out / "tokenizer.json"))
    (out / "1_Pooling").mkdir()
    (out / "2_Normalize").mkdir()
    for name, obj in (
        ("config.json", config),
        ("tokenizer_config.json", tokenizer_config),
        ("1_Pooling/config.json", pooling),
        ("modules.json", modules),  # written last: its presence marks a complete build
    ):
        (out / name).write_text(json.dumps(obj, indent=2) + "\n")
