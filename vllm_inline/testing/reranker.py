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

Hidden size 128 = 2 heads of 64 (:mod:`.random_llama` holds what it shares with the embedder). Building takes
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
from .random_llama import llama_config, llama_layers, train_tokenizer

__all__ = ["build_reranker_model"]

_BUILD_VERSION = "1"
_HIDDEN = 128
_HEADS = 2
_LAYERS = 2
_INTERMEDIATE = 256
_VOCAB = 600
_SEED = 4321


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
    from tokenizers import processors

    tok = train_tokenizer(_VOCAB, ("<pad>", "<s>", "</s>"))
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
    rng = np.random.default_rng(_SEED)
    # Large attention weights: the last token's state (what the score head reads) then
    # depends on every token of the pair, so different documents get different scores.
    tensors = {
        "model.embed_tokens.weight": rng.standard_normal((vocab, _HIDDEN)).astype(np.float32)
    }
    tensors.update(
        llama_layers(
            rng,
            prefix="model.",
            layers=_LAYERS,
            hidden=_HIDDEN,
            heads=_HEADS,
            intermediate=_INTERMEDIATE,
            attention_std=(0.1, 0.1, 0.2, 0.2),
            mlp_std=0.05,
        )
    )
    tensors["score.weight"] = (rng.standard_normal((1, _HIDDEN)) * 0.2).astype(np.float32)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})

    pad, bos, eos = (tok.token_to_id(t) for t in ("<pad>", "<s>", "</s>"))
    config = llama_config(
        architecture="LlamaForSequenceClassification",
        vocab=vocab,
        hidden=_HIDDEN,
        heads=_HEADS,
        intermediate=_INTERMEDIATE,
        layers=_LAYERS,
        bos=bos,
        eos=eos,
        pad=pad,
        num_labels=1,
        id2label={"0": "LABEL_0"},
        label2id={"LABEL_0": 0},
    )
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
