"""``python -m vllm_inline.testing [name ...]``: build the named models and print their paths.

With no name it builds every scenario of :data:`~vllm_inline.testing.SCENARIOS`; the name
``embedder`` builds the embedding model. Models go under
:func:`~vllm_inline.testing.default_root` (``$VLLMINLINE_CACHE/scripted``).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from .builder import build_scripted_model
from .embedding import build_embedding_model
from .scenarios import SCENARIOS

__all__ = ["main"]

EMBEDDER = "embedder"
"""The name that builds the embedding model instead of a scenario."""


def main(argv: Sequence[str] | None = None) -> int:
    """Build each model named in ``argv`` (default: every scenario) and print ``name path``."""
    names = list(sys.argv[1:] if argv is None else argv) or list(SCENARIOS)
    unknown = [n for n in names if n not in SCENARIOS and n != EMBEDDER]
    if unknown:
        known = ", ".join([*SCENARIOS, EMBEDDER])
        print(f"unknown model {', '.join(unknown)}: use one of {known}", file=sys.stderr)
        return 2
    for name in names:
        path = build_embedding_model() if name == EMBEDDER else build_scripted_model(name)
        print(name, path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
