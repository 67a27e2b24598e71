"""Bulk generation: ``ChatVLLM.batch``/``abatch`` and LlamaIndex's bulk path against vLLM's own
async engine (the default) or against ``vllm.LLM.chat``, on the same list of N inputs.

    python benchmarks/bulk.py                  # against AsyncLLM.generate gathered, 256/1,024 inputs
    python benchmarks/bulk.py --against llm    # against vllm.LLM.chat, 16/256/1,024 inputs
    python benchmarks/bulk.py --quick          # 16/128 inputs, 16 tokens, 1 repeat
    python benchmarks/bulk.py --model cpu-4x512 --sizes 64 --tokens 64

Every path generates exactly ``--tokens`` tokens for each of the same N conversations
(``"Write a short story about robot number i."``), with the same sampling values as
``benchmarks/run.py`` (``ignore_eos``, ``temperature=1.0``, ``repetition_penalty=1.0``), on
engines started with the same options (``run.ENGINE_OPTIONS``).

``--against asyncllm`` (the default): the in-process limit. The reference is
``AsyncLLM.generate`` gathered over the N conversations (rendered with the chat template, final
output only, on the engine's own loop: no vllm-inline request path, no framework), on the very
engine vllm-inline started, with vLLM's stats on as vllm-inline ships it. Every run of a path is
paired with a reference run right before or right after it (alternately), in the same process
on the same engine. The paths: ``ChatVLLM.batch``, ``ChatVLLM.abatch``, LlamaIndex
``asyncio.gather`` over ``VLLM.achat``, and ``Engine.astream(stream=False)`` gathered (our
engine alone, no framework) and the same two framework calls over ``bare_frameworks.py``'s
bare models (the frameworks' own per-run work), for reading the others, plus the reference
paired with itself (A/A). The targets (``bulk_report.py``): tok/s >= ``TARGET`` x the
reference's and client CPU per input (the calling process's CPU time; the engine core and its
worker are other processes) <= ``CPU_TARGET`` x the reference's, each judged on the median of
the paired ratios. After the warm-up the heap is frozen (``gc.freeze()``, as vLLM's server does
after start-up) and each timed run starts after a ``gc.collect()``, so that no run is charged
for collecting the garbage of the run before it.
Writes ``results/bulk-asyncllm.json``.

``--against llm``: the reference is ``vllm.LLM.chat(list)``, vLLM's offline batch:

- ``vllm.LLM.chat(list)``: vLLM's offline batch, the reference. It runs in a child process
  that stays up (an ``LLM`` and vllm-inline's ``AsyncLLM`` in one process would leave one
  engine's worker polling while the other runs), and runs once for every run of the other
  paths, on the same size, right before or right after it (alternately), each timed run
  after a pause of ``pairing.SETTLE_S`` (the other engine's processes spin for a second after
  a run).
- three baselines, not paths of ours: ``vllm.LLM.chat`` on a second engine of its own, paired
  with the reference like any path (A/A: the ratios this host gives between two identical
  engines); ``AsyncLLM.generate`` gathered over the N conversations (rendered with the chat
  template; no vllm-inline code, no framework): what vLLM's own async engine gives; and
  ``Engine.astream(stream=False)`` gathered (our engine, no framework);
- ``ChatVLLM.batch`` and ``ChatVLLM.abatch`` (every input at once, :mod:`batching`);
- ``Runnable.batch`` (LangChain's thread pool of ``min(32, cpus + 4)``: what ``batch`` was);
- LlamaIndex ``asyncio.gather`` over ``VLLM.achat``;
- LlamaIndex ``QuestionsAnsweredExtractor`` over N nodes, with its default ``num_workers=4``
  and with ``num_workers=N`` (its own prompt, so compared with the other extractor run only).

Each vllm-inline path runs twice (``--stats both``, the default with ``--against llm``): on the
default engine, which records vLLM's stats for ``Engine.stats()`` and Prometheus, and, named
``... [stats off]``, on an engine started with ``disable_log_stats=True``, which records none.
``--stats on`` or ``--stats off`` runs one of them. The reference has the same engine options
as the engine it is paired with, stats included: ``vllm.LLM`` with ``disable_log_stats=False``
against the default engine, and with its own default (no stats) against ``[stats off]`` (a
new reference child for each). After the warm-up each process freezes its heap
(``gc.freeze()``) and every timed run starts after a ``gc.collect()``, on both sides.

tok/s = generated tokens / wall time of the whole call. Each run's ratio is its tok/s over
that of the ``vllm.LLM.chat`` run paired with it: this host's speed drifts within minutes, and
a pair, seconds apart, shares the drift. Prints one line per path and size with the paired
ratios and their median, judged against the target (median >= 0.95x ``vllm.LLM.chat``);
writes ``results/bulk.json``. Each line also gives the client CPU per input
(``time.process_time`` of the calling process, lowest over the repeats; the engine core and
its worker are other processes in both cases): on a shared host it moves far less than tok/s,
and it is the part this package adds.
"""

