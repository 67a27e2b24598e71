"""What ``compare.py`` makes of its paired runs: the lines compared (:func:`cells`), one row per
line (:func:`summarize`: the median tok/s and CPU per side, the paired ratios' figures, the flag,
whether it is resolved), the lines not resolved yet (:func:`unresolved`, for ``--resolve``), and
the text it prints and writes (:func:`report_text`)."""

from __future__ import annotations

import argparse
import math
import os
import statistics
from typing import Any

from pairing import flag, ratio_figures, resolution
from report import aligned, cpu_model

__all__ = [
    "LIMIT",
    "MIN_PAIRS",
    "RESOLVE",
    "SIDES",
    "cells",
    "pct",
    "report_text",
    "resolution_line",
    "summarize",
    "table",
    "unresolved",
]

LIMIT = 0.95
"""A line whose median ``this/REF`` ratio is below this, and below its A/A band, is flagged."""

MIN_PAIRS = 3
"""Fewer paired runs than this (or no A/A line) give a flag with a question mark only."""

RESOLVE = 0.05
"""The resolution a line must reach to be called resolved when ``--resolve`` is not given."""

SIDES = ("REF", "this", "this'")
"""The three children, in the order of the even rounds (odd rounds reverse it)."""


def cells(args: argparse.Namespace) -> list[tuple[str, int]]:
    """Every (path, load) compared: concurrency for streaming paths, inputs for bulk ones."""
    return [(p, c) for p in args.streams for c in args.concurrency] + [
        (p, n) for p in args.bulks for n in args.sizes
    ]


def _ratios(runs: list[dict[str, Any]], other: str) -> list[float]:
    by_round: dict[int, dict[str, float]] = {}
    for r in runs:
        by_round.setdefault(r["round"], {})[r["side"]] = r["tok_s"]
    return sorted(
        v["this"] / v[other] for v in by_round.values() if other in v and "this" in v and v[other]
    )


def _line(runs: list[dict[str, Any]], path: str, load: int) -> list[dict[str, Any]]:
    return [r for r in runs if r["path"] == path and r["load"] == load]


def unresolved(
    runs: list[dict[str, Any]], todo: list[tuple[str, int]], target: float
) -> dict[tuple[str, int], tuple[float | None, float | None]]:
    """The lines of ``todo`` whose this/REF resolution, or A/A resolution when the line has A/A
    runs, is ``None`` or above ``target``: line -> (this/REF resolution, A/A resolution)."""
    left = {}
    for cell in todo:
        mine = _line(runs, *cell)
        ab = resolution(_ratios(mine, "REF"))
        aa_values = _ratios(mine, "this'")
        aa = resolution(aa_values) if aa_values else None
        if ab is None or ab > target or (aa_values and (aa is None or aa > target)):
            left[cell] = (ab, aa)
    return left


def summarize(runs: list[dict[str, Any]], args: argparse.Namespace) -> list[dict[str, Any]]:
    """One row per cell: median tok/s per side, paired ratios with the 95 % interval of their
    median (``pairing.median_ci``) and its resolution, CPU per side, rounds, the flag, resolved."""
    target = getattr(args, "resolve", None) or RESOLVE
    rows = []
    for path, load in cells(args):
        mine = _line(runs, path, load)
        bulk_row = path in args.bulks
        cpu_key = "client_cpu_ms_per_input" if bulk_row else "client_cpu_us_per_tok"
        row: dict[str, Any] = {
            "path": path,
            "load": load,
            "bulk": bulk_row,
            "tokens_ok": all(r["tokens_ok"] for r in mine),
            "pairs": len({r["round"] for r in mine}),
        }
        for side in SIDES:
            runs_of = [r for r in mine if r["side"] == side]
            if runs_of:
                row[side] = {
                    "tok_s": statistics.median(r["tok_s"] for r in runs_of),
                    "cpu": statistics.median(r[cpu_key] for r in runs_of),
                }
        for key, other in (("ab", "REF"), ("aa", "this'")):
            values = _ratios(mine, other)
            if values:
                row[key] = ratio_figures(values)
        row["flag"] = flag(row.get("ab"), row.get("aa"), LIMIT, MIN_PAIRS)
        ab_res = row["ab"]["resolution"] if "ab" in row else None
        row["resolved"] = ab_res is not None and ab_res <= target
        rows.append(row)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    """The rows of :func:`summarize` as aligned columns: tok/s, ratios, pairs, CPU, flag."""

    def span(fig: dict[str, Any] | None) -> str:
        if fig is None:
            return "-"
        if fig.get("ci"):
            return f"{fig['median']:.2f} [{fig['ci'][0]:.2f}-{fig['ci'][1]:.2f}]"
        return f"{fig['median']:.2f} ({fig['min']:.2f}-{fig['max']:.2f})"

    def side(row: dict[str, Any], s: str, f: str, fmt: str) -> str:
        return fmt.format(row[s][f]) if s in row and not math.isnan(row[s][f]) else "-"

    header = [
        "path",
        "load",
        "this tok/s",
        "REF tok/s",
        "this/REF [95% CI]",
        "A/A [95% CI]",
        "pairs",
        "CPU this",
        "CPU REF",
        "CPU unit",
        "flag",
    ]
    lines = [header]
    for r in rows:
        lines.append(
            [
                r["path"] + ("" if r["tokens_ok"] else " (!tokens)"),
                f"{'n' if r['bulk'] else 'c'}={r['load']}",
                side(r, "this", "tok_s", "{:.0f}"),
                side(r, "REF", "tok_s", "{:.0f}"),
                span(r.get("ab")),
                span(r.get("aa")),
                str(r["pairs"]),
                side(r, "this", "cpu", "{:.2f}" if r["bulk"] else "{:.0f}"),
                side(r, "REF", "cpu", "{:.2f}" if r["bulk"] else "{:.0f}"),
                "ms/input" if r["bulk"] else "us/tok",
                r["flag"],
            ]
        )
    return aligned(lines, left=(0, 1, 9, 10))


