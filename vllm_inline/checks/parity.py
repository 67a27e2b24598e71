"""Greedy parity: the engine's greedy tokens against ``transformers``' on the same prompt ids.

Used by ``python -m vllm_inline check`` (:mod:`vllm_inline.checks`), which adds the rows of
:func:`add_parity_rows` to its table. Both sides decode greedily
for a fixed number of tokens with end-of-sequence ignored, so they are compared token for token:
the common prefix length, and the first divergence with both continuations. On a GPU the dtype
can make late tokens differ; a different *first* token means the model is not run the same way.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .report import Report, shorten

if TYPE_CHECKING:
    from vllm_inline.engine import Engine

__all__ = [
    "ONE_TURN",
    "PENALTIES",
    "Parity",
    "ReferenceModel",
    "add_parity_rows",
    "compare",
    "engine_greedy",
]

ONE_TURN: list[dict[str, Any]] = [{"role": "user", "content": "Write one sentence about the sea."}]
"""The first parity prompt (the second is the check's conversation)."""
PENALTIES = (1.0, 1.1)
"""``repetition_penalty`` values compared."""


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


def engine_greedy(
    engine: Any,
    messages: Sequence[Mapping[str, Any]],
    *,
    max_tokens: int,
    repetition_penalty: float,
) -> list[int]:
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

        torch_dtype: Any = (
            getattr(torch, dtype) if dtype in ("float32", "bfloat16", "float16") else "auto"
        )
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        """Where the reference runs."""
        loaded: Any = AutoModelForCausalLM.from_pretrained(
            model, dtype=torch_dtype, trust_remote_code=trust_remote_code
        )
        self.model = loaded.to(self.device)
        """The ``transformers`` model."""
        self.model.eval()

    def greedy(
        self, prompt_ids: Sequence[int], *, max_tokens: int, repetition_penalty: float
    ) -> list[int]:
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
        return [int(t) for t in out[0, ids.shape[1] :].tolist()]


def add_parity_rows(
    engine: Engine,
    report: Report,
    conversation: list[dict[str, Any]],
    max_tokens: int,
    trust_remote_code: bool,
) -> None:
    """The ``greedy parity k (rp r)`` rows: two prompts x :data:`PENALTIES`, engine against
    :class:`ReferenceModel`; only a different first token is a failure."""
    dtype = (engine.platform_defaults.kwargs if engine.platform_defaults else {}).get("dtype")
    try:
        reference = ReferenceModel(engine.model, dtype, trust_remote_code=trust_remote_code)
    except Exception as e:  # noqa: BLE001 - a checkpoint transformers cannot load is reported
        report.add(
            "greedy parity",
            "warn",
            "transformers could not load the model",
            f"{type(e).__name__}: {e}",
        )
        return
    tok = engine.tokenizer
    prompts = (ONE_TURN, conversation)
    for k, messages in enumerate(prompts, 1):
        prompt_ids = engine.prompt_token_ids(messages)
        for penalty in PENALTIES:
            mine = engine_greedy(
                engine, messages, max_tokens=max_tokens, repetition_penalty=penalty
            )
            ref = reference.greedy(prompt_ids, max_tokens=max_tokens, repetition_penalty=penalty)
            p = compare(mine, ref)
            name = f"greedy parity {k} (rp {penalty})"
            n = p.common_prefix
            if p.identical:
                report.add(name, "ok", f"{len(mine)}/{len(ref)} tokens identical")
                continue
            detail = (
                f"engine:       {shorten(tok.decode(mine[n : n + 16]))}\n"
                f"transformers: {shorten(tok.decode(ref[n : n + 16]))}"
            )
            status = "fail" if p.first_token_differs else "warn"
            report.add(
                name,
                status,
                f"common prefix {n} of {max_tokens}; first divergence at token {n}",
                detail
                + (
                    "\nThe first token differs: the engine does not run this model as "
                    "transformers does (dtype, weights, template ids)."
                    if status == "fail"
                    else "\nLate divergence can come from the dtype (bf16/fp16)."
                ),
            )