from __future__ import annotations

import argparse
import gc
import os
import pathlib
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from typing import Any

os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bulk_paths import (
    AA_PATH,
    BASELINE,
    MAX_INPUTS,
    STATS_OFF,
    bare_paths,
    conversations,
    extractor_paths,
    inline_paths,
)
from bulk_report import against_baseline_report, against_llm_report
from children import LineChild, answer_lines
from measure import clocked
from models import SPECS, build_model
from pairing import next_to, rotated, settled
from paths import sampling
from report import progress, write_json
from run import ENGINE_OPTIONS

PAUSE_S = 0.3
"""Pause before each run of ``--against asyncllm`` (one engine: no other engine spins)."""

AGAINST_PATHS = (
    "ChatVLLM.batch",
    "ChatVLLM.abatch",
    "LlamaIndex gather(achat)",
    "Engine.astream gather (baseline)",
    "bare LangChain abatch (baseline)",
    "bare LlamaIndex gather(achat) (baseline)",
)
"""The paths ``--against asyncllm`` measures (each paired with ``BASELINE``). The bare ones
(``bare_frameworks.py``) are the frameworks' own per-run work around ``Engine.astream``: what
``ChatVLLM`` and ``VLLM`` cost beyond them is ours."""

log = progress("bulk")


# -- the reference: vllm.LLM.chat in a child process ------------------------------------------


def reference_child(model: str, tokens: int, stats: bool) -> None:
    """Serve ``vllm.LLM.chat`` runs (:func:`children.answer_lines`): a size per request, the
    answer ``[tok/s, client CPU ms per input]``. ``stats``: the engine records vLLM's stats
    (``disable_log_stats=False``, as vllm-inline's default engine and vLLM's server);
    otherwise ``vllm.LLM``'s own default, none."""
    from vllm import LLM, SamplingParams

    llm = LLM(model=model, **ENGINE_OPTIONS, disable_log_stats=not stats)
    params = SamplingParams(**sampling(tokens))
    convs = conversations(MAX_INPUTS)
    llm.chat(convs[:16], params, use_tqdm=False)  # warm-up
    gc.collect()
    gc.freeze()  # as in the calling process (measure_inline)

    def run(n: int) -> list[float]:
        gc.collect()
        results, wall, used = clocked(lambda: llm.chat(convs[:n], params, use_tqdm=False))
        generated = sum(len(r.outputs[0].token_ids) for r in results)
        assert generated == n * tokens, (generated, n * tokens)
        return [generated / wall, 1000 * used / n]

    answer_lines(run)


