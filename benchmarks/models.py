"""Random-weight ``LlamaForCausalLM`` checkpoints for the benchmark, built on the fly.

No model can be downloaded here, so the benchmark builds its own: the tokenizer (and Llama-3
chat template) of a scripted model from :mod:`vllm_inline.testing`, and random weights of the
size asked for. A random model emits noise, which is all a throughput benchmark needs: every
request generates a fixed number of tokens (``ignore_eos``).
"""

from __future__ import annotations

import hashlib
import json
import pathlib
import shutil
from dataclasses import asdict, dataclass

__all__ = ["SPECS", "ModelSpec", "build_model"]

_HEAD_DIM = 64  # the CPU attention kernel rejects head_dim 16


@dataclass(frozen=True)
class ModelSpec:
    """Shape of a random model."""

    name: str
    """Short name used in tables and file names."""
    layers: int
    hidden: int
    intermediate: int
    tokens: int
    """Generated tokens per request (``max_tokens`` with ``ignore_eos``)."""

    @property
    def heads(self) -> int:
        return self.hidden // _HEAD_DIM


SPECS: dict[str, ModelSpec] = {
    # Integration overhead dominates: one thin layer, a step costs little.
    "tiny": ModelSpec("tiny", layers=1, hidden=256, intermediate=512, tokens=128),
    # The model dominates: a CPU-sized model (4 layers, hidden 512).
    "cpu-4x512": ModelSpec("cpu-4x512", layers=4, hidden=512, intermediate=1536, tokens=64),
}


def default_root() -> pathlib.Path:
    """``bench`` next to the kit's scripted models (``$VLLMINLINE_CACHE/bench``)."""
    from vllm_inline.testing import default_root as kit_root

    return kit_root().parent / "bench"


def build_model(spec: ModelSpec, root: pathlib.Path | None = None) -> pathlib.Path:
    """Build (or reuse) the checkpoint directory of ``spec``; returns its path."""
    from vllm_inline.testing import build_scripted_model
    from vllm_inline.testing.cache import build_once

    source = build_scripted_model("llama3")
    digest = hashlib.sha256(
        json.dumps([asdict(spec), source.name, 2], sort_keys=True).encode()
    ).hexdigest()[:12]
    return build_once(
        root or default_root(),
        f"{spec.name}-{digest}",
        "config.json",
        lambda out: _write(spec, source, out),
    )


def _write(spec: ModelSpec, source: pathlib.Path, out: pathlib.Path) -> None:
    import numpy as np
    from safetensors.numpy import save_file

    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(source / name, out / name)
    src_config = json.loads((source / "config.json").read_text())
    src_generation = json.loads((source / "generation_config.json").read_text())
    vocab = int(src_config["vocab_size"])
    rng = np.random.default_rng(0)

    def normal(*shape: int) -> np.ndarray:
        return rng.normal(0.0, 0.02, shape).astype(np.float32)

    h, i, q = spec.hidden, spec.intermediate, spec.heads * _HEAD_DIM
    tensors = {"model.embed_tokens.weight": normal(vocab, h), "lm_head.weight": normal(vocab, h)}
    for n in range(spec.layers):
        p = f"model.layers.{n}."
        tensors.update(
            {
                p + "input_layernorm.weight": np.ones(h, np.float32),
                p + "post_attention_layernorm.weight": np.ones(h, np.float32),
                p + "self_attn.q_proj.weight": normal(q, h),
                p + "self_attn.k_proj.weight": normal(q, h),
                p + "self_attn.v_proj.weight": normal(q, h),
                p + "self_attn.o_proj.weight": normal(h, q),
                p + "mlp.gate_proj.weight": normal(i, h),
                p + "mlp.up_proj.weight": normal(i, h),
                p + "mlp.down_proj.weight": normal(h, i),
            }
        )
    tensors["model.norm.weight"] = np.ones(h, np.float32)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    # The scripted model's config (token ids, rope, dtype, ...) with this model's sizes.
    config = {
        **src_config,
        "vocab_size": vocab,
        "hidden_size": h,
        "intermediate_size": i,
        "num_hidden_layers": spec.layers,
        "num_attention_heads": spec.heads,
        "num_key_value_heads": spec.heads,
        "head_dim": _HEAD_DIM,
    }
    # No sampling defaults: every path then samples with exactly the values the benchmark sends.
    generation = {
        k: src_generation[k] for k in ("bos_token_id", "eos_token_id") if k in src_generation
    }
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
