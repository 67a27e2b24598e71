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
paired with itself (A/A). The targets: tok/s >= ``TARGET`` x the reference's and client CPU per input (the calling
process's CPU time; the engine core and its worker are other processes) <= ``CPU_TARGET`` x
the reference's, each judged on the median of the paired ratios. After the warm-up the heap is
frozen (``gc.freeze()``, as vLLM's server does after start-up) and each timed run starts after
a ``gc.collect()``, so that no run is charged for collecting the garbage of the run before it.
Writes ``results/bulk-asyncllm.json``.

``--against llm``: the reference is ``vllm.LLM.chat(list)``, vLLM's offline batch:

- ``vllm.LLM.chat(list)``: vLLM's offline batch, the reference. It runs in a child process
  that stays up (an ``LLM`` and vllm-inline's ``AsyncLLM`` in one process would leave one
  engine's worker polling while the other runs), and runs once for every run of the other
  paths, on the same size, right before or right after it (alternately), each timed run
  after a pause of ``SETTLE_S`` (the other engine's processes spin for a second after a run).
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

Each vllm-inline path runs twice (``--stats both``, the default with ``--against llm``): on the default engine, which
records vLLM's stats for ``Engine.stats()`` and Prometheus, and, named ``... [stats off]``, on
an engine started with ``disable_log_stats=True``, which records none, as ``vllm.LLM`` (whose
default that is). ``--stats on`` or ``--stats off`` runs one of them.

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
import asyncio
import gc
import itertools
import json
import os
import pathlib
import statistics
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

MAX_INPUTS = 4096
"""Prompts prepared for the largest size."""

SETTLE_S = 1.5
"""Pause before every timed run, so that the other engine (vllm-inline's or the reference's)
has gone idle. After each message vLLM's shared-memory readers (the worker, the engine core)
busy-poll for a second (``SpinCondition(busy_loop_s=1)`` in
``vllm/distributed/device_communicators/shm_broadcast.py``), and both engines' workers are
bound to the same CPU here: a run that starts within that second shares its CPU with the
other engine's spinning."""

AA_PATH = "vllm.LLM.chat, a second engine (A/A)"
"""The reference against itself: a second ``vllm.LLM.chat`` child, paired like every path. Its
paired ratios are what this host's noise alone gives; a path's line can be read against it."""

STATS_OFF = " [stats off]"
"""Suffix of the paths measured on an engine started with ``disable_log_stats=True``."""


def log(msg: str) -> None:
    print(f"[bulk {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def prompts(n: int) -> list[str]:
    return [f"Write a short story about robot number {i}." for i in range(n)]


# -- the reference: vllm.LLM.chat in a child process ------------------------------------------


def reference_child(model: str, tokens: int) -> None:
    """Serve ``vllm.LLM.chat`` runs: reads a size per line on stdin, prints one ``RESULT``
    JSON line ``[tok/s, client CPU ms per input]`` per size (vLLM's own log lines may come
    between them)."""
    from vllm import LLM, SamplingParams

    llm = LLM(model=model, **ENGINE_OPTIONS)
    params = SamplingParams(**sampling(tokens))
    convs = [[{"role": "user", "content": p}] for p in prompts(MAX_INPUTS)]
    llm.chat(convs[:16], params, use_tqdm=False)  # warm-up
    print("READY", flush=True)
    for line in sys.stdin:
        n = int(line)
        t0, c0 = time.perf_counter(), time.process_time()
        results = llm.chat(convs[:n], params, use_tqdm=False)
        wall, used = time.perf_counter() - t0, time.process_time() - c0
        generated = sum(len(r.outputs[0].token_ids) for r in results)
        assert generated == n * tokens, (generated, n * tokens)
        print("RESULT " + json.dumps([generated / wall, 1000 * used / n]), flush=True)


class Reference:
    """``vllm.LLM.chat`` in a child process that stays up, so that every run of ours is paired
    with a run of the reference right next to it in time.

    A child process: an ``LLM`` and vllm-inline's ``AsyncLLM`` in one process would leave one
    engine's worker polling while the other runs. Apart, an idle engine costs ~1 % of a core
    (an idle ``LLM``'s process tree used 0.14 s of CPU in 10 s), but for a second after each
    run its processes spin on a full core (0.96-1.04 cores in each quarter second, then 0-0.04):
    hence ``SETTLE_S`` before every timed run."""

    def __init__(self, model: str, tokens: int) -> None:
        log("vllm.LLM.chat: starting its engine in a child process")
        cmd = [sys.executable, __file__, "--reference-child", model, "--tokens", str(tokens)]
        self._proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self._line("READY")

    def _line(self, prefix: str) -> str:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            if line.startswith(prefix):
                return line[len(prefix) :]
        raise RuntimeError(f"the vllm.LLM.chat child exited (rc {self._proc.wait()})")

    def run(self, n: int) -> tuple[float, float]:
        """tok/s and client CPU ms per input of ``vllm.LLM.chat`` on the first ``n`` inputs."""
        assert self._proc.stdin is not None
        self._proc.stdin.write(f"{n}\n")
        self._proc.stdin.flush()
        tok_s, cpu_ms = json.loads(self._line("RESULT "))
        return tok_s, cpu_ms

    def close(self) -> None:
        if self._proc.stdin is not None:
            self._proc.stdin.close()
        try:
            self._proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


# -- vllm-inline's bulk paths, on one engine -------------------------------------------------


def _lc_tokens(messages: list[Any]) -> int:
    return sum(m.usage_metadata["output_tokens"] for m in messages)


def _raw_gather(model: str, tokens: int, options: dict[str, Any]) -> Callable[[int], int]:
    """vLLM's ``AsyncLLM`` alone, as any in-process integration built on it has it: the N
    conversations rendered with the model's chat template, then ``asyncio.gather`` over
    ``AsyncLLM.generate`` (final output only), on the engine's own loop. No vllm-inline
    request path and no framework: what vLLM's own async engine gives a bulk caller."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    from vllm_inline.engine import get_engine

    engine = get_engine(model, **options)
    params = SamplingParams(**sampling(tokens), output_kind=RequestOutputKind.FINAL_ONLY)
    convs = [[{"role": "user", "content": p}] for p in prompts(MAX_INPUTS)]
    ids = itertools.count()
    checked: list[bool] = []

    def run(n: int) -> int:
        runtime = engine.runtime
        llm, tokenizer = runtime.llm, engine.tokenizer

        async def one(conv: list[dict[str, str]]) -> int:
            text = tokenizer.apply_chat_template(conv, add_generation_prompt=True, tokenize=False)
            prompt = tokenizer.encode(text, add_special_tokens=False)
            async for out in llm.generate({"prompt_token_ids": prompt}, params, f"raw-{next(ids)}"):
                final = out
            return len(final.outputs[0].token_ids)

        async def all_at_once() -> list[int]:
            return await asyncio.gather(*(one(c) for c in convs[:n]))

        if not checked:  # the first call is the warm-up: same prompt as the engine renders
            text = tokenizer.apply_chat_template(
                convs[0], add_generation_prompt=True, tokenize=False
            )
            mine = tokenizer.encode(text, add_special_tokens=False)
            assert mine == engine.prompt_token_ids(convs[0]), "the baseline renders otherwise"
            checked.append(True)
        return sum(runtime.loop.submit(all_at_once()).result())

    return run


def _engine_gather(model: str, tokens: int, options: dict[str, Any]) -> Callable[[int], int]:
    """vllm-inline's engine alone: ``asyncio.gather`` over ``Engine.astream(stream=False)``
    (the final answer as one delta), no framework."""
    from vllm_inline.engine import get_engine

    engine = get_engine(model, **options)
    kw = sampling(tokens)
    convs = [[{"role": "user", "content": p}] for p in prompts(MAX_INPUTS)]

    def run(n: int) -> int:
        async def one(conv: list[dict[str, str]]) -> int:
            return sum([len(d.token_ids) async for d in engine.astream(conv, stream=False, **kw)])

        async def all_at_once() -> list[int]:
            return await asyncio.gather(*(one(c) for c in convs[:n]))

        return sum(asyncio.run(all_at_once()))

    return run


def inline_paths(
    model: str, tokens: int, options: dict[str, Any]
) -> dict[str, Callable[[int], int]]:
    """Name -> ``run(n)`` returning the tokens generated for the first ``n`` prompts."""
    from langchain_core.runnables import Runnable
    from llama_index.core.base.llms.types import ChatMessage

    from vllm_inline.integrations.langchain import ChatVLLM
    from vllm_inline.integrations.llama_index import VLLM

    kw = sampling(tokens)
    chat = ChatVLLM(model=model, vllm_kwargs=options)
    li = VLLM(model=model, vllm_kwargs=options)
    texts = prompts(MAX_INPUTS)

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
        "AsyncLLM.generate gather (baseline)": _raw_gather(model, tokens, options),
        "Engine.astream gather (baseline)": _engine_gather(model, tokens, options),
        "ChatVLLM.batch": lc_batch,
        "ChatVLLM.abatch": lc_abatch,
        "Runnable.batch (thread pool)": lc_thread_pool,
        "LlamaIndex gather(achat)": li_gather,
    }


def extractor_paths(
    model: str, tokens: int, options: dict[str, Any]
) -> dict[str, Callable[[int], int]]:
    """``QuestionsAnsweredExtractor.extract`` over n nodes, default workers and all at once."""
    from llama_index.core.extractors import QuestionsAnsweredExtractor
    from llama_index.core.schema import TextNode

    from vllm_inline.integrations.llama_index import VLLM

    kw = sampling(tokens)
    llm = VLLM(
        model=model,
        vllm_kwargs=options,
        max_tokens=kw.pop("max_tokens"),
        temperature=kw.pop("temperature"),
        repetition_penalty=kw.pop("repetition_penalty"),
        additional_kwargs=kw,
    )
    nodes = [TextNode(text=p) for p in prompts(MAX_INPUTS)]

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
    rows: list[dict[str, Any]] = []
    names = list(paths)
    try:
        for rep in range(repeats):
            order = names[rep % len(names) :] + names[: rep % len(names)]
            for n in sizes:
                for name in order:
                    if n > 256 and name.startswith(
                        ("Runnable.batch", "QuestionsAnsweredExtractor")
                    ):
                        continue  # 6 or 4 requests at a time: minutes at 1,024 inputs
                    reference_first = len(rows) % 2 == 0
                    if reference_first:
                        time.sleep(SETTLE_S)
                        ref_tok_s, ref_cpu = reference.run(n)
                    time.sleep(SETTLE_S)
                    t0, c0 = time.perf_counter(), time.process_time()
                    result = paths[name](n)
                    wall, used = time.perf_counter() - t0, time.process_time() - c0
                    if not reference_first:
                        time.sleep(SETTLE_S)
                        ref_tok_s, ref_cpu = reference.run(n)
                    if isinstance(result, tuple):  # the twin: measured in its own process
                        tps, cpu_ms = result
                    else:
                        assert result == n * tokens, (name, result, n * tokens)
                        tps, cpu_ms = result / wall, 1000 * used / n
                    rows.append(
                        {
                            "path": name,
                            "n": n,
                            "rep": rep,
                            "tok_s": tps,
                            "client_cpu_ms_per_input": cpu_ms,
                            "reference_tok_s": ref_tok_s,
                            "reference_client_cpu_ms_per_input": ref_cpu,
                            "reference_first": reference_first,
                            "ratio": tps / ref_tok_s,
                        }
                    )
                    log(
                        f"  {name:<42} n={n:<5} rep {rep}: {tps:8.0f} tok/s, client CPU "
                        f"{cpu_ms:.2f} ms/input; vllm.LLM.chat {ref_tok_s:8.0f} tok/s "
                        f"({'before' if reference_first else 'after'}): {tps / ref_tok_s:.2f}x"
                    )
    finally:
        engine.shutdown()
    return rows


BASELINE = "AsyncLLM.generate gather (baseline)"
"""vLLM's own async engine gathered over the N conversations: the in-process limit."""

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


def bare_paths(model: str, tokens: int, options: dict[str, Any]) -> dict[str, Callable[[int], int]]:
    """LangChain's ``abatch`` (all at once) and LlamaIndex's gather over the bare models."""
    from bare_frameworks import BareChatModel, BareLLM
    from llama_index.core.base.llms.types import ChatMessage

    from vllm_inline.engine import get_engine

    engine = get_engine(model, **options)
    chat, li = BareChatModel(engine=engine), BareLLM(engine=engine)
    kw = sampling(tokens)
    texts = prompts(MAX_INPUTS)

    def lc_abatch(n: int) -> int:
        return _lc_tokens(asyncio.run(chat.abatch(texts[:n], **kw)))

    def li_gather(n: int) -> int:
        async def go() -> list[Any]:
            return await asyncio.gather(
                *(li.achat([ChatMessage(role="user", content=t)], **kw) for t in texts[:n])
            )

        return sum(int(r.additional_kwargs["completion_tokens"]) for r in asyncio.run(go()))

    return {
        "bare LangChain abatch (baseline)": lc_abatch,
        "bare LlamaIndex gather(achat) (baseline)": li_gather,
    }


CPU_TARGET = 1.5
"""Each bulk path's client CPU per input against ``BASELINE``'s, paired."""


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
        time.sleep(PAUSE_S)
        t0, c0 = time.perf_counter(), time.process_time()
        generated = run(n)
        wall, used = time.perf_counter() - t0, time.process_time() - c0
        assert generated == n * tokens, (generated, n * tokens)
        return generated / wall, 1000 * used / n

    rows: list[dict[str, Any]] = []
    names = list(paths)
    try:
        for rep in range(repeats):
            order = names[rep % len(names) :] + names[: rep % len(names)]
            for n in sizes:
                for name in order:
                    baseline_first = len(rows) % 2 == 0
                    if baseline_first:
                        ref = timed(baseline, n)
                    tps, cpu_ms = timed(paths[name], n)
                    if not baseline_first:
                        ref = timed(baseline, n)
                    rows.append(
                        {
                            "path": name,
                            "n": n,
                            "rep": rep,
                            "tok_s": tps,
                            "client_cpu_ms_per_input": cpu_ms,
                            "reference_tok_s": ref[0],
                            "reference_client_cpu_ms_per_input": ref[1],
                            "reference_first": baseline_first,
                            "ratio": tps / ref[0],
                            "cpu_ratio": cpu_ms / ref[1],
                        }
                    )
                    log(
                        f"  {name:<42} n={n:<5} rep {rep}: {tps:8.0f} tok/s, client CPU "
                        f"{cpu_ms:.2f} ms/input; baseline {ref[0]:8.0f} tok/s, {ref[1]:.2f} "
                        f"ms/input ({'before' if baseline_first else 'after'}): "
                        f"{tps / ref[0]:.2f}x tok/s, {cpu_ms / ref[1]:.2f}x CPU"
                    )
    finally:
        engine.shutdown()
    return rows


PAUSE_S = 0.3
"""Pause before each run of ``--against asyncllm`` (one engine: no other engine spins)."""


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
    for name in dict.fromkeys(r["path"] for r in rows):
        for n in sizes:
            mine = [r for r in rows if r["path"] == name and r["n"] == n]
            if not mine:
                continue
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
        reference_child(args.reference_child, args.tokens)
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
    reference = Reference(model, args.tokens)
    twin = None if args.no_aa else Reference(model, args.tokens)
    rows: list[dict[str, Any]] = []
    try:
        for stats_off in {"on": [False], "off": [True], "both": [False, True]}[args.stats]:
            rows += measure_inline(
                model, sizes, args.tokens, args.repeats, skip, stats_off, reference, twin
            )
            if twin is not None:  # once is enough: it does not depend on our engine's options
                twin.close()
                twin = None
    finally:
        reference.close()
        if twin is not None:
            twin.close()
    elapsed = time.perf_counter() - started

    title = (
        f"\n== bulk: {args.model}, {args.tokens} tokens per input, {args.repeats} "
        f"repeats; each run paired with a vllm.LLM.chat run next to it; the verdict is on "
        f"the median of the paired ratios ({elapsed / 60:.1f} min) =="
    )
    lines = [title, *reference_lines(rows, sizes, "vllm.LLM.chat", "lowest", min)]
    summary = []
    for name in dict.fromkeys(r["path"] for r in rows):  # in measuring order
        for n in sizes:
            mine = [r for r in rows if r["path"] == name and r["n"] == n]
            if not mine:
                continue
            ratios = sorted(r["ratio"] for r in mine)
            median = statistics.median(ratios)
            if name.startswith("QuestionsAnsweredExtractor"):
                verdict = "(own prompt: compare the two extractor lines)"
            elif name.startswith("Runnable.batch"):
                verdict = "(LangChain's default, for reference)"
            elif name == AA_PATH:
                verdict = "(the reference against itself: this host's resolution)"
            elif "(baseline)" in name:
                verdict = (
                    f"(a baseline, {'at or above' if median >= TARGET else 'below'} the target)"
                )
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
    print("\n".join(lines))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bulk.json").write_text(
        json.dumps(
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
            indent=1,
        )
        + "\n"
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
    (args.out / "bulk-asyncllm.json").write_text(
        json.dumps(
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
            indent=1,
        )
        + "\n"
    )
    log(f"wrote {args.out / 'bulk-asyncllm.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
