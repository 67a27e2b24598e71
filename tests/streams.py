"""What a test may expect of a stream's pieces."""

from __future__ import annotations

import itertools
from collections.abc import Sequence


def assert_token_pieces(pieces: Sequence[str], tokens: Sequence[str]) -> None:
    """``pieces`` (a stream's texts) are ``tokens`` in order, most of them one each.

    A piece may hold a run of consecutive tokens: vLLM's DELTA output merges the steps its
    consumer has not picked up yet (``RequestOutputCollector``), as it does for its own server,
    and a busy host causes that now and then ("The answer" in one piece, in one CI run of many).
    """
    assert "".join(pieces) == "".join(tokens), (pieces, tokens)
    ends = set(itertools.accumulate(len(t) for t in tokens))
    assert set(itertools.accumulate(len(p) for p in pieces)) <= ends, (pieces, tokens)
    assert len(pieces) > len(tokens) // 2, (pieces, tokens)
