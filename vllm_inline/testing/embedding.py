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

Hidden size 128 = 2 heads of 64 (the CPU attention kernel rejects head_dim 16). Building takes
well under a second (numpy, ``tokenizers`` and ``safetensors``; no torch) and is safe when
several processes build at once. Like the scripted models, it is cached under
:func:`~vllm_inline.testing.default_root` by a digest of the kit's sources.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
from typing import Any

from .cache import build_once, kit_digest

__all__ = ["EMBEDDING_HIDDEN_SIZE", "build_embedding_model"]

EMBEDDING_HIDDEN_SIZE = 128
"""Vector size of the built model (its hidden size)."""

_BUILD_VERSION = "1"
_HEADS = 2
_HEAD_DIM = 64
_LAYERS = 2
_INTERMEDIATE = 256
_VOCAB = 600
_SEED = 1234
_CORPUS = (
    "The weather in Oslo is cold and snowy in winter. Paris is the capital of France. "
    "Python is a programming language. Cats and dogs are pets. The river flows to the sea. "
    "vLLM runs large language models fast. LangChain and LlamaIndex build retrieval apps. "
    "What is the capital of France? How is the weather today? Tell me about pets. "
    "Bananas are yellow fruit. The train leaves the station at noon. Mountains are tall.\n"
)


def _digest() -> str:
    return hashlib.sha256(f"{_BUILD_VERSION}:{kit_digest()}".encode()).hexdigest()[:16]


def build_embedding_model(root: str | os.PathLike[str] | None = None) -> pathlib.Path:
    """Build (or reuse) the tiny embedding model under ``root`` and return its directory.

    ``root`` defaults to the scripted models' cache (:func:`~vllm_inline.testing.default_root`).
    The directory is written to a temporary name and renamed into place, so one that exists is
    complete.
    """
    return build_once(root, f"embedder-{_digest()}", "modules.json", _write_model)


def _build_tokenizer() -> Any:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors
    from tokenizers import trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=_VOCAB - 2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([_CORPUS] * 4, trainer)
    tok.add_special_tokens([AddedToken(t, special=True) for t in ("<pad>", "</s>")])
    return tok


def _write_model(out: pathlib.Path) -> None:
    import numpy as np
    from safetensors.numpy import save_file

    tok = _build_tokenizer()
    vocab = tok.get_vocab_size(with_added_tokens=True)
    hidden, heads = EMBEDDING_HIDDEN_SIZE, _HEADS * _HEAD_DIM
    rng = np.random.default_rng(_SEED)

    def small(*shape: int) -> Any:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    tensors = {"embed_tokens.weight": rng.standard_normal((vocab, hidden)).astype(np.float32)}
    for i in range(_LAYERS):
        p = f"layers.{i}."
        tensors.update({
            p + "input_layernorm.weight": np.ones(hidden, np.float32),
            p + "self_attn.q_proj.weight": small(heads, hidden),
            p + "self_attn.k_proj.weight": small(heads, hidden),
            p + "self_attn.v_proj.weight": small(heads, hidden),
            p + "self_attn.o_proj.weight": small(hidden, heads),
            p + "post_attention_layernorm.weight": np.ones(hidden, np.float32),
            p + "mlp.gate_proj.weight": small(_INTERMEDIATE, hidden),
            p + "mlp.up_proj.weight": small(_INTERMEDIATE, hidden),
            p + "mlp.down_proj.weight": small(hidden, _INTERMEDIATE),
        })
    tensors["norm.weight"] = np.ones(hidden, np.float32)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})

    pad, eos = tok.token_to_id("<pad>"), tok.token_to_id("</s>")
    config = {
        "architectures": ["LlamaModel"],
        "model_type": "llama",
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": _INTERMEDIATE,
        "num_hidden_layers": _LAYERS,
        "num_attention_heads": _HEADS,
        "num_key_value_heads": _HEADS,
        "head_dim": _HEAD_DIM,
        "hidden_act": "silu",
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "bos_token_id": eos,
        "eos_token_id": eos,
        "pad_token_id": pad,
        "torch_dtype": "float32",
        "dtype": "float32",
    }
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