def pct(x: float | None) -> str:
    """A resolution as ``+-4.8 %`` (``-`` for none)."""
    return "-" if x is None else f"\u00b1{100 * x:.1f} %"


def resolution_line(rows: list[dict[str, Any]], target: float) -> str:
    """One line under the table: each line's this/REF resolution (and A/A's), its pairs, and
    ``resolved`` when this/REF is known to ``target`` or better."""
    parts = []
    for r in rows:
        ab, aa = r.get("ab"), r.get("aa")
        part = f"{r['path']} {'n' if r['bulk'] else 'c'}={r['load']} {pct(ab and ab['resolution'])}"
        if aa is not None:
            part += f" (A/A {pct(aa['resolution'])})"
        part += f" in {r['pairs']} pairs" + (", resolved" if r["resolved"] else "")
        parts.append(part)
    return (
        f"resolution (95% CI of the median this/REF, as max(median/lo, hi/median) - 1; "
        f"resolved: {pct(target)} or better; no CI below 6 pairs): " + "; ".join(parts)
    )


def report_text(
    rows: list[dict[str, Any]],
    args: argparse.Namespace,
    this_name: str,
    ref_sha: str,
    elapsed: float,
    loads: tuple[tuple[float, ...], tuple[float, ...]],
) -> str:
    """What ``compare.py`` prints and writes to ``compare-<ref>.txt``: a title, the table, the
    resolution line, the A/A range, the flagged lines and the host's load."""
    load_before, load_after = loads
    pairs = sorted(r["pairs"] for r in rows)
    rounds = (
        f"{pairs[0]} rounds" if pairs[0] == pairs[-1] else f"{pairs[0]}-{pairs[-1]} rounds per line"
    )
    if args.resolve:
        rounds += f" (--resolve {args.resolve:g}, budget {args.budget_min:g} min)"
    aa = [x for r in rows if "aa" in r for x in r["aa"]["ratios"]]
    flagged = [
        f"{r['path']} {r['load']}{r['flag'][6:]}" for r in rows if r["flag"].startswith("SLOWER")
    ]
    return "\n".join(
        [
            (
                f"== this: {this_name}; REF: {args.ref} ({ref_sha}); {args.model}, {args.tokens} tokens per streamed request, "
                f"{args.bulk_tokens} per bulk input; {rounds}; ratios are medians of the "
                "paired runs [95% CI of the median] or (min-max) below 6 pairs =="
            ),
            table(rows),
            "",
            resolution_line(rows, args.resolve or RESOLVE),
            f"A/A ratios over all lines: {min(aa):.2f}-{max(aa):.2f}"
            if aa
            else "no A/A line (--no-aa)",
            (
                f"flagged: {', '.join(flagged) or 'none'} (SLOWER: median this/REF < {LIMIT} and below "
                f"the A/A band, the A/A median's 95% CI, or the A/A min-max below 6 pairs; faster: "
                f"> 1/{LIMIT} and above it; ?: fewer than {MIN_PAIRS} pairs or no A/A)"
            ),
            (
                f"{elapsed / 60:.1f} min; load average (1 min) {load_before[0]:.1f} at the start, "
                f"{load_after[0]:.1f} at the end, on {os.cpu_count()} CPUs ({cpu_model()})"
            ),
        ]
    )
