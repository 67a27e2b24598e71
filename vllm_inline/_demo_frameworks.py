"""The LangChain and LlamaIndex half of the demo (filled in once both integrations land)."""

from __future__ import annotations


def run(engine, question: str) -> None:  # noqa: ANN001
    return None
