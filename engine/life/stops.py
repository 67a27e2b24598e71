"""The stop policy: which token ids end a turn, decided once per model.

vLLM's input processor already adds ``generation_config.json``'s EOS ids to every request; the
policy makes the whole set explicit (tokenizer EOS, every generation_config EOS, and the family's
end-of-turn tokens such as both ``<|eot_id|>`` and ``<|end_of_text|>``) so that a model whose
config names only one of them still stops at the end of its turn.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from vllm_inline.engine.life.templates import detect_family

__all__ = ["StopPolicy", "decide_stop_policy"]


@dataclass(frozen=True)
class StopPolicy:
    """What ends generation for one model; see :attr:`Engine.stop_policy`."""

    stop_token_ids: tuple[int, ...]
    """Token ids that end a turn (sent with every request)."""
    stop_tokens: tuple[str, ...]
    """The same tokens as text, for reading."""
    template_source: str
    """Where the chat template comes from (``tokenizer``, ``fallback:<family>``, ``none``)."""
    family: str | None
    """The recognised chat family, if any."""


def _as_ids(value: int | Iterable[int] | None) -> list[int]:
    if value is None:
        return []
    if isinstance(value, int):
        return [value]
    return [int(v) for v in value]


def decide_stop_policy(
    vocab: Mapping[str, int],
    tokenizer_eos_id: int | None,
    generation_config_eos: int | Iterable[int] | None,
    template_source: str,
) -> StopPolicy:
    """Collect the end-of-turn ids from the tokenizer, generation_config and the family."""
    ids = _as_ids(tokenizer_eos_id) + _as_ids(generation_config_eos)
    family = detect_family(vocab)
    if family is not None:
        ids += [vocab[tok] for tok in family.end_of_turn if tok in vocab]
    unique = tuple(dict.fromkeys(ids))
    by_id = {i: t for t, i in vocab.items() if i in unique}
    return StopPolicy(
        stop_token_ids=unique,
        stop_tokens=tuple(by_id.get(i, f"<id {i}>") for i in unique),
        template_source=template_source,
        family=family.name if family else None,
    )
