"""This tree against another version of vllm-inline, paired: ``make bench-compare REF=<ref>``.

    python benchmarks/compare.py --ref 2781d6f                 # the default run (14.4 min here)
    python benchmarks/compare.py --ref 2781d6f --quick         # a smoke run (5 min on a busy host)
    python benchmarks/compare.py --ref HEAD~3 --paths ChatVLLM.stream,ChatVLLM.astream --pairs 8
    python benchmarks/compare.py --ref 2781d6f --paths ChatVLLM.stream --concurrency 16 \
        --resolve 0.05 --budget-min 30                         # rounds until +-5 % or 30 min

REF is checked out into a git worktree in a temporary directory (removed at the end, also on
error). Three child processes then run side by side, each with an engine of its own started
with the same options (``run.ENGINE_OPTIONS``) on the same random model (``models.py``):

- ``this``: vllm-inline from this tree (the working tree, uncommitted changes included), or
  from ``--this <ref>`` checked out into a worktree of its own;
- ``REF``: vllm-inline from the worktree;
- ``this'``: this tree again, in a process of its own: the A/A line.

Each child imports ``vllm_inline`` from its tree through :class:`TreeFinder`, which maps the
import names to directories as that tree's own ``pyproject.toml`` does
(``[tool.setuptools.package-dir]``: ``vllm_inline.engine`` is the top-level ``engine/``, ...),
ahead of the editable install's finder. The measuring code (``paths.py``, ``measure.py``,
``bulk.py``) is this tree's for both sides; only the package differs.

Paths: ``Engine``, ``ChatVLLM`` and LlamaIndex ``VLLM``, each async and sync, streaming at each
concurrency (``run.inline_paths``, loads as in ``run.py``), and the bulk paths
``ChatVLLM.batch``, ``ChatVLLM.abatch`` and the LlamaIndex gather over ``VLLM.achat``
(``bulk.inline_paths``) at each size. A version without ``ChatVLLM.batch`` of its own runs
LangChain's default (a thread pool).

Pairing: for each pair round and each (path, load), ``this`` runs once, between the ``REF``
run and the ``this'`` run (``REF, this, this'`` or ``this', this, REF``, alternately), each
after a pause of ``bulk.SETTLE_S`` (an engine's processes spin for a second after a run).
Ratio ``this/REF`` = tok/s of ``this`` over that of the ``REF`` run next to it; the A/A ratio
``this/this'`` is taken the same way, so its spread is what this host resolves. The order of
the (path, load) cells rotates from one round to the next.

Statistics: each line's ``this/REF`` and A/A figure is the median of its ratios, with a 95 %
confidence interval of that median from order statistics (:func:`median_ci`; no assumption on
the distribution, none below 6 pairs). Its resolution is ``max(median/lo, hi/median) - 1``
(0.05: the median is known to +-5 %). At a paired ratio's log-sd of 0.14 (this host) it takes
about 80 pairs to reach +-5 %, about 36 for +-8 %. A line is flagged ``SLOWER`` when its median
``this/REF`` is below 0.95 and below the A/A band: the A/A median's 95 % interval, or the A/A
ratios' min-max below 6 pairs (``faster`` likewise above 1/0.95 and above the band); with fewer
than ``MIN_PAIRS`` pairs or no A/A line the flag carries a question mark. A line is
``resolved``, a stricter statement than the flag, when its ``this/REF`` resolution is at most
``--resolve`` (or 0.05). With ``--resolve FRACTION``, after ``--pairs`` rounds more rounds
follow, over the lines whose ``this/REF`` or A/A resolution is none or above FRACTION only,
until all are resolved or the next round would end after ``--budget-min`` minutes (default 30)
from the first round. Client CPU is the calling process's CPU
time (the engine core and worker are other processes), per token for streaming (as in
``run.py``) and per input for bulk (as in ``bulk.py``): the median over the rounds, per side.

Prints the table on stdout (progress on stderr) and writes ``results/compare-<ref>.txt`` and
``results/compare-<ref>.json`` (every run, the options, the host's load average).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import importlib.abc
import importlib.util
import json
import math
import os
import pathlib
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import bulk
import paths as P
import run
from models import SPECS, ModelSpec, build_model

STREAM_PATHS = P.PATHS[1:-1]
"""vllm-inline's streaming paths (``run.inline_paths``' names: not raw, not HTTP)."""

BULK_PATHS = ("ChatVLLM.batch", "ChatVLLM.abatch", "LlamaIndex gather(achat)")
"""``bulk.inline_paths``' names of the bulk paths compared."""

