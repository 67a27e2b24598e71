"""A tiny local reranker: a cross-encoder checkpoint that vLLM's pooling runner scores with.

:func:`build_reranker_model` writes a ``LlamaForSequenceClassification`` directory with one label
(``num_labels=1``: one relevance logit per query-document pair, the shape vLLM's score API and
``/rerank`` accept), ``pad_token_id`` set (transformers needs it to find the last token of a
padded batch), random float32 weights drawn from a fixed seed, and a small byte-level BPE
tokenizer whose pair template is ``<s> query </s> document </s>``. vLLM builds the pair prompt the
way sentence-transformers' ``CrossEncoder`` does, ``tokenizer(query, document)``, so that
template is what the model sees; the score is the sigmoid of the last token's logit (vLLM's
default activation for one label).

The scores carry no meaning, but they differ from document to document (the attention weights
are large enough for the last token to see the whole pair) and equal transformers'
``AutoModelForSequenceClassification`` on the same pairs, which is what tests of ordering need.

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

__all__ = ["build_reranker_model"]

_BUILD_VERSION = "1"
_HIDDEN = 128
_HEADS = 2
_HEAD_DIM = 64
_LAYERS = 2
_INTERMEDIATE = 256
_VOCAB = 600
_SEED = 4321
_CORPUS = (
    "The weather in Oslo is cold and snowy in winter. Paris is the capital of France. "
    "Python is a programming language. Cats and dogs are pets. The river flows to the sea. "
    "vLLM runs large language models fast. LangChain and LlamaIndex build retrieval apps. "
    "What is the capital of France? How is the weather today? Tell me about pets. "
    "Bananas are yellow fruit. The train leaves the station at noon. Mountains are tall.\n"
)


def _digest() -> str:
    return hashlib.sha256(f"{_BUILD_VERSION}:{kit_digest()}".encode()).hexdigest()[:16]


def build_reranker_model(root: str | os.PathLike[str] | None = None) -> pathlib.Path:
    """Build (or reuse) the tiny reranker under ``root`` and return its directory.

    ``root`` defaults to the scripted models' cache (:func:`~vllm_inline.testing.default_root`).
    The directory is written to a temporary name and renamed into place, so one that exists is
    complete.
    """
    return build_once(root, f"reranker-{_digest()}", "config.json", _write_model)


def _build_tokenizer() -> Any:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors
    from tokenizers import trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=_VOCAB - 3,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([_CORPUS] * 4, trainer)
    tok.add_special_tokens([AddedToken(t, special=True) for t in ("<pad>", "<s>", "</s>")])
    bos, eos = tok.token_to_id("<s>"), tok.token_to_id("</s>")
    # The cross-encoder pair layout (BERT's [CLS] a [SEP] b [SEP], with Llama-style markers).
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>",
        pair="<s> $A </s> $B:1 </s>:1",
        special_tokens=[("<s>", bos), ("</s>", eos)],
    )
    return tok


def _write_model(out: pathlib.Path) -> None:
    import numpy as np
    from safetensors.numpy import save_file

    tok = _build_tokenizer()
    vocab = tok.get_vocab_size(with_added_tokens=True)
    hidden, heads = _HIDDEN, _HEADS * _HEAD_DIM
    rng = np.random.default_rng(_SEED)

    def normal(std: float, *shape: int) -> Any:
        return (rng.standard_normal(shape) * std).astype(np.float32)

    # Large attention weights: the last token's state (what the score head reads) then
    # depends on every token of the pair, so different documents get different scores.
    tensors = {"model.embed_tokens.weight": normal(1.0, vocab, hidden)}
    for i in range(_LAYERS):
        p = f"model.layers.{i}."
        tensors.update({
            p + "input_layernorm.weight": np.ones(hidden, np.float32),
            p + "self_attn.q_proj.weight": normal(0.1, heads, hidden),
            p + "self_attn.k_proj.weight": normal(0.1, heads, hidden),
            p + "self_attn.v_proj.weight": normal(0.2, heads, hidden),
            p + "self_attn.o_proj.weight": normal(0.2, hidden, heads),
            p + "post_attention_layernorm.weight": np.ones(hidden, np.float32),
            p + "mlp.gate_proj.weight": normal(0.05, _INTERMEDIATE, hidden),
            p + "mlp.up_proj.weight": normal(0.05, _INTERMEDIATE, hidden),
            p + "mlp.down_proj.weight": normal(0.05, hidden, _INTERMEDIATE),
        })
    tensors["model.norm.weight"] = np.ones(hidden, np.float32)
    tensors["score.weight"] = normal(0.2, 1, hidden)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})

    pad, bos, eos = (tok.token_to_id(t) for t in ("<pad>", "<s>", "</s>"))
    config = {
        "architectures": ["LlamaForSequenceClassification"],
        "model_type": "llama",
        "num_labels": 1,
        "id2label": {"0": "LABEL_0"},
        "label2id": {"LABEL_0": 0},
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
        "bos_token_id": bos,
        "eos_token_id": eos,
        "pad_token_id": pad,
        "torch_dtype": "float32",
        "dtype": "float32",
    }
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "pad_token": "<pad>",
        "clean_up_tokenization_spaces": False,
        "model_max_length": 2048,
    }
    tok.save(str(out / "tokenizer.json"))
    for name, obj in (
        ("tokenizer_config.json", tokenizer_config),
        ("config.json", config),  # written last: its presence marks a complete build
    ):
        (out / name).write_text(json.dumps(obj, indent=2) + "\n")


if __name__ == "__main__":  # python -m vllm_inline.testing.reranker: build and print the path
    print(build_reranker_model())
