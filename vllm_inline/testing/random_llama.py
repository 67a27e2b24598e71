"""The parts the random-weight kit models share: a small BPE tokenizer, Llama weights, config.

:mod:`.embedding` (a ``LlamaModel`` embedder) and :mod:`.reranker` (a
``LlamaForSequenceClassification`` cross-encoder) differ in their head, their weight scales and
their tokenizer's pair template; the rest is here. Heavy imports (``tokenizers``) happen inside
the functions; the weights are numpy arrays drawn from the caller's generator.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["CORPUS", "HEAD_DIM", "llama_config", "llama_layers", "train_tokenizer"]

HEAD_DIM = 64
"""Attention head size (the CPU attention kernel rejects head_dim 16)."""

CORPUS = (
    "The weather in Oslo is cold and snowy in winter. Paris is the capital of France. "
    "Python is a programming language. Cats and dogs are pets. The river flows to the sea. "
    "vLLM runs large language models fast. LangChain and LlamaIndex build retrieval apps. "
    "What is the capital of France? How is the weather today? Tell me about pets. "
    "Bananas are yellow fruit. The train leaves the station at noon. Mountains are tall.\n"
)
"""What the tokenizers are trained on: the words the retrieval and reranking tests use."""


def train_tokenizer(vocab_size: int, specials: Sequence[str]) -> Any:
    """A byte-level BPE of ``vocab_size`` tokens in all, ``specials`` (added last) included."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(specials),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([CORPUS] * 4, trainer)
    tok.add_special_tokens([AddedToken(t, special=True) for t in specials])
    return tok


def llama_layers(
    rng: Any,
    *,
    prefix: str,
    layers: int,
    hidden: int,
    heads: int,
    intermediate: int,
    attention_std: tuple[float, float, float, float],
    mlp_std: float,
) -> dict[str, Any]:
    """Random weights of ``layers`` Llama decoder layers and the final norm, named under
    ``prefix`` (``""`` for a ``LlamaModel``, ``"model."`` under a head). ``attention_std`` is
    the standard deviation of q, k, v and o; RMSNorm weights are 1."""
    import numpy as np

    def normal(std: float, *shape: int) -> Any:
        return (rng.standard_normal(shape) * std).astype(np.float32)

    width = heads * HEAD_DIM
    q, k, v, o = attention_std
    tensors: dict[str, Any] = {}
    for i in range(layers):
        p = f"{prefix}layers.{i}."
        tensors.update(
            {
                p + "input_layernorm.weight": np.ones(hidden, np.float32),
                p + "self_attn.q_proj.weight": normal(q, width, hidden),
                p + "self_attn.k_proj.weight": normal(k, width, hidden),
                p + "self_attn.v_proj.weight": normal(v, width, hidden),
                p + "self_attn.o_proj.weight": normal(o, hidden, width),
                p + "post_attention_layernorm.weight": np.ones(hidden, np.float32),
                p + "mlp.gate_proj.weight": normal(mlp_std, intermediate, hidden),
                p + "mlp.up_proj.weight": normal(mlp_std, intermediate, hidden),
                p + "mlp.down_proj.weight": normal(mlp_std, hidden, intermediate),
            }
        )
    tensors[prefix + "norm.weight"] = np.ones(hidden, np.float32)
    return tensors


def llama_config(
    *,
    architecture: str,
    vocab: int,
    hidden: int,
    heads: int,
    intermediate: int,
    layers: int,
    bos: int,
    eos: int,
    pad: int,
    **extra: Any,
) -> dict[str, Any]:
    """``config.json`` of a float32 Llama with these sizes; ``extra`` adds or replaces keys."""
    return {
        "architectures": [architecture],
        "model_type": "llama",
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": heads,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "bos_token_id": bos,
        "eos_token_id": eos,
        "pad_token_id": pad,
        "torch_dtype": "float32",
        "dtype": "float32",
        **extra,
    }
