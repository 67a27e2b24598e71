"""vllm-inline against raw vLLM and the HTTP path, in one run: ``make bench``.

For each random model (:mod:`models`) the same chat turn is streamed with the same sampling
values, at each concurrency, three times, on engines started with the same options:

1. raw ``AsyncLLM.generate`` (DELTA output), driven on the engine's own event loop: the limit;
2. ``Engine.astream`` / ``Engine.stream``; 3. ``ChatVLLM.astream`` / ``.stream``;
4. LlamaIndex ``VLLM.astream_chat`` / ``.stream_chat`` (1-4 share one engine, interleaved);
5. vLLM's OpenAI-compatible server on 127.0.0.1 + langchain-openai ``ChatOpenAI.astream``.

One engine at a time (1-4, then the server). Sync paths run one thread per stream.
Prints a table and one ratio line per path; writes ``benchmarks/results/bench.json``,
``bench.md`` and ``bench.png``. Progress goes to stderr.

    python benchmarks/run.py                      # the full run (~17 min on 2 cores)
    make bench BENCH_ARGS="--models tiny --repeats 1"
    python benchmarks/run.py --quick              # a smoke run (tiny model, c=1,8, 1 repeat)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import platform
import re
import subprocess
import sys
import time
from typing import Any

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import servers  # first: it keeps the environment this script started with (servers.USER_ENV)

os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # before vLLM is imported anywhere
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import paths as P
import report
from measure import Record, RssSampler, summarize
from models import SPECS, ModelSpec, build_model
from pairing import rotated

ENGINE_OPTIONS: dict[str, Any] = {
    "dtype": "float32",  # bfloat16 kills the CPU worker (SIGILL)
    "max_model_len": 512,
    "enforce_eager": True,
    "kv_cache_memory_bytes": 256 * 2**20,
    # Set, not left to vLLM: its defaults differ between AsyncLLM and the server on the CPU.
    "max_num_seqs": 64,
    "max_num_batched_tokens": 2048,
}
"""Engine options of every path (``AsyncEngineArgs`` fields / ``vllm serve`` flags)."""

# What vllm-inline's engine adds to the options when not given (engine/seam/vllm_engine.py): given to the
# raw engine and to the server too, so all three engines are configured alike.
_STRUCTURED = {"backend": "xgrammar", "disable_any_whitespace": True}


log = report.progress("bench")


def rounds_for(concurrency: int) -> int:
    """Requests per stream, one after the other: 8 at c=1, 3 waves at c>=3 (2-6 s per run:
    long enough to average out the engine's step-to-step jitter)."""
    return max(3, 8 // concurrency)


# -- import cost ------------------------------------------------------------------------------


def import_cost(module: str) -> dict[str, Any]:
    """``python -X importtime -c "import <module>"``: time, and whether torch/vLLM loaded."""
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", f"import {module}"],
        capture_output=True,
        text=True,
        check=True,
    )
    wall = time.perf_counter() - t0
    names, cumulative = set(), 0
    for line in proc.stderr.splitlines():
        m = re.match(r"import time:\s+(\d+)\s+\|\s+(\d+)\s+\|\s+(.*)$", line)
        if m:
            name = m.group(3).strip()
            names.add(name.split(".")[0])
            if name == module:
                cumulative = int(m.group(2))
    heavy = sorted(names & {"torch", "vllm"})
    return {
        "module": module,
        "import_ms": cumulative / 1e3,
        "process_wall_ms": wall * 1e3,
        "heavy": heavy,
    }


# -- one measured run ---------------------------------------------------------------------------


def record(
    model: str, path: str, c: int, rep: int, recs: list[Record], rss: RssSampler, tokens: int
) -> dict[str, Any]:
    summary = summarize(recs, tokens)
    run = {
        "model": model,
        "path": path,
        "concurrency": c,
        "rep": rep,
        **summary,
        "peak_rss_mib": rss.peak_mib,
        "client_cpu_us_per_tok": rss.cpu_s * 1e6 / max(1, summary["tokens"]),
    }
    log(
        f"  {model} {path:<24} c={c:<3} rep {rep}: {summary['tok_s']:8.0f} tok/s  "
        f"TTFT p50 {summary['ttft_p50_ms']:7.1f} ms  chunks/req {summary['chunks_per_req']:.0f}"
        + ("" if summary["tokens_ok"] else "  (token count mismatch!)")
    )
    return run


async def measure_async(
    request: Any, model: str, path: str, c: int, rep: int, tokens: int
) -> dict[str, Any]:
    with RssSampler() as rss:
        recs = await P.run_async_load(request, c, rounds_for(c))
    return record(model, path, c, rep, recs, rss, tokens)


def measure_sync(
    request: Any, model: str, path: str, c: int, rep: int, tokens: int
) -> dict[str, Any]:
    with RssSampler() as rss:
        recs = P.run_sync_load(request, c, rounds_for(c))
    return record(model, path, c, rep, recs, rss, tokens)


WARMUP = (4, 8)  # streams, tokens: compiles kernels, fills the prefix cache, loads lazy imports


# -- (1)-(4): raw AsyncLLM and vllm-inline, on one engine ---------------------------------------


def inline_paths(engine: Any, chat: Any, li: Any, tokens: int) -> list[tuple[str, str, Any]]:
    """vllm-inline's streaming paths (2)-(4) as ``(name, "async" | "sync", request)``, on
    ``engine`` and the ``ChatVLLM`` (``chat``) and LlamaIndex ``VLLM`` (``li``) sharing it."""
    kw = P.sampling(tokens)
    return [
        ("Engine.astream", "async", P.engine_async(engine, tokens)),
        ("Engine.stream", "sync", P.engine_sync(engine, tokens)),
        ("ChatVLLM.astream", "async", P.langchain_async(chat, tokens, **kw)),
        ("ChatVLLM.stream", "sync", P.langchain_sync(chat, tokens, **kw)),
        ("VLLM.astream_chat", "async", P.llama_index_async(li, tokens)),
        ("VLLM.stream_chat", "sync", P.llama_index_sync(li, tokens)),
    ]


def phase_inline(
    spec: ModelSpec, model: str, prompt_ids: list[int], args: argparse.Namespace
) -> list[dict[str, Any]]:
    """Raw ``AsyncLLM.generate`` and every vllm-inline path, interleaved on one engine.

    The raw path drives the very ``AsyncLLM`` that vllm-inline started, directly on the event
    loop it is bound to (its own thread): no bridge, no converters, the same engine and options.
    Within each (repeat, concurrency) block raw runs before and after every path (raw, p1, raw,
    p2, ..., raw; the order of the paths rotates from one repeat to the next), and each path's
    run carries the mean of its two neighbours (``raw_*``): the ratios are taken pairwise, so a
    machine whose speed drifts by more than the overhead being measured (it does, here) weighs
    on both sides of each ratio alike.
    """
    from vllm_inline.engine import get_engine

    log(f"{spec.name}: starting the engine")
    engine = get_engine(model, **ENGINE_OPTIONS).start()
    runtime = engine.runtime  # the AsyncLLM and its loop thread
    chat = P.chat_vllm(model, ENGINE_OPTIONS)
    li = P.llama_index_llm(model, ENGINE_OPTIONS)
    assert chat.engine is engine and li.engine is engine, "the integrations must share the engine"

    def on_engine_loop(coro: Any) -> Any:
        return runtime.loop.submit(coro).result()

    def paths(tokens: int) -> list[tuple[str, str, Any]]:
        return inline_paths(engine, chat, li, tokens)

    async def main() -> list[dict[str, Any]]:
        on_engine_loop(
            P.run_async_load(P.raw_request(runtime.llm, prompt_ids, WARMUP[1]), WARMUP[0], 1)
        )
        for _, kind, request in paths(WARMUP[1]):
            if kind == "async":
                await P.run_async_load(request, WARMUP[0], 1)
            else:
                P.run_sync_load(request, WARMUP[0], 1)
        raw = P.raw_request(runtime.llm, prompt_ids, spec.tokens)
        measured = [
            (name, kind, request)
            for name, kind, request in paths(spec.tokens)
            if not args.paths or name in args.paths
        ]
        runs = []
        raw_reps = len(measured) + 1
        for rep in range(args.repeats):
            order = rotated(measured, rep)
            for c in args.concurrency:

                def raw_run(k: int, c: int = c, rep: int = rep) -> dict[str, Any]:
                    # Blocks this loop, which is idle meanwhile.
                    return on_engine_loop(
                        measure_async(
                            raw, spec.name, P.PATHS[0], c, rep * raw_reps + k, spec.tokens
                        )
                    )

                block = [raw_run(0)]
                for k, (name, kind, request) in enumerate(order, start=1):
                    if kind == "async":
                        block.append(
                            await measure_async(request, spec.name, name, c, rep, spec.tokens)
                        )
                    else:
                        block.append(measure_sync(request, spec.name, name, c, rep, spec.tokens))
                    block.append(raw_run(k))
                runs += report.pair_with_raw(block)
        return runs

    try:
        return asyncio.run(main())
    finally:
        engine.shutdown()


# -- (5) vLLM's OpenAI server + ChatOpenAI -------------------------------------------------------


def phase_http(spec: ModelSpec, model: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    port = servers.free_port()
    log_path = args.out / f"server-{spec.name}.log.tmp"
    log(f"{spec.name}: HTTP: starting vLLM's OpenAI server on 127.0.0.1:{port} (log: {log_path})")
    proc = servers.start_server(
        model,
        port,
        ENGINE_OPTIONS,
        log_path,
        ["--structured-outputs-config", json.dumps(_STRUCTURED)],
    )
    try:
        servers.wait_healthy(f"http://127.0.0.1:{port}/health", proc, timeout=300)
        base_url = f"http://127.0.0.1:{port}/v1"

        async def main() -> list[dict[str, Any]]:
            warm = P.chat_openai(model, base_url, WARMUP[1])
            await P.run_async_load(P.langchain_async(warm, WARMUP[1]), WARMUP[0], 1)
            request = P.langchain_async(P.chat_openai(model, base_url, spec.tokens), spec.tokens)
            runs = []
            for rep in range(args.repeats):
                for c in args.concurrency:
                    runs.append(
                        await measure_async(request, spec.name, P.PATHS[-1], c, rep, spec.tokens)
                    )
            return runs

        return asyncio.run(main())
    finally:
        servers.stop_server(proc)


# -- main ---------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--models", default=",".join(SPECS), help="comma-separated: " + ", ".join(SPECS)
    )
    ap.add_argument("--concurrency", default="1,8,32")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=None, help="override tokens per request")
    ap.add_argument("--paths", default="", help="only these in-process paths (comma-separated)")
    ap.add_argument("--no-http", action="store_true")
    ap.add_argument("--quick", action="store_true", help="tiny model, c=1,8, 1 repeat, 32 tokens")
    ap.add_argument("--out", type=pathlib.Path, default=HERE / "results")
    args = ap.parse_args(argv)
    if args.quick:
        args.models, args.concurrency, args.repeats, args.tokens = (
            "tiny",
            "1,8",
            1,
            args.tokens or 32,
        )
    args.models = [m for m in args.models.split(",") if m]
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    args.paths = [p for p in args.paths.split(",") if p]
    args.out.mkdir(parents=True, exist_ok=True)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    imports = [
        import_cost("vllm_inline.integrations.langchain"),
        import_cost("vllm_inline.integrations.llama_index"),
    ]
    for i in imports:
        log(
            f"import {i['module']}: {i['import_ms']:.0f} ms, torch/vllm loaded: {i['heavy'] or 'no'}"
        )
    runs: list[dict[str, Any]] = []
    models: dict[str, Any] = {}
    for name in args.models:
        spec = SPECS[name]
        if args.tokens:
            spec = ModelSpec(spec.name, spec.layers, spec.hidden, spec.intermediate, args.tokens)
        model = str(build_model(spec))
        prompt_ids = P.prompt_ids(model)
        models[name] = {
            "path": model,
            "layers": spec.layers,
            "hidden": spec.hidden,
            "intermediate": spec.intermediate,
            "tokens_per_request": spec.tokens,
            "prompt_tokens": len(prompt_ids),
        }
        log(
            f"{name}: {model} ({spec.layers} layers, hidden {spec.hidden}), "
            f"{spec.tokens} tokens/request, prompt {len(prompt_ids)} tokens"
        )
        runs += phase_inline(spec, model, prompt_ids, args)
        if not args.no_http:
            runs += phase_http(spec, model, args)
    elapsed = time.perf_counter() - started

    agg = report.aggregate(runs)
    lines = []
    for name in args.models:
        lines += [
            (
                f"\n== {name}: {models[name]['layers']} layers, hidden {models[name]['hidden']}, "
                f"{models[name]['tokens_per_request']} tokens/request; mean over the "
                "runs (raw: before and after every path), ± half the spread =="
            ),
            report.text_table(agg, name),
        ]
    lines.append("\n== import cost ==")
    lines += [
        f"{i['module']}: {i['import_ms']:.0f} ms; torch/vllm imported: {', '.join(i['heavy']) or 'no'}"
        for i in imports
    ]
    lines.append(f"\n== ratios to raw AsyncLLM (run took {elapsed / 60:.1f} min) ==")
    for name in args.models:
        lines += report.ratio_lines(agg, name)
    print("\n".join(lines))

    meta = {
        "date": report.now_utc(),
        "machine": report.machine(),
        "python": platform.python_version(),
        "command": report.command_line(),
        "elapsed_s": round(elapsed, 1),
        "engine_options": {**ENGINE_OPTIONS, "structured_outputs_config": _STRUCTURED},
        "sampling": P.sampling(0) | {"max_tokens": "tokens_per_request"},
        "concurrency": args.concurrency,
        "repeats": args.repeats,
        "rounds": {c: rounds_for(c) for c in args.concurrency},
        "models": models,
        "versions": report.versions(),
    }
    out = args.out
    report.write_json(
        out / "bench.json",
        {
            "meta": meta,
            "imports": imports,
            "runs": runs,
            "summary": [
                {"model": k[0], "path": k[1], "concurrency": k[2], **v} for k, v in agg.items()
            ],
        },
    )
    md = [
        f"Run {meta['date']}, {meta['machine']}; `{meta['command']}` took {elapsed / 60:.1f} min.\n"
    ]
    for name in args.models:
        md += [
            (
                f"\n**{name}** ({models[name]['layers']} layers, hidden {models[name]['hidden']}, "
                f"{models[name]['tokens_per_request']} tokens/request)\n"
            ),
            report.markdown_tables(agg, name),
        ]
    md += [
        "\n```",
        *[line for name in args.models for line in report.ratio_lines(agg, name)],
        "```",
    ]
    (out / "bench.md").write_text("\n".join(md) + "\n")
    try:
        report.plot(agg, args.models, str(out / "bench.png"))
    except ImportError:
        log("matplotlib is not installed: no plot (pip install -e '.[bench]')")
    log(f"wrote {out / 'bench.json'}, bench.md, bench.png; total {elapsed / 60:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
