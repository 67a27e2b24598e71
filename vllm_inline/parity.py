"""Greedy parity: the engine's greedy tokens against ``transformers``' on the same prompt ids.

Used by ``python -m vllm_inline check`` (:mod:`vllm_inline.check`). Both sides decode greedily
for a fixed number of tokens with end-of-sequence ignored, so they are compared token for token:
the common prefix length, and the first divergence with both continuations. On a GPU the dtype
can make late tokens differ; a different *first* token means the model is not run the same way.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Parity", "ReferenceModel", "compare", "engine_greedy"]


@dataclass(frozen=True)
class Parity:
    """One prompt's comparison."""

    engine_ids: tuple[int, ...]
    """Token ids the engine generated."""
    reference_ids: tuple[int, ...]
    """Token ids ``transformers`` generated."""

    @property
    def common_prefix(self) -> int:
        """Number of leading tokens both sides agree on."""
        n = 0
        for a, b in zip(self.engine_ids, self.reference_ids):
            if a != b:
                break
            n += 1
        return n

    @property
    def identical(self) -> bool:
        """True when both generated exactly the same ids."""
        return self.engine_ids == self.reference_ids

    @property
    def first_token_differs(self) -> bool:
        """True when even the first generated token differs (the check fails on this)."""
        return self.common_prefix == 0 and bool(self.engine_ids or self.reference_ids)


def compare(engine_ids: Sequence[int], reference_ids: Sequence[int]) -> Parity:
    """Build a :class:`Parity` from the two id sequences."""
    return Parity(tuple(engine_ids), tuple(reference_ids))


def engine_greedy(engine: Any, messages: Sequence[Mapping[str, Any]], *, max_tokens: int,
                  repetition_penalty: float) -> list[int]:
    """The engine's greedy ids for ``messages`` (temperature 0, end-of-turn ignored)."""
    ids: list[int] = []
    for delta in engine.stream(
        list(messages),
        temperature=0.0,
        repetition_penalty=repetition_penalty,
        max_tokens=max_tokens,
        ignore_eos=True,  # also turns off vllm-inline's end-of-turn ids: a fixed length
    ):
        ids.extend(delta.token_ids)
    return ids


class ReferenceModel:
    """``AutoModelForCausalLM`` loaded from the same checkpoint, in the engine's dtype."""

    def __init__(self, model: str, dtype: str | None, *, trust_remote_code: bool = False) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        torch_dtype: Any = getattr(torch, dtype) if dtype in ("float32", "bfloat16", "float16") else "auto"
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        """Where the reference runs."""
        self.model = AutoModelForCausalLM.from_pretrained(
            model, dtype=torch_dtype, trust_remote_code=trust_remote_code
        ).to(self.device)
        """The ``transformers`` model."""
        self.model.eval()

    def greedy(self, prompt_ids: Sequence[int], *, max_tokens: int, repetition_penalty: float) -> list[int]:
        """``generate(do_sample=False)`` on ``prompt_ids``, end-of-sequence ignored."""
        import torch

        ids = torch.tensor([list(prompt_ids)], device=self.device)
        with torch.no_grad():
            out = self.model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=False,
                repetition_penalty=repetition_penalty,
                max_new_tokens=max_tokens,
                eos_token_id=None,  # the engine side ignores EOS too: same length both sides
                pad_token_id=0,
                temperature=None,
                top_p=None,
                top_k=None,
            )
        return out[0, ids.shape[1]:].tolist()