LIMIT = 0.95
"""A line whose median ``this/REF`` ratio is below this, and below its A/A band, is flagged."""

SIDES = ("REF", "this", "this'")
"""The three children, in the order of the even rounds (odd rounds reverse it)."""


def log(msg: str) -> None:
    print(f"[compare {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# -- a version's package, imported from its tree -----------------------------------------------


class TreeFinder(importlib.abc.MetaPathFinder):
    """Finds ``vllm_inline`` and its remapped subpackages in a source tree, as the tree's own
    ``[tool.setuptools.package-dir]`` maps them. Only the mapped names are answered here; their
    submodules are found through the parents' ``__path__`` as usual."""

    def __init__(self, tree: pathlib.Path) -> None:
        config = tomllib.loads((tree / "pyproject.toml").read_text())
        mapping = config["tool"]["setuptools"].get("package-dir", {})
        self.dirs = {name: (tree / d).resolve() for name, d in mapping.items() if name}
        self.dirs.setdefault("vllm_inline", (tree / "vllm_inline").resolve())

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        d = self.dirs.get(fullname)
        if d is None:
            return None
        return importlib.util.spec_from_file_location(
            fullname, d / "__init__.py", submodule_search_locations=[str(d)]
        )


TREE_ENV = "VLLMINLINE_COMPARE_TREE"
"""Set in a child to its tree: the processes vLLM spawns (the engine core) import this module
as ``__mp_main__``, and then install the same finder (the line below :func:`use_tree`)."""


def use_tree(tree: pathlib.Path) -> None:
    """Import ``vllm_inline`` from ``tree`` from now on (before the editable install's finder),
    here and in the processes this one spawns."""
    assert not any(m == "vllm_inline" or m.startswith("vllm_inline.") for m in sys.modules)
    sys.meta_path.insert(0, TreeFinder(tree))
    os.environ[TREE_ENV] = str(tree)


if os.environ.get(TREE_ENV) and not any(isinstance(f, TreeFinder) for f in sys.meta_path):
    use_tree(pathlib.Path(os.environ[TREE_ENV]))


# -- a child: one version, one engine ------------------------------------------------------------


def serve(
    tree: pathlib.Path,
    label: str,
    model: str,
    tokens: int,
    bulk_tokens: int,
    streams: list[str],
    bulks: list[str],
) -> None:
    """Start an engine with vllm-inline from ``tree``, warm the paths up, then answer one JSON
    command per stdin line (``{"path", "load"}``) with a ``RESULT`` JSON line."""
    use_tree(tree)
    import vllm_inline.engine

    engine = vllm_inline.engine.get_engine(model, **run.ENGINE_OPTIONS).start()
    chat = P.chat_vllm(model, run.ENGINE_OPTIONS)
    li = P.llama_index_llm(model, run.ENGINE_OPTIONS)

    def streaming(n: int) -> dict[str, tuple[str, Any]]:
        return {
            name: (kind, req)
            for name, kind, req in run.inline_paths(engine, chat, li, n)
            if name in streams
        }

    bulk_runs = {
        k: v
        for k, v in bulk.inline_paths(model, bulk_tokens, run.ENGINE_OPTIONS).items()
        if k in bulks
    }
    for kind, request in streaming(run.WARMUP[1]).values():
        if kind == "async":
            asyncio.run(P.run_async_load(request, run.WARMUP[0], 1))
        else:
            P.run_sync_load(request, run.WARMUP[0], 1)
    for go in bulk_runs.values():
        go(16)
    measured = streaming(tokens)
    print("READY " + json.dumps(str(pathlib.Path(vllm_inline.engine.__file__).parent)), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        name, load = cmd["path"], cmd["load"]
        if name in measured:
            kind, request = measured[name]
            if kind == "async":
                result = asyncio.run(run.measure_async(request, label, name, load, 0, tokens))
            else:
                result = run.measure_sync(request, label, name, load, 0, tokens)
        else:
            t0, c0 = time.perf_counter(), time.process_time()
            generated = bulk_runs[name](load)
            wall, used = time.perf_counter() - t0, time.process_time() - c0
            result = {
                "tok_s": generated / wall,
                "client_cpu_ms_per_input": 1000 * used / load,
                "tokens_ok": generated == load * bulk_tokens,
            }
        print("RESULT " + json.dumps(result), flush=True)
    engine.shutdown()


class Child(bulk.Reference):
    """One version's child process (:func:`serve`), kept up for the whole run; ``close`` and
    the line reading are :class:`bulk.Reference`'s."""

    def __init__(
        self, label: str, tree: pathlib.Path, args: argparse.Namespace, model: str
    ) -> None:
        self.label = label
        cmd = [
            sys.executable,
            __file__,
            "--child",
            str(tree),
            "--label",
            label,
            "--model-path",
            model,
            "--tokens",
            str(args.tokens),
            "--bulk-tokens",
            str(args.bulk_tokens),
            "--paths",
            ",".join(args.streams + args.bulks),
        ]
        # Its own process group (killed as one if it hangs), in this session (see run.py's
        # phase_http: a new session is a new scheduler autogroup).
        self._proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, process_group=0
        )

    def ready(self) -> str:
        return json.loads(self._line("READY "))

    def measure(self, path: str, load: int) -> dict[str, Any]:
        assert self._proc.stdin is not None
        self._proc.stdin.write(json.dumps({"path": path, "load": load}) + "\n")
        self._proc.stdin.flush()
        return json.loads(self._line("RESULT "))

    def kill(self) -> None:
        if self._proc.poll() is None:
            os.killpg(self._proc.pid, signal.SIGKILL)
            self._proc.wait()


# -- the paired runs ----------------------------------------------------------------------------


def cells(args: argparse.Namespace) -> list[tuple[str, int]]:
    """Every (path, load) compared: concurrency for streaming paths, inputs for bulk ones."""
    return [(p, c) for p in args.streams for c in args.concurrency] + [
        (p, n) for p in args.bulks for n in args.sizes
    ]


def measure(children: dict[str, Child], args: argparse.Namespace) -> list[dict[str, Any]]:
    """``args.pairs`` rounds over every cell; in each, the three sides one after the other.

    With ``args.resolve``, more rounds follow, each over the lines not yet resolved
    (:func:`unresolved`) only, until every line is or the next round would end after
    ``args.budget_min`` minutes from the first round (at the mean time per line so far). Each
    line still gets consecutive round numbers, so its order keeps alternating."""
    todo = cells(args)
    sides = [s for s in SIDES if s in children]
    runs: list[dict[str, Any]] = []
    started = time.perf_counter()
    line_s, lines_run = 0.0, 0  # time spent on single lines (all sides, pauses included)
    rnd = 0
    while True:
        shift = rnd % len(todo)
        rotated = todo[shift:] + todo[:shift]
        if rnd >= args.pairs:
            if not args.resolve:
                break
            left = unresolved(runs, todo, args.resolve)
            if not left:
                log(f"all {len(todo)} lines resolved to {pct(args.resolve)} after {rnd} rounds")
                break
            spent = time.perf_counter() - started
            next_s = len(left) * line_s / lines_run if lines_run else 0.0
            if spent + next_s > 60 * args.budget_min:
                log(
                    f"budget of {args.budget_min:g} min: {spent / 60:.1f} min spent, the next "
                    f"round (~{next_s / 60:.1f} min) would end after it; stopping with "
                    f"{len(left)} of {len(todo)} lines not resolved to {pct(args.resolve)}"
                )
                break
            log(
                f"round {rnd} added for {len(left)} of {len(todo)} lines not resolved to "
                f"{pct(args.resolve)} ({spent / 60:.1f} of {args.budget_min:g} min spent): "
                + ", ".join(
                    f"{path} {load} {pct(ab)}" + ("" if aa is None else f"/A/A {pct(aa)}")
                    for (path, load), (ab, aa) in left.items()
                )
            )
            rotated = [cell for cell in rotated if cell in left]
        for path, load in rotated:
            t0 = time.perf_counter()
            # Each line's order alternates from round to round (and between neighbouring lines).
            order = sides if (rnd + todo.index((path, load))) % 2 == 0 else sides[::-1]
            got = {}
            for side in order:
                time.sleep(bulk.SETTLE_S)
                got[side] = children[side].measure(path, load)
                runs.append(
                    {
                        "round": rnd,
                        "path": path,
                        "load": load,
                        "side": side,
                        "position": order.index(side),
                        **got[side],
                    }
                )
            line = (
                f"round {rnd} {path:<24} {load:>4}: "
                + ", ".join(f"{s} {got[s]['tok_s']:.0f}" for s in order)
                + " tok/s"
            )
            for other, name in (("REF", "this/REF"), ("this'", "A/A")):
                if other in got:
                    line += f"; {name} {got['this']['tok_s'] / got[other]['tok_s']:.2f}"
            log(line)
            line_s += time.perf_counter() - t0
            lines_run += 1
        rnd += 1
    return runs


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


RESOLVE = 0.05
"""The resolution a line must reach to be called resolved when ``--resolve`` is not given."""


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
    median (:func:`median_ci`) and its resolution, CPU per side, rounds, the flag, resolved."""
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
                ci = median_ci(values)
                row[key] = {
                    "median": statistics.median(values),
                    "min": values[0],
                    "max": values[-1],
                    "ci": list(ci) if ci else None,
                    "resolution": resolution(values),
                    "ratios": values,
                }
        row["flag"] = _flag(row)
        ab_res = row["ab"]["resolution"] if "ab" in row else None
        row["resolved"] = ab_res is not None and ab_res <= target
        rows.append(row)
    return rows


MIN_PAIRS = 3
"""Fewer paired runs than this (or no A/A line) give a flag with a question mark only."""


def aa_band(aa: dict[str, Any] | None) -> tuple[float, float] | None:
    """What the host resolves on a line: the A/A median's 95 % interval when there is one (from
    6 pairs on), else the A/A ratios' min-max; ``None`` without an A/A line."""
    if aa is None:
        return None
    return tuple(aa["ci"]) if aa.get("ci") else (aa["min"], aa["max"])


