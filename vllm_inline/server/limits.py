"""What a server refuses before any engine work: the API key, the body size, the caps, request
fields it does not know, and the request fields it only takes from trusted clients."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MAX_BODY_BYTES", "MAX_N", "Limits"]

MAX_BODY_BYTES = 1 << 20
"""1 MiB. Text is about 4 bytes a token, so even a request that fills a 128k-token context is
about half of this as JSON: no text request a model can take is refused, while no client makes
the server buffer and parse megabytes. Images sent inline (base64 data URLs) need more."""
MAX_N = 8
"""Each of ``n`` choices is a sequence of its own in vLLM's batch (its KV cache, its steps): 8
allows sampling a few answers to pick from, and no request takes more than 8 of the batch's
128-1024 sequence slots (vLLM's ``max_num_seqs``)."""


@dataclass(frozen=True)
class Limits:
    """The guard's settings (``python -m vllm_inline serve --help`` names each flag)."""

    api_key: str | None = None
    """Required as ``Authorization: Bearer <key>`` on ``/v1`` (``None``: the server is open)."""
    max_body_bytes: int | None = MAX_BODY_BYTES
    """Bodies over this are refused (413); ``None``: no limit."""
    max_tokens_cap: int | None = None
    """``max_tokens`` / ``max_completion_tokens`` over this are refused (400), and a request
    naming none gets the smaller of this and the engine's default; ``None``: the context."""
    max_n: int | None = MAX_N
    """``n`` over this is refused (400); ``None``: no cap."""
    max_documents: int | None = 1000
    """Inputs of one embeddings request, or documents of one rerank or score request, over this
    are refused (400); ``None``: no cap."""

    strict_fields: bool = False
    """``True``: a request field the server does not know is refused (400 naming it).
    ``False``: it is ignored with one warning line, as ``vllm serve`` ignores it
    (docs/server.md lists every field it knows)."""
    trust_request_chat_template: bool = False
    """Take a request's ``chat_template`` (or ``chat_template_kwargs["chat_template"]``); else
    it is refused (400), as ``vllm serve`` does without ``--trust-request-chat-template``."""
    trust_request_mm_kwargs: bool = False
    """Take a request's ``mm_processor_kwargs`` and ``media_io_kwargs`` (they change how much
    work an image costs); else they are refused (400), as ``vllm serve`` does without
    ``--trust-request-mm-kwargs``."""

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "max_tokens_cap", "max_n", "max_documents"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                msg = f"{name}={value!r} is invalid: a positive integer, or None."
                raise ValueError(msg)
