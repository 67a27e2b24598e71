"""Paired runs: each measured run next to a run of the reference, and the statistics of the
ratios they give.

This host's speed drifts by more than the overheads measured, within minutes. Two runs seconds
apart share the drift, so the benchmarks take each ratio between a run and the reference run
right before or after it (``run.py``: raw before and after every path; ``bulk.py``: the
reference before or after, alternately; ``compare.py``: three sides in ABC/CBA order), rotate
the order of the paths from one round to the next, and judge the median of the paired ratios
against what the reference paired with itself gives (A/A).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

__all__ = [
    "SETTLE_S",
    "aa_band",
    "alternating",
    "flag",
    "median_ci",
    "median_range",
    "next_to",
    "ratio_figures",
    "resolution",
    "rotated",
    "settled",
]

T = TypeVar("T")
R = TypeVar("R")

SETTLE_S = 1.5
"""Pause before every timed run when another engine runs beside the measured one, so that it
has gone idle. After each message vLLM's shared-memory readers (the worker, the engine core)
busy-poll for a second (``SpinCondition(busy_loop_s=1)`` in
``vllm/distributed/device_communicators/shm_broadcast.py``), and both engines' workers are
bound to the same CPU here: a run that starts within that second shares its CPU with the
other engine's spinning."""


# -- the order of the runs ----------------------------------------------------------------------


def rotated(items: Sequence[T], k: int) -> list[T]:
    """``items`` rotated left by ``k`` (modulo their count): round ``k``'s order, so that no
    item always runs first."""
    shift = k % len(items)
    return [*items[shift:], *items[:shift]]


def alternating(items: Sequence[T], k: int) -> list[T]:
    """``items`` in order when ``k`` is even, reversed when odd: over consecutive ``k`` each item
    is as often before as after the others (ABC, CBA, ...)."""
    return list(items) if k % 2 == 0 else list(items)[::-1]


def next_to(run: Callable[[], T], reference: Callable[[], R], reference_first: bool) -> tuple[T, R]:
    """``run()`` with ``reference()`` right before it (``reference_first``) or right after it:
    both results."""
    if reference_first:
        ref = reference()
    got = run()
    if not reference_first:
        ref = reference()
    return got, ref


def settled(call: Callable[[], T], pause: float = SETTLE_S) -> T:
    """``call()`` after a pause of ``pause`` seconds (:data:`SETTLE_S`)."""
    time.sleep(pause)
    return call()


# -- the statistics of paired ratios ------------------------------------------------------------


def median_range(values: Sequence[float]) -> dict[str, float]:
    """``median``, ``min`` and ``max`` of ``values``."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def median_ci(values: list[float]) -> tuple[float, float] | None:
    """A distribution-free 95 % confidence interval of the median of ``values``, or ``None``.

    From order statistics: with ``n`` values sorted ``x_(1) <= ... <= x_(n)`` (1-based), ``k``
    is the largest integer with ``P(Binomial(n, 1/2) <= k - 1) <= 0.025``, and the interval is
    ``[x_(k), x_(n-k+1)]``. It covers the true median at least 95 % of the time whatever the
    distribution, as long as the values are independent draws from it. Below 6 values even
    ``[min, max]`` covers less than 95 %: then there is none (``None``)."""
    n = len(values)
    xs = sorted(values)
    k, below = 0, 0  # below: the count of outcomes with Binomial(n, 1/2) <= k, times 2**n
    while k < n:
        below += math.comb(n, k)
        if 40 * below > 2**n:  # P(Binomial(n, 1/2) <= k) > 0.025, exactly
            break
        k += 1
    if k == 0:
        return None
    return xs[k - 1], xs[n - k]


def resolution(values: list[float]) -> float | None:
    """How finely the median of ``values`` is known: ``max(median/lo, hi/median) - 1`` for the
    95 % interval ``[lo, hi]`` of :func:`median_ci` (0.05: +-5 %); ``None`` without one."""
    ci = median_ci(values)
    if ci is None:
        return None
    median = statistics.median(values)
    if ci[0] <= 0:
        return math.inf
    return max(median / ci[0], ci[1] / median) - 1


def ratio_figures(values: list[float]) -> dict[str, Any]:
    """The figures of one line's paired ratios (``values`` sorted): :func:`median_range`, the
    median's 95 % interval (``ci``, :func:`median_ci`), its ``resolution`` and the ratios."""
    ci = median_ci(values)
    return {
        **median_range(values),
        "ci": list(ci) if ci else None,
        "resolution": resolution(values),
        "ratios": values,
    }


def aa_band(aa: dict[str, Any] | None) -> tuple[float, float] | None:
    """What the host resolves on a line, from its A/A :func:`ratio_figures`: the A/A median's
    95 % interval when there is one (from 6 pairs on), else the A/A ratios' min-max; ``None``
    without an A/A line."""
    if aa is None:
        return None
    return tuple(aa["ci"]) if aa.get("ci") else (aa["min"], aa["max"])


def flag(ab: dict[str, Any] | None, aa: dict[str, Any] | None, limit: float, min_pairs: int) -> str:
    """``SLOWER`` when the median A/B ratio (:func:`ratio_figures`) is below ``limit`` and below
    the A/A band (:func:`aa_band`); ``faster`` when above ``1/limit`` and above the band; with a
    ``?`` for fewer than ``min_pairs`` pairs or no A/A line; empty otherwise."""
    if ab is None:
        return ""
    band = aa_band(aa)
    unsure = "?" if band is None or len(ab["ratios"]) < min_pairs else ""
    if ab["median"] < limit and (band is None or ab["median"] < band[0]):
        return "SLOWER" + unsure
    if ab["median"] > 1 / limit and (band is None or ab["median"] > band[1]):
        return "faster" + unsure
    return ""
