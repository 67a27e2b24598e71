"""Bulk generation: ``ChatVLLM.batch``/``abatch`` and LlamaIndex's bulk paths against
``vllm.LLM.chat`` on the same list, for 16, 256 and 1,024 inputs.

    python benchmarks/bulk.py                  # tiny model, 16/256/1024 inputs, 2 repeats
    python benchmarks/bulk.py --quick          # 16/128 inputs, 16 tokens, 1 repeat
    python benchmarks/bulk.py --model cpu-4x512 --sizes 64 --tokens 64

Every path generates exactly ``--tokens`` tokens for each of the same N conversations
(``"Write a short story about robot number i."``), with the same sampling values as
``benchmarks/run.py`` (``ignore_eos``, ``temperature=1.0``, ``repetition_penalty=1.0``), on
engines started with the same options (``run.ENGINE_OPTIONS``):

- ``vllm.LLM.chat(list)``: vLLM's offline batch, the reference. It runs in a child process
  (an ``LLM`` and vllm-inline's ``AsyncLLM`` in one process would leave one engine's worker
  polling while the other runs), once before and once after the other paths; each path is
  compared with the mean of those two runs.
- ``ChatVLLM.batch`` and ``ChatVLLM.abatch`` (every input at once, :mod:`batching`);
- ``Runnable.batch`` (LangChain's thread pool of ``min(32, cpus + 4)``: what ``batch`` was);
- LlamaIndex ``asyncio.gather`` over ``VLLM.achat``;
- LlamaIndex ``QuestionsAnsweredExtractor`` over N nodes, with its default ``num_workers=4``
  and with ``num_workers=N`` (its own prompt, so compared with the other extractor run only).

Each vllm-inline path runs twice (``--stats both``, the default): on the default engine, which
records vLLM's stats for ``Engine.stats()`` and Prometheus, and, named ``... [stats off]``, on
an engine started with ``disable_log_stats=True``, which records none, as ``vllm.LLM`` (whose
default that is). ``--stats on`` or ``--stats off`` runs one of them.

tok/s = generated tokens / wall time of the whole call. Prints one ratio line per path and
size against the target (>= 0.95x ``vllm.LLM.chat``); writes ``results/bulk.json``. Each line
also gives the client CPU per input (``time.process_time`` of the calling process, lowest over
the repeats; the engine core and its worker are other processes in both cases): on a shared
host it moves far less than tok/s, and it is the part this package adds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from models import SPECS, build_model
from paths import sampling
from run import ENGINE_OPTIONS

TARGET = 0.95
"""Each bulk path's tok/s against ``vllm.LLM.chat`` on the same list."""

STATS_OFF = " [stats off]"
"""Suffix of the paths measured on an engine started with ``disable_log_stats=True``."""


def log(msg: str) -> None:
    print(f"[bulk {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def prompts(n: int) -> list[str]:
    return [f"Write a short story about robot number {i}." for i in range(n)]


# -- the reference: vllm.LLM.chat in a child process ------------------------------------------


def reference_child(model: str, sizes: list[int], tokens: int, repeats: int) -> None:
    """``vllm.LLM.chat`` on each size (best of ``repeats``); prints one JSON line."""
    from vllm import LLM, SamplingParams

    llm = LLM(model=model, **ENGINE_OPTIONS)
    params = SamplingParams(**sampling(tokens))
    convs = [[{"role": "user", "content": p}] for p in prompts(max(sizes))]
    llm.chat(convs[:16], params, use_tqdm=False)  # warm-up
    out: dict[str, float] = {}
    cpu: dict[str, float] = {}
    for n in sizes:
        best, least = 0.0, float("inf")
        for _ in range(repeats):
            t0, c0 = time.perf_counter(), time.process_time()
            results = llm.chat(convs[:n], params, use_tqdm=False)
            wall, used = time.perf_counter() - t0, time.process_time() - c0
            generated = sum(len(r.outputs[0].token_ids) for r in results)
            assert generated == n * tokens, (generated, n * tokens)
            best = max(best, generated / wall)
            least = min(least, 1000 * used / n)
        out[str(n)] = best
        cpu[str(n)] = least
    print("RESULT " + json.dumps({"tok_s": out, "cpu_ms": cpu}), flush=True)


def reference(
    model: str, sizes: list[int], tokens: int, repeats: int
) -> tuple[dict[int, float], dict[int, float]]:
    """tok/s and client CPU ms per input of ``vllm.LLM.chat``, by size."""
    log(f"vllm.LLM.chat in a child process: sizes {sizes}")
    cmd = [sys.executable, __file__, "--reference-child", model, "--sizes",
           ",".join(map(str, sizes)), "--tokens", str(tokens), "--repeats", str(repeats)]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=True)
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    parsed = json.loads(line[len("RESULT "):])
    result = {int(k): v for k, v in parsed["tok_s"].items()}
    cpu = {int(k): v for k, v in parsed["cpu_ms"].items()}
    for n, tps in result.items():
        log(f"  vllm.LLM.chat n={n}: {tps:.0f} tok/s, client CPU {cpu[n]:.2f} ms/input")
    return result, cpu


