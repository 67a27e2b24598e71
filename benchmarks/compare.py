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

Each child imports ``vllm_inline`` from its tree through ``trees.TreeFinder``, which maps the
import names to directories as that tree's own ``pyproject.toml`` does
(``[tool.setuptools.package-dir]``: ``vllm_inline.engine`` is the top-level ``engine/``, ...),
ahead of the editable install's finder. The measuring code (``paths.py``, ``measure.py``,
``bulk_paths.py``) is this tree's for both sides; only the package differs.

Paths: ``Engine``, ``ChatVLLM`` and LlamaIndex ``VLLM``, each async and sync, streaming at each
concurrency (``run.inline_paths``, loads as in ``run.py``), and the bulk paths
``ChatVLLM.batch``, ``ChatVLLM.abatch`` and the LlamaIndex gather over ``VLLM.achat``
(``bulk_paths.inline_paths``) at each size. A version without ``ChatVLLM.batch`` of its own runs
LangChain's default (a thread pool).

Pairing: for each pair round and each (path, load), ``this`` runs once, between the ``REF``
run and the ``this'`` run (``REF, this, this'`` or ``this', this, REF``, alternately), each
after a pause of ``pairing.SETTLE_S`` (an engine's processes spin for a second after a run).
Ratio ``this/REF`` = tok/s of ``this`` over that of the ``REF`` run next to it; the A/A ratio
``this/this'`` is taken the same way, so its spread is what this host resolves. The order of
the (path, load) cells rotates from one round to the next.

Statistics: each line's ``this/REF`` and A/A figure is the median of its ratios, with a 95 %
confidence interval of that median from order statistics (``pairing.median_ci``; no assumption on
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
import os
import pathlib
import sys
import time
from functools import partial
from typing import Any

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import paths as P
import report
import run
import trees  # in vLLM's engine processes: installs the tree's finder (trees.TREE_ENV)
from bulk_paths import callback_paths
from bulk_paths import inline_paths as bulk_paths
from children import LineChild, answer_lines, exit_on_sigterm
from compare_report import SIDES, cells, pct, report_text, summarize, unresolved
from measure import clocked
from models import SPECS, ModelSpec, build_model
from pairing import SETTLE_S, alternating, rotated, settled

STREAM_PATHS = P.PATHS[1:-1]
"""vllm-inline's streaming paths (``run.inline_paths``' names: not raw, not HTTP)."""

BULK_PATHS = ("ChatVLLM.batch", "ChatVLLM.abatch", "LlamaIndex gather(achat)")
"""``bulk_paths.inline_paths``' names of the bulk paths compared."""

CALLBACK_PATHS = ("ChatVLLM.batch (usage callback)", "ChatVLLM.abatch (usage callback)")
"""``bulk_paths.callback_paths``' names: bulk lines with a callback handler attached, measured
only when ``--paths`` names them."""

log = report.progress("compare")


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
    trees.use_tree(tree)
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

    every_bulk = bulk_paths(model, bulk_tokens, run.ENGINE_OPTIONS)
    if any(name in CALLBACK_PATHS for name in bulks):
        every_bulk.update(callback_paths(model, bulk_tokens, run.ENGINE_OPTIONS))
    bulk_runs = {k: v for k, v in every_bulk.items() if k in bulks}
    for kind, request in streaming(run.WARMUP[1]).values():
        if kind == "async":
            asyncio.run(P.run_async_load(request, run.WARMUP[0], 1))
        else:
            P.run_sync_load(request, run.WARMUP[0], 1)
    for go in bulk_runs.values():
        go(16)
    measured = streaming(tokens)

    def measure_one(cmd: dict[str, Any]) -> dict[str, Any]:
        name, load = cmd["path"], cmd["load"]
        if name in measured:
            kind, request = measured[name]
            if kind == "async":
                return asyncio.run(run.measure_async(request, label, name, load, 0, tokens))
            return run.measure_sync(request, label, name, load, 0, tokens)
        generated, wall, used = clocked(partial(bulk_runs[name], load))
        return {
            "tok_s": generated / wall,
            "client_cpu_ms_per_input": 1000 * used / load,
            "tokens_ok": generated == load * bulk_tokens,
        }

    answer_lines(measure_one, str(pathlib.Path(vllm_inline.engine.__file__).parent))
    engine.shutdown()


class Child(LineChild):
    """One version's child process (:func:`serve`), kept up for the whole run, in a process
    group of its own (killed as one if it hangs)."""

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
        super().__init__(cmd, f"the {label} child", own_group=True)

    def measure(self, path: str, load: int) -> dict[str, Any]:
        """One run of ``path`` at ``load`` (concurrency or inputs): its figures."""
        return self.ask({"path": path, "load": load})


# -- the paired runs ----------------------------------------------------------------------------


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
        order_of_lines = rotated(todo, rnd)
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
            order_of_lines = [cell for cell in order_of_lines if cell in left]
        for path, load in order_of_lines:
            t0 = time.perf_counter()
            # Each line's order alternates from round to round (and between neighbouring lines).
            order = alternating(sides, rnd + todo.index((path, load)))
            got = {}
            for side in order:
                got[side] = settled(partial(children[side].measure, path, load))
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


# -- main ---------------------------------------------------------------------------------------


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
        + "; named only: "
        + ", ".join(CALLBACK_PATHS)
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
    known = STREAM_PATHS + BULK_PATHS + CALLBACK_PATHS
    unknown = set(names) - set(known)
    if unknown:
        ap.error(f"unknown path(s) {sorted(unknown)}; known: {', '.join(known)}")
    skip = [s for s in args.skip.split(",") if s]

    def keep(name: str) -> bool:
        return (not names or name in names) and not any(s in name for s in skip)

    args.streams = [p for p in STREAM_PATHS if keep(p)]
    args.bulks = [p for p in BULK_PATHS if keep(p)] + [p for p in CALLBACK_PATHS if p in names]
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
    exit_on_sigterm()  # so that the children and the worktrees are cleaned up
    started = time.perf_counter()
    ref_sha = trees.git("rev-parse", "--short", f"{args.ref}^{{commit}}")
    if args.this:
        this_sha = trees.git("rev-parse", "--short", f"{args.this}^{{commit}}")
        this_name = f"{args.this} ({this_sha})"
    else:
        dirty = trees.git("status", "--porcelain", "--", "vllm_inline", "engine", "integrations")
        this_name = f"this tree ({trees.git('rev-parse', '--short', 'HEAD')}"
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
    with trees.worktrees({"REF": ref_sha, "this": this_sha if args.this else None}) as tree:
        tree["this'"] = tree["this"]
        try:
            for side in SIDES:
                if side == "this'" and args.no_aa:
                    continue
                children[side] = Child(side, tree[side], args, model)
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
    elapsed = time.perf_counter() - started
    load_after = os.getloadavg()
    rows = summarize(runs, args)
    text = report_text(rows, args, this_name, ref_sha, elapsed, (load_before, load_after))
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"compare-{ref_sha}"
    stem.with_suffix(".txt").write_text(text + "\n")
    meta = {
        "date": report.now_utc(),
        "ref": args.ref,
        "ref_sha": ref_sha,
        "this": this_name,
        "machine": report.machine(),
        "command": report.command_line(),
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
        "settle_s": SETTLE_S,
        "rounds_per_stream": {c: run.rounds_for(c) for c in args.concurrency},
    }
    report.write_json(stem.with_suffix(".json"), {"meta": meta, "summary": rows, "runs": runs})
    log(f"wrote {stem}.txt and .json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
