"""The lines ``bulk.py`` prints and the summaries it writes, from its paired runs: per path and
size the median of the paired ratios, judged against :data:`TARGET` (tok/s) and, against
``AsyncLLM.generate`` gathered, :data:`CPU_TARGET` (client CPU per input)."""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable, Iterator
from typing import Any

from bulk_paths import AA_PATH, BASELINE

__all__ = [
    "CPU_TARGET",
    "TARGET",
    "against_baseline_report",
    "against_llm_report",
    "lines_of",
    "reference_lines",
]

TARGET = 0.95
"""Each bulk path's tok/s against the reference on the same list."""

CPU_TARGET = 1.5
"""Each bulk path's client CPU per input against ``BASELINE``'s, paired."""


def lines_of(
    rows: list[dict[str, Any]], sizes: list[int]
) -> Iterator[tuple[str, int, list[dict[str, Any]]]]:
    """``(path, size, its rows)`` for every path (in measuring order) and size measured."""
    for name in dict.fromkeys(r["path"] for r in rows):
        for n in sizes:
            mine = [r for r in rows if r["path"] == name and r["n"] == n]
            if mine:
                yield name, n, mine


def reference_lines(
    rows: list[dict[str, Any]],
    sizes: list[int],
    label: str,
    stat_name: str,
    stat: Callable[[list[float]], float],
) -> list[str]:
    """One line per size: the reference runs' tok/s range and their client CPU per input."""
    lines = []
    for n in sizes:
        ref = [r["reference_tok_s"] for r in rows if r["n"] == n]
        ref_cpu = [r["reference_client_cpu_ms_per_input"] for r in rows if r["n"] == n]
        lines.append(
            f"{label:<42} n={n:<5} {min(ref):6.0f}-{max(ref):.0f} tok/s over "
            f"{len(ref)} runs; client CPU {stat_name} {stat(ref_cpu):.2f} ms/input"
        )
    return lines


def against_baseline_report(
    rows: list[dict[str, Any]], sizes: list[int], elapsed: float, repeats: int
) -> tuple[list[str], list[dict[str, Any]]]:
    title = (
        f"\n== bulk against {BASELINE} on the same engine ({repeats} repeats, each run "
        f"paired with a baseline run next to it; median of the paired ratios; "
        f"{elapsed / 60:.1f} min) =="
    )
    lines = [title, *reference_lines(rows, sizes, "baseline", "median", statistics.median)]
    summary = []
    for name, n, mine in lines_of(rows, sizes):
        ratios = sorted(r["ratio"] for r in mine)
        cpu_ratios = sorted(r["cpu_ratio"] for r in mine)
        median, cpu_median = statistics.median(ratios), statistics.median(cpu_ratios)
        cpu = statistics.median(r["client_cpu_ms_per_input"] for r in mine)
        if "(baseline)" in name or name.endswith("A/A"):
            verdict = "(not ours: for reading the others)"
        else:
            verdict = (
                f"[tok/s >={TARGET}x: {'PASS' if median >= TARGET else 'MISS'}; "
                f"CPU <={CPU_TARGET}x: {'PASS' if cpu_median <= CPU_TARGET else 'MISS'}]"
            )
        lines.append(
            f"{name:<42} n={n:<5} {median:.2f}x tok/s ({min(ratios):.2f}-"
            f"{max(ratios):.2f}), client CPU {cpu:.2f} ms/input = {cpu_median:.2f}x "
            f"({min(cpu_ratios):.2f}-{max(cpu_ratios):.2f})  {verdict}"
        )
        summary.append(
            {
                "path": name,
                "n": n,
                "median_ratio": median,
                "median_cpu_ratio": cpu_median,
                "client_cpu_ms_per_input": cpu,
                "best_tok_s": max(r["tok_s"] for r in mine),
            }
        )
    return lines, summary


def against_llm_report(
    rows: list[dict[str, Any]], sizes: list[int], elapsed: float, args: argparse.Namespace
) -> tuple[list[str], list[dict[str, Any]]]:
    title = (
        f"\n== bulk: {args.model}, {args.tokens} tokens per input, {args.repeats} "
        f"repeats; each run paired with a vllm.LLM.chat run next to it, on an engine with the "
        f"same options (stats on, or off for [stats off] lines); the verdict is on the median "
        f"of the paired ratios ({elapsed / 60:.1f} min) =="
    )
    lines = [title, *reference_lines(rows, sizes, "vllm.LLM.chat", "lowest", min)]
    summary = []
    for name, n, mine in lines_of(rows, sizes):
        ratios = sorted(r["ratio"] for r in mine)
        median = statistics.median(ratios)
        if name.startswith("QuestionsAnsweredExtractor"):
            verdict = "(own prompt: compare the two extractor lines)"
        elif name.startswith("Runnable.batch"):
            verdict = "(LangChain's default, for reference)"
        elif name == AA_PATH:
            verdict = "(the reference against itself: this host's resolution)"
        elif "(baseline)" in name:
            verdict = f"(a baseline, {'at or above' if median >= TARGET else 'below'} the target)"
        else:
            verdict = f"[>={TARGET}x: {'PASS' if median >= TARGET else 'MISS'}]"
        best = max(r["tok_s"] for r in mine)
        cpu = min(r["client_cpu_ms_per_input"] for r in mine)
        lines.append(
            f"{name:<42} n={n:<5} {median:.2f}x vllm.LLM.chat (paired runs "
            f"{', '.join(f'{x:.2f}' for x in ratios)})  {verdict}; best "
            f"{best:.0f} tok/s; client CPU {cpu:.2f} ms/input"
        )
        summary.append(
            {
                "path": name,
                "n": n,
                "median_ratio": median,
                "best_tok_s": best,
                "client_cpu_ms_per_input": cpu,
            }
        )
    return lines, summary