# -- vllm-inline's bulk paths, on one engine -------------------------------------------------


def _lc_tokens(messages: list[Any]) -> int:
    return sum(m.usage_metadata["output_tokens"] for m in messages)


def inline_paths(model: str, tokens: int, options: dict[str, Any]) -> dict[str, Callable[[int], int]]:
    """Name -> ``run(n)`` returning the tokens generated for the first ``n`` prompts."""
    from langchain_core.runnables import Runnable
    from llama_index.core.base.llms.types import ChatMessage
    from vllm_inline.integrations.langchain import ChatVLLM
    from vllm_inline.integrations.llama_index import VLLM

    kw = sampling(tokens)
    chat = ChatVLLM(model=model, vllm_kwargs=options)
    li = VLLM(model=model, vllm_kwargs=options)
    texts = prompts(1024 * 4)

    def lc_batch(n: int) -> int:
        return _lc_tokens(chat.batch(texts[:n], **kw))

    def lc_abatch(n: int) -> int:
        return _lc_tokens(asyncio.run(chat.abatch(texts[:n], **kw)))

    def lc_thread_pool(n: int) -> int:
        return _lc_tokens(Runnable.batch(chat, texts[:n], **kw))

    def li_gather(n: int) -> int:
        async def go() -> list[Any]:
            return await asyncio.gather(
                *(li.achat([ChatMessage(role="user", content=t)], **kw) for t in texts[:n])
            )

        return sum(int(r.additional_kwargs["completion_tokens"]) for r in asyncio.run(go()))

    return {
        "ChatVLLM.batch": lc_batch,
        "ChatVLLM.abatch": lc_abatch,
        "Runnable.batch (thread pool)": lc_thread_pool,
        "LlamaIndex gather(achat)": li_gather,
    }


def extractor_paths(model: str, tokens: int, options: dict[str, Any]) -> dict[str, Callable[[int], int]]:
    """``QuestionsAnsweredExtractor.extract`` over n nodes, default workers and all at once."""
    from llama_index.core.extractors import QuestionsAnsweredExtractor
    from llama_index.core.schema import TextNode
    from vllm_inline.integrations.llama_index import VLLM

    kw = sampling(tokens)
    llm = VLLM(model=model, vllm_kwargs=options, max_tokens=kw.pop("max_tokens"),
               temperature=kw.pop("temperature"), repetition_penalty=kw.pop("repetition_penalty"),
               additional_kwargs=kw)
    nodes = [TextNode(text=p) for p in prompts(1024 * 4)]

    def run(workers: int | None) -> Callable[[int], int]:
        def go(n: int) -> int:
            extractor = QuestionsAnsweredExtractor(llm=llm, questions=1, num_workers=workers or n)
            extractor.extract(nodes[:n])
            return n * tokens  # ignore_eos: each call generates exactly ``tokens``

        return go

    return {
        "QuestionsAnsweredExtractor num_workers=4": run(4),
        "QuestionsAnsweredExtractor num_workers=N": run(None),
    }


def measure_inline(
    model: str, sizes: list[int], tokens: int, repeats: int, skip: list[str], stats_off: bool
) -> tuple[dict[tuple[str, int], float], dict[tuple[str, int], float]]:
    """Best tok/s and least client CPU ms per input of each path and size over ``repeats``
    rounds (paths rotate each round). ``stats_off``: on an engine started with
    ``disable_log_stats=True`` (no vLLM stats; ``vllm.LLM``'s default), the path names ending
    in ``STATS_OFF``."""
    from vllm_inline.engine import get_engine

    options = {**ENGINE_OPTIONS, "disable_log_stats": True} if stats_off else ENGINE_OPTIONS
    suffix = STATS_OFF if stats_off else ""
    log(f"vllm-inline: starting the engine{suffix}")
    engine = get_engine(model, **options).start()
    paths = {**inline_paths(model, tokens, options), **extractor_paths(model, tokens, options)}
    paths = {k + suffix: v for k, v in paths.items() if not any(s in k for s in skip)}
    for name, run in paths.items():
        run(16)  # warm-up: kernels, prefix cache, lazy imports
    best: dict[tuple[str, int], float] = {}
    cpu: dict[tuple[str, int], float] = {}
    names = list(paths)
    try:
        for rep in range(repeats):
            order = names[rep % len(names):] + names[:rep % len(names)]
            for n in sizes:
                for name in order:
                    if n > 256 and name.startswith(("Runnable.batch", "QuestionsAnsweredExtractor")):
                        continue  # 6 or 4 requests at a time: minutes at 1,024 inputs
                    t0, c0 = time.perf_counter(), time.process_time()
                    generated = paths[name](n)
                    wall, used = time.perf_counter() - t0, time.process_time() - c0
                    assert generated == n * tokens, (name, generated, n * tokens)
                    tps = generated / wall
                    best[name, n] = max(best.get((name, n), 0.0), tps)
                    cpu[name, n] = min(cpu.get((name, n), float("inf")), 1000 * used / n)
                    log(f"  {name:<42} n={n:<5} rep {rep}: {tps:8.0f} tok/s, "
                        f"client CPU {1000 * used / n:.2f} ms/input")
    finally:
        engine.shutdown()
    return best, cpu