class Reference(LineChild):
    """``vllm.LLM.chat`` in a child process that stays up (:func:`reference_child`), so that
    every run of ours is paired with a run of the reference right next to it in time.

    A child process: an ``LLM`` and vllm-inline's ``AsyncLLM`` in one process would leave one
    engine's worker polling while the other runs. Apart, an idle engine costs ~1 % of a core
    (an idle ``LLM``'s process tree used 0.14 s of CPU in 10 s), but for a second after each
    run its processes spin on a full core (0.96-1.04 cores in each quarter second, then 0-0.04):
    hence ``pairing.SETTLE_S`` before every timed run."""

    def __init__(self, model: str, tokens: int, *, stats: bool) -> None:
        log(f"vllm.LLM.chat: starting its engine (stats {'on' if stats else 'off'}) in a child")
        cmd = [sys.executable, __file__, "--reference-child", model, "--tokens", str(tokens)]
        cmd += ["--stats", "on" if stats else "off"]
        # vLLM's LLM leaves its IPC sockets in the temporary directory (docs/deployment.md,
        # "Files in /tmp"): the child gets one of its own, removed when it is closed.
        self._tmp = tempfile.mkdtemp(prefix="vllm-inline-bulk-reference-")
        super().__init__(cmd, "the vllm.LLM.chat child", env={**os.environ, "TMPDIR": self._tmp})
        self.ready()

    def close(self, timeout: float = 120) -> None:
        """Stop the child, then remove its temporary directory."""
        try:
            super().close(timeout)
        finally:
            shutil.rmtree(self._tmp, ignore_errors=True)

    def run(self, n: int) -> tuple[float, float]:
        """tok/s and client CPU ms per input of ``vllm.LLM.chat`` on the first ``n`` inputs."""
        tok_s, cpu_ms = self.ask(n)
        return tok_s, cpu_ms


# -- the paired runs --------------------------------------------------------------------------


def paired_row(
    name: str,
    n: int,
    rep: int,
    ours: tuple[float, float],
    ref: tuple[float, float],
    reference_first: bool,
) -> dict[str, Any]:
    """One run of path ``name`` on ``n`` inputs and the reference run next to it, each as
    ``(tok/s, client CPU ms per input)``, with their tok/s ratio."""
    return {
        "path": name,
        "n": n,
        "rep": rep,
        "tok_s": ours[0],
        "client_cpu_ms_per_input": ours[1],
        "reference_tok_s": ref[0],
        "reference_client_cpu_ms_per_input": ref[1],
        "reference_first": reference_first,
        "ratio": ours[0] / ref[0],
    }


def collected(call: Callable[[], Any]) -> Any:
    """``call()`` after a full collection, so that no run is charged for collecting the
    garbage of the run before it (the reference child does the same before each of its runs)."""
    gc.collect()
    return call()


def measure_inline(
    model: str,
    sizes: list[int],
    tokens: int,
    repeats: int,
    skip: list[str],
    stats_off: bool,
    reference: Reference,
    twin: Reference | None = None,
) -> list[dict[str, Any]]:
    """One row per run of each path and size over ``repeats`` rounds (paths rotate each
    round), each with the ``vllm.LLM.chat`` run on the same size right before or right after
    it (alternately) and their ratio. ``stats_off``: on an engine started with
    ``disable_log_stats=True`` (no vLLM stats; ``vllm.LLM``'s default), the path names ending
    in ``STATS_OFF``. ``twin``: a second ``vllm.LLM.chat`` engine, measured as one more path
    (``AA_PATH``), so that the reference is paired with itself: what this host can resolve."""
    from vllm_inline.engine import get_engine

    options = {**ENGINE_OPTIONS, "disable_log_stats": True} if stats_off else ENGINE_OPTIONS
    suffix = STATS_OFF if stats_off else ""
    log(f"vllm-inline: starting the engine{suffix}")
    engine = get_engine(model, **options).start()
    paths = {**inline_paths(model, tokens, options), **extractor_paths(model, tokens, options)}
    paths = {k + suffix: v for k, v in paths.items() if not any(s in k for s in skip)}
    if twin is not None:
        paths = {AA_PATH: twin.run, **paths}
    for name, run in paths.items():
        run(16)  # warm-up: kernels, prefix cache, lazy imports
    gc.collect()
    gc.freeze()  # as vLLM's server after start-up; see measure_against_baseline
    rows: list[dict[str, Any]] = []
    try:
        for rep in range(repeats):
            for n in sizes:
                for name in rotated(list(paths), rep):
                    if n > 256 and name.startswith(
                        ("Runnable.batch", "QuestionsAnsweredExtractor")
                    ):
                        continue  # 6 or 4 requests at a time: minutes at 1,024 inputs
                    reference_first = len(rows) % 2 == 0
                    (result, wall, used), (ref_tok_s, ref_cpu) = next_to(
                        partial(
                            collected, partial(settled, partial(clocked, partial(paths[name], n)))
                        ),
                        partial(settled, partial(reference.run, n)),
                        reference_first,
                    )
                    if isinstance(result, tuple):  # the twin: measured in its own process
                        tps, cpu_ms = result
                    else:
                        assert result == n * tokens, (name, result, n * tokens)
                        tps, cpu_ms = result / wall, 1000 * used / n
                    rows.append(
                        paired_row(
                            name, n, rep, (tps, cpu_ms), (ref_tok_s, ref_cpu), reference_first
                        )
                    )
                    log(
                        f"  {name:<42} n={n:<5} rep {rep}: {tps:8.0f} tok/s, client CPU "
                        f"{cpu_ms:.2f} ms/input; vllm.LLM.chat {ref_tok_s:8.0f} tok/s "
                        f"({'before' if reference_first else 'after'}): {tps / ref_tok_s:.2f}x"
                    )
    finally:
        engine.shutdown()
    return rows