def _flag(row: dict[str, Any]) -> str:
    """``SLOWER`` when the median this/REF is below ``LIMIT`` and below the A/A band
    (:func:`aa_band`); ``faster`` when above ``1/LIMIT`` and above the band; a ``?`` with fewer
    than ``MIN_PAIRS`` pairs or no A/A line."""
    ab, aa = row.get("ab"), row.get("aa")
    if ab is None:
        return ""
    band = aa_band(aa)
    unsure = "?" if band is None or len(ab["ratios"]) < MIN_PAIRS else ""
    if ab["median"] < LIMIT and (band is None or ab["median"] < band[0]):
        return "SLOWER" + unsure
    if ab["median"] > 1 / LIMIT and (band is None or ab["median"] > band[1]):
        return "faster" + unsure
    return ""


def table(rows: list[dict[str, Any]]) -> str:
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
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    out = []
    for k, line in enumerate(lines):
        out.append(
            "  ".join(
                v.ljust(w) if i in (0, 1, 9, 10) else v.rjust(w)
                for i, (v, w) in enumerate(zip(line, widths))
            ).rstrip()
        )
        if k == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


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


# -- main ---------------------------------------------------------------------------------------


def _git(*argv: str) -> str:
    return subprocess.run(
        ["git", "-C", str(ROOT), *argv], capture_output=True, text=True, check=True
    ).stdout.strip()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ref", help="the other version: a git ref of this repository")
    ap.add_argument(
        "--this",
        help="measure this git ref (checked out into a worktree too) instead of the working tree",
    )
    ap.add_argument("--model", default="tiny", help="a models.SPECS name: " + ", ".join(SPECS))
    ap.add_argument(
        "--pairs",
        type=int,
        default=3,
        help="rounds: paired runs per line (the minimum with --resolve)",
    )
    ap.add_argument(
        "--resolve",
        type=float,
        metavar="FRACTION",
        help="after --pairs rounds, add rounds for the lines whose this/REF or A/A "
        "median is not yet known to +-FRACTION (95%% CI; e.g. 0.05), until all are "
        "or --budget-min is spent",
    )
    ap.add_argument(
        "--budget-min",
        type=float,
        metavar="MINUTES",
        help="with --resolve: wall minutes from the first round; no round is "
        "added that would end after them, at the time per line so far (default 30)",
    )
    ap.add_argument("--concurrency", default="1,16", help="streaming loads")
    ap.add_argument("--sizes", default="256", help="bulk inputs")
    ap.add_argument(
        "--tokens",
        type=int,
        default=None,
        help="tokens per streamed request (default: the model's, 128 for tiny)",
    )
    ap.add_argument("--bulk-tokens", type=int, default=32, help="tokens per bulk input")
    ap.add_argument(
        "--paths",
        default="",
        help="only these paths (comma-separated names: "
        + ", ".join(STREAM_PATHS + BULK_PATHS)
        + ")",
    )
    ap.add_argument(
        "--skip", default="", help="skip paths whose name contains these (comma-separated)"
    )
    ap.add_argument(
        "--no-aa",
        action="store_true",
        help="no A/A child (faster; then nothing says what the host resolves)",
    )
    ap.add_argument(
        "--quick", action="store_true", help="1 round, c=16, 64 bulk inputs, 32 tokens per request"
    )
    ap.add_argument("--out", type=pathlib.Path, default=HERE / "results")
    ap.add_argument("--child", type=pathlib.Path, help=argparse.SUPPRESS)
    ap.add_argument("--label", help=argparse.SUPPRESS)
    ap.add_argument("--model-path", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.quick:
        args.pairs, args.concurrency, args.sizes = 1, "16", "64"
        args.tokens = args.tokens or 32
    args.tokens = args.tokens or SPECS[args.model].tokens
    names = [p for p in args.paths.split(",") if p]
    unknown = set(names) - set(STREAM_PATHS + BULK_PATHS)
    if unknown:
        ap.error(
            f"unknown path(s) {sorted(unknown)}; known: {', '.join(STREAM_PATHS + BULK_PATHS)}"
        )
    skip = [s for s in args.skip.split(",") if s]

    def keep(name: str) -> bool:
        return (not names or name in names) and not any(s in name for s in skip)

    args.streams = [p for p in STREAM_PATHS if keep(p)]
    args.bulks = [p for p in BULK_PATHS if keep(p)]
    args.concurrency = [int(c) for c in args.concurrency.split(",") if c]
    args.sizes = [int(n) for n in args.sizes.split(",") if n]
    if not args.child and not args.ref:
        ap.error("--ref is required")
    if args.resolve is not None and not 0 < args.resolve < 1:
        ap.error("--resolve takes a fraction between 0 and 1, e.g. 0.05")
    if args.budget_min is not None and args.resolve is None:
        ap.error("--budget-min only goes with --resolve")
    if args.budget_min is not None and args.budget_min <= 0:
        ap.error("--budget-min takes a positive number of minutes")
    if args.resolve is not None and args.budget_min is None:
        args.budget_min = 30.0
    if not args.child and not cells(args):
        ap.error("nothing to measure: every path skipped")
    return args


def _on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)  # so that the children and the worktree are cleaned up


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        serve(
            args.child,
            args.label,
            args.model_path,
            args.tokens,
            args.bulk_tokens,
            args.streams,
            args.bulks,
        )
        return 0
    signal.signal(signal.SIGTERM, _on_sigterm)
    started = time.perf_counter()
    ref_sha = _git("rev-parse", "--short", f"{args.ref}^{{commit}}")
    if args.this:
        this_sha = _git("rev-parse", "--short", f"{args.this}^{{commit}}")
        this_name = f"{args.this} ({this_sha})"
    else:
        dirty = _git("status", "--porcelain", "--", "vllm_inline", "engine", "integrations")
        this_name = f"this tree ({_git('rev-parse', '--short', 'HEAD')}"
        this_name += f" + uncommitted changes in {len(dirty.splitlines())} files)" if dirty else ")"
    spec = SPECS[args.model]
    spec = ModelSpec(spec.name, spec.layers, spec.hidden, spec.intermediate, args.tokens)
    model = str(build_model(spec))
    load_before = os.getloadavg()
    adaptive = (
        f" (then more, to {pct(args.resolve)}, within {args.budget_min:g} min)"
        if args.resolve
        else ""
    )
    log(
        f"this: {this_name}; REF: {args.ref} ({ref_sha}); {args.model}, {len(cells(args))} "
        f"lines x {args.pairs} rounds{adaptive}; load average {load_before[0]:.1f}"
    )
    children: dict[str, Child] = {}
    worktrees: list[pathlib.Path] = []
    with tempfile.TemporaryDirectory(prefix="vllm-inline-compare-") as tmp:
        try:
            trees = {}
            for side, sha in (("REF", ref_sha), ("this", this_sha if args.this else None)):
                if sha is None:
                    trees[side] = ROOT
                    continue
                worktrees.append(pathlib.Path(tmp) / f"{side.lower()}-{sha}")
                _git("worktree", "add", "--detach", str(worktrees[-1]), sha)
                trees[side] = worktrees[-1]
            trees["this'"] = trees["this"]
            for side in SIDES:
                if side == "this'" and args.no_aa:
                    continue
                children[side] = Child(side, trees[side], args, model)
            log("starting the engines (each child warms its paths up)")
            for side, child in children.items():
                log(f"{side}: vllm_inline.engine from {child.ready()}")
            runs = measure(children, args)
        finally:
            for child in children.values():
                try:
                    child.close()
                finally:
                    child.kill()
            for worktree in worktrees:
                subprocess.run(
                    ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(worktree)],
                    check=False,
                )
            subprocess.run(["git", "-C", str(ROOT), "worktree", "prune"], check=False)
    elapsed = time.perf_counter() - started
    load_after = os.getloadavg()
    rows = summarize(runs, args)
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
    text = "\n".join(
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
                f"{load_after[0]:.1f} at the end, on {os.cpu_count()} CPUs ({run._cpu_model()})"
            ),
        ]
    )
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"compare-{ref_sha}"
    stem.with_suffix(".txt").write_text(text + "\n")
    meta = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "ref": args.ref,
        "ref_sha": ref_sha,
        "this": this_name,
        "machine": f"{run._cpu_model()}, {os.cpu_count()} CPUs, {platform.platform()}",
        "command": " ".join([os.path.relpath(sys.executable), *sys.argv]),
        "elapsed_s": round(elapsed, 1),
        "load_average": [load_before, load_after],
        "engine_options": run.ENGINE_OPTIONS,
        "model": args.model,
        "tokens": args.tokens,
        "bulk_tokens": args.bulk_tokens,
        "pairs": args.pairs,
        "resolve": args.resolve,
        "budget_min": args.budget_min,
        "rounds": 1 + max((r["round"] for r in runs), default=-1),
        "settle_s": bulk.SETTLE_S,
        "rounds_per_stream": {c: run.rounds_for(c) for c in args.concurrency},
    }
    stem.with_suffix(".json").write_text(
        json.dumps({"meta": meta, "summary": rows, "runs": runs}, indent=1) + "\n"
    )
    log(f"wrote {stem}.txt and .json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