# -- main ---------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny", help="a models.SPECS name: " + ", ".join(SPECS))
    ap.add_argument("--sizes", default="16,256,1024")
    ap.add_argument("--tokens", type=int, default=32, help="generated tokens per input")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--skip", default="", help="skip paths whose name contains these (comma-separated)")
    ap.add_argument("--stats", choices=["on", "off", "both"], default="both",
                    help="vllm-inline engine with vLLM's stats (the default engine), with "
                    "disable_log_stats=True (as vllm.LLM), or both, one after the other")
    ap.add_argument("--quick", action="store_true", help="sizes 16,128, 16 tokens, 1 repeat")
    ap.add_argument("--out", type=pathlib.Path, default=HERE / "results")
    ap.add_argument("--reference-child", metavar="MODEL", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.quick:
        args.sizes, args.tokens, args.repeats = "16,128", 16, 1
    sizes = [int(s) for s in args.sizes.split(",") if s]
    if args.reference_child:
        reference_child(args.reference_child, sizes, args.tokens, args.repeats)
        return 0

    started = time.perf_counter()
    model = str(build_model(SPECS[args.model]))
    log(f"{args.model}: {model}; sizes {sizes}, {args.tokens} tokens per input")
    before, cpu_before = reference(model, sizes, args.tokens, args.repeats)
    skip = [s for s in args.skip.split(",") if s]
    inline: dict[tuple[str, int], float] = {}
    cpu: dict[tuple[str, int], float] = {}
    for stats_off in {"on": [False], "off": [True], "both": [False, True]}[args.stats]:
        best, least = measure_inline(model, sizes, args.tokens, args.repeats, skip, stats_off)
        inline.update(best)
        cpu.update(least)
    after, cpu_after = reference(model, sizes, args.tokens, args.repeats)
    ref = {n: (before[n] + after[n]) / 2 for n in sizes}
    ref_cpu = {n: min(cpu_before[n], cpu_after[n]) for n in sizes}
    elapsed = time.perf_counter() - started

    title = (f"\n== bulk: {args.model}, {args.tokens} tokens per input; best of {args.repeats}; "
             f"vllm.LLM.chat = mean of its runs before and after ({elapsed / 60:.1f} min) ==")
    lines = [title]
    for n in sizes:
        lines.append(f"{'vllm.LLM.chat':<42} n={n:<5} {ref[n]:8.0f} tok/s "
                     f"(before {before[n]:.0f}, after {after[n]:.0f}); "
                     f"client CPU {ref_cpu[n]:.2f} ms/input")
    names = list(dict.fromkeys(name for name, _ in inline))  # in measuring order
    for name in names:
        for n in sizes:
            if (name, n) not in inline:
                continue
            tps = inline[name, n]
            if name.startswith("QuestionsAnsweredExtractor"):
                verdict = "(own prompt: compare the two extractor lines)"
            elif name.startswith("Runnable.batch"):
                verdict = "(LangChain's default, for reference)"
            else:
                verdict = f"[>={TARGET}x: {'PASS' if tps / ref[n] >= TARGET else 'MISS'}]"
            lines.append(f"{name:<42} n={n:<5} {tps:8.0f} tok/s  {tps / ref[n]:.2f}x "
                         f"vllm.LLM.chat  {verdict}; client CPU {cpu[name, n]:.2f} ms/input")
    print("\n".join(lines))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bulk.json").write_text(json.dumps({
        "model": args.model, "tokens": args.tokens, "sizes": sizes, "repeats": args.repeats,
        "engine_options": ENGINE_OPTIONS, "elapsed_s": round(elapsed, 1),
        "vllm.LLM.chat": {"before": before, "after": after, "mean": ref,
                          "client_cpu_ms_per_input": ref_cpu},
        "paths": [{"path": k, "n": n, "tok_s": v, "ratio": v / ref[n],
                   "client_cpu_ms_per_input": cpu[k, n]} for (k, n), v in inline.items()],
    }, indent=1) + "\n")
    log(f"wrote {args.out / 'bulk.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