def measure_against_baseline(
    model: str, sizes: list[int], tokens: int, repeats: int, skip: list[str]
) -> list[dict[str, Any]]:
    """One row per run of each path and size, each paired with a ``BASELINE`` run on the same
    engine right before or right after it (alternately): same process, same engine, same
    options (vLLM's stats on, as vllm-inline ships). The baseline is also paired with itself
    (``BASELINE`` A/A): the ratios this host gives between two identical runs."""
    from vllm_inline.engine import get_engine

    log("vllm-inline: starting the engine")
    engine = get_engine(model, **ENGINE_OPTIONS).start()
    every = {
        **inline_paths(model, tokens, ENGINE_OPTIONS),
        **bare_paths(model, tokens, ENGINE_OPTIONS),
    }
    baseline = every[BASELINE]
    paths = {k: every[k] for k in AGAINST_PATHS if not any(s in k for s in skip)}
    paths = {BASELINE + " A/A": baseline, **paths}
    for run in paths.values():
        run(16)  # warm-up: kernels, prefix cache, lazy imports
    # The heap as it stands (vLLM, torch, the frameworks) is left out of the collector's full
    # passes, as vLLM's own server does after start-up; and each run starts with no garbage
    # from the run before it, whose collection would otherwise be charged to whichever run
    # comes next: a path's CPU then counts its own collections only.
    gc.collect()
    gc.freeze()

    def timed(run: Callable[[int], int], n: int) -> tuple[float, float]:
        gc.collect()
        generated, wall, used = settled(partial(clocked, partial(run, n)), PAUSE_S)
        assert generated == n * tokens, (generated, n * tokens)
        return generated / wall, 1000 * used / n

    rows: list[dict[str, Any]] = []
    try:
        for rep in range(repeats):
            for n in sizes:
                for name in rotated(list(paths), rep):
                    baseline_first = len(rows) % 2 == 0
                    (tps, cpu_ms), ref = next_to(
                        partial(timed, paths[name], n), partial(timed, baseline, n), baseline_first
                    )
                    row = paired_row(name, n, rep, (tps, cpu_ms), ref, baseline_first)
                    rows.append({**row, "cpu_ratio": cpu_ms / ref[1]})
                    log(
                        f"  {name:<42} n={n:<5} rep {rep}: {tps:8.0f} tok/s, client CPU "
                        f"{cpu_ms:.2f} ms/input; baseline {ref[0]:8.0f} tok/s, {ref[1]:.2f} "
                        f"ms/input ({'before' if baseline_first else 'after'}): "
                        f"{tps / ref[0]:.2f}x tok/s, {cpu_ms / ref[1]:.2f}x CPU"
                    )
    finally:
        engine.shutdown()
    return rows


# -- main ---------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny", help="a models.SPECS name: " + ", ".join(SPECS))
    ap.add_argument(
        "--against",
        choices=["asyncllm", "llm"],
        default="asyncllm",
        help="the reference: vLLM's AsyncLLM.generate gathered on the same engine "
        "(the in-process limit; default) or vllm.LLM.chat in a child process",
    )
    ap.add_argument(
        "--sizes",
        default=None,
        help="inputs per call (default: 256,1024 against asyncllm, 16,256,1024 against llm)",
    )
    ap.add_argument("--tokens", type=int, default=32, help="generated tokens per input")
    ap.add_argument(
        "--repeats",
        type=int,
        default=None,
        help="rounds over every path (default: 5 against asyncllm, 3 against llm)",
    )
    ap.add_argument(
        "--skip", default="", help="skip paths whose name contains these (comma-separated)"
    )
    ap.add_argument(
        "--stats",
        choices=["on", "off", "both"],
        default="both",
        help="--against llm: vllm-inline engine with vLLM's stats (the default "
        "engine), with disable_log_stats=True (as vllm.LLM), or both, one after the other",
    )
    ap.add_argument(
        "--no-aa",
        action="store_true",
        help="--against llm: do not measure vllm.LLM.chat against a second engine of its own (A/A)",
    )
    ap.add_argument("--quick", action="store_true", help="sizes 16,128, 16 tokens, 1 repeat")
    ap.add_argument("--out", type=pathlib.Path, default=HERE / "results")
    ap.add_argument("--reference-child", metavar="MODEL", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.quick:
        args.sizes, args.tokens, args.repeats = "16,128", 16, 1
    if args.reference_child:
        reference_child(args.reference_child, args.tokens, stats=args.stats == "on")
        return 0
    args.sizes = args.sizes or ("256,1024" if args.against == "asyncllm" else "16,256,1024")
    args.repeats = args.repeats or (5 if args.against == "asyncllm" else 3)
    sizes = [int(s) for s in args.sizes.split(",") if s]
    if args.against == "asyncllm":
        return main_against_baseline(args, sizes)

    started = time.perf_counter()
    model = str(build_model(SPECS[args.model]))
    log(f"{args.model}: {model}; sizes {sizes}, {args.tokens} tokens per input")
    skip = [s for s in args.skip.split(",") if s]
    rows: list[dict[str, Any]] = []
    first = True
    for stats_off in {"on": [False], "off": [True], "both": [False, True]}[args.stats]:
        # The reference has the engine options of the engine it is paired with, stats included.
        reference = Reference(model, args.tokens, stats=not stats_off)
        # The A/A once is enough: it does not depend on our engine's options.
        twin = (
            None if args.no_aa or not first else Reference(model, args.tokens, stats=not stats_off)
        )
        first = False
        try:
            rows += measure_inline(
                model, sizes, args.tokens, args.repeats, skip, stats_off, reference, twin
            )
        finally:
            reference.close()
            if twin is not None:
                twin.close()
    elapsed = time.perf_counter() - started

    lines, summary = against_llm_report(rows, sizes, elapsed, args)
    print("\n".join(lines))
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(
        args.out / "bulk.json",
        {
            "model": args.model,
            "tokens": args.tokens,
            "sizes": sizes,
            "repeats": args.repeats,
            "engine_options": ENGINE_OPTIONS,
            "elapsed_s": round(elapsed, 1),
            "summary": summary,
            "runs": rows,
        },
    )
    log(f"wrote {args.out / 'bulk.json'}")
    return 0


def main_against_baseline(args: argparse.Namespace, sizes: list[int]) -> int:
    started = time.perf_counter()
    model = str(build_model(SPECS[args.model]))
    log(f"{args.model}: {model}; sizes {sizes}, {args.tokens} tokens per input, against {BASELINE}")
    skip = [s for s in args.skip.split(",") if s]
    rows = measure_against_baseline(model, sizes, args.tokens, args.repeats, skip)
    elapsed = time.perf_counter() - started
    lines, summary = against_baseline_report(rows, sizes, elapsed, args.repeats)
    print("\n".join(lines))
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(
        args.out / "bulk-asyncllm.json",
        {
            "model": args.model,
            "tokens": args.tokens,
            "sizes": sizes,
            "repeats": args.repeats,
            "against": BASELINE,
            "engine_options": ENGINE_OPTIONS,
            "elapsed_s": round(elapsed, 1),
            "load_average": os.getloadavg(),
            "summary": summary,
            "runs": rows,
        },
    )
    log(f"wrote {args.out / 'bulk-asyncllm.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
