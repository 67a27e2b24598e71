"""Engine start and shutdown, timed: one engine phase by phase, and a RAG app's three engines
one after another against all at once.

    python benchmarks/lifecycle.py [--rounds 2]

1. **One start, phase by phase** (a child process each round, so vLLM is imported afresh),
   with the engine's processes spawned (vLLM's way) and forked (vllm-inline's on a CPU, the
   default: ``VLLMINLINE_PROCESS_START``), the ways alternating; then the same start as a
   script runs it, from the interpreter's start to the first answer (vLLM imported on the way):
   the import of vLLM in this process, then vLLM's own start-up read off its DEBUG log lines
   (stamped to the millisecond through ``VLLM_LOGGING_CONFIG_PATH``): engine configuration here, the engine core's process spawn and imports,
   the worker's spawn and imports, weights, KV cache and warm-up, then what vllm-inline does
   after vLLM is up (tokenizer, template and stop policy, the heap freeze), and the shutdown.
2. **Three engines** (the test kit's chat model, embedder and a second chat model, the
   kit's CPU options), in a child process each: ``engine.start()`` one after another
   against :func:`vllm_inline.engine.start_engines`; ``shutdown()`` one after another against
   :func:`vllm_inline.engine.shutdown_engines`, beside the slowest engine's own shutdown.
   Targets: the start together in at most 0.7x the time, the shutdown bounded by the slowest.

Not a timed test: the figures go to ``docs/performance.md`` ("Engine start and shutdown").
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import textwrap

PHASES = textwrap.dedent(
    """
    import json, sys, time
    t0 = time.perf_counter()
    import vllm  # noqa: F401
    from vllm_inline.engine import get_engine
    from vllm_inline.testing import scripted_model

    if __name__ == "__main__":
        imported = time.perf_counter() - t0
        s = scripted_model("llama3")
        engine = get_engine(s.path, **s.engine_kwargs)
        t1 = time.time()
        engine.start()
        t2 = time.time()
        engine.shutdown()
        t3 = time.time()
        print("TIMES", json.dumps({"import": imported, "start_at": t1, "up_at": t2, "down_at": t3}))
    """
)

COLD = textwrap.dedent(
    """
    import time
    t0 = time.perf_counter()
    import json
    from vllm_inline.engine import get_engine
    from vllm_inline.testing import scripted_model

    if __name__ == "__main__":
        s = scripted_model("llama3")
        engine = get_engine(s.path, **s.engine_kwargs)
        answer = "".join(d.text or "" for d in engine.stream([{"role": "user", "content": "Hi"}]))
        first = time.perf_counter() - t0
        engine.shutdown()
        print("TIMES", json.dumps({"first_answer": first}))
    """
)

TOGETHER = textwrap.dedent(
    """
    import json, sys, time
    from vllm_inline.engine import get_engine, shutdown_engines, start_engines
    from vllm_inline.testing import build_embedding_model, scripted_model

    if __name__ == "__main__":
        chat, other = scripted_model("llama3"), scripted_model("chatml")
        engines = [
            get_engine(chat.path, **chat.engine_kwargs),
            get_engine(str(build_embedding_model()), runner="pooling", **chat.engine_kwargs),
            get_engine(other.path, **other.engine_kwargs),
        ]
        import vllm  # noqa: F401  (both ways pay it once, before the clock)
        together = sys.argv[1] == "together"
        t0 = time.perf_counter()
        start_engines(*engines) if together else [engine.start() for engine in engines]
        t1 = time.perf_counter()
        alone = []  # one after another: each engine's own shutdown
        if together:
            shutdown_engines(*engines)
        for engine in engines:
            t = time.perf_counter()
            engine.shutdown()  # a no-op once shut down
            alone.append(time.perf_counter() - t)
        t2 = time.perf_counter()
        times = {"start": t1 - t0, "shutdown": t2 - t1}
        print("TIMES", json.dumps(times if together else {**times, "slowest": max(alone)}))
    """
)

_STAMP = re.compile(r"\((\w+)[^)]*\) \w+ (\d+\.\d+) \[([^\]]+)\] (.*)")

# vLLM's own log format with the time as epoch seconds to the millisecond (its default stamps
# whole seconds); vLLM reads a logging config from VLLM_LOGGING_CONFIG_PATH.
LOGGING_CONFIG = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "stamped": {
            "()": "vllm.logging_utils.NewLineFormatter",
            "format": "(%(vllm_process_name)s pid=%(process)d) %(levelname)s %(created).3f "
            "[%(fileinfo)s:%(lineno)d] %(message)s",
        }
    },
    "handlers": {
        "stamped": {
            "class": "logging.StreamHandler",
            "formatter": "stamped",
            "level": "DEBUG",
            "stream": "ext://sys.stdout",
        }
    },
    "loggers": {"vllm": {"handlers": ["stamped"], "level": "DEBUG", "propagate": False}},
}


def _child(code: str, *args: str, env: dict[str, str] | None = None) -> tuple[dict, str]:
    result = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, **(env or {})},
        check=True,
    )
    line = next(x for x in result.stdout.splitlines() if x.startswith("TIMES "))
    return json.loads(line[len("TIMES ") :]), result.stdout + result.stderr


def _log_times(log: str) -> list[tuple[float, str, str]]:
    """``(epoch seconds, process, message)`` of each of vLLM's log lines."""
    return [(float(t), p, f"{where} {m}") for p, t, where, m in _STAMP.findall(log)]


def phases(times: dict, log: str) -> dict[str, float]:
    """Split one start into phases by the first log line of each process and vLLM's ready."""
    lines = _log_times(log)

    def first(process: str) -> float:
        return min(t for t, p, _ in lines if p == process)

    def at(text: str) -> float:
        return min(t for t, _, m in lines if text in m)

    core, worker = first("EngineCore"), min(first("VllmWorker"), first("Worker"))
    configured = max(t for t, p, _ in lines if p == "MainProcess" and t <= core)
    ready = at("READY from local core engine")
    return {
        "import vLLM (this process)": times["import"],
        "configuration (this process)": configured - times["start_at"],
        "engine core: spawn, imports": core - configured,
        "engine core set-up; worker: spawn, imports": worker - core,
        "worker: weights, KV cache, warm-up; ready": ready - worker,
        "after vLLM is up (vllm-inline and AsyncLLM)": times["up_at"] - ready,
        "shutdown": times["down_at"] - times["up_at"],
    }


def one_start(rounds: int, starts: list[str]) -> None:
    print("1. One engine start, phase by phase (medians, then each round), per way the engine")
    print("   core starts its worker (VLLMINLINE_PROCESS_START: vLLM's spawn, or the fork")
    print("   vllm-inline makes on a CPU), the ways alternating round by round")
    config = os.path.join(tempfile.mkdtemp(prefix="lifecycle-"), "logging.json")
    with open(config, "w") as f:
        json.dump(LOGGING_CONFIG, f)
    rows: dict[str, dict[str, list[float]]] = {start: {} for start in starts}
    for _ in range(rounds):
        for start in starts:
            times, log = _child(
                PHASES,
                env={
                    "VLLM_LOGGING_LEVEL": "DEBUG",
                    "VLLM_LOGGING_CONFIG_PATH": config,
                    "VLLMINLINE_PROCESS_START": start,
                },
            )
            for name, seconds in phases(times, log).items():
                rows[start].setdefault(name, []).append(seconds)
    totals = {}
    for start, phase_rows in rows.items():
        print(f"  engine processes started by {start}:")
        for name, values in phase_rows.items():
            print(
                f"    {name:53s} {statistics.median(values):6.1f} s  {[round(v, 1) for v in values]}"
            )
        skip = ("shutdown", "import vLLM (this process)")
        totals[start] = sum(statistics.median(v) for n, v in phase_rows.items() if n not in skip)
        print(f"    {'start (engine.start())':53s} {totals[start]:6.1f} s")
    if "spawn" in totals and "fork" in totals:
        print(f"  start, fork / spawn: {totals['fork'] / totals['spawn']:.2f}x")
    cold: dict[str, list[float]] = {start: [] for start in starts}
    for _ in range(rounds):
        for start in starts:
            times, _ = _child(COLD, env={"VLLMINLINE_PROCESS_START": start})
            cold[start].append(times["first_answer"])
    print("  a script's first answer, from its interpreter's start (medians, then each round):")
    for start, values in cold.items():
        print(f"    {start:6s} {statistics.median(values):6.1f} s  {[round(v, 1) for v in values]}")


def three_engines(rounds: int) -> None:
    print("\n2. Three engines (chat, embedder, a second chat model)")
    results: dict[str, dict[str, list[float]]] = {"one after another": {}, "together": {}}
    for _ in range(rounds):
        for way, flag in (("one after another", "sequential"), ("together", "together")):
            times, _ = _child(TOGETHER, flag)
            for name, seconds in times.items():
                results[way].setdefault(name, []).append(seconds)
    for name in ("start", "shutdown"):
        seq = statistics.median(results["one after another"][name])
        tog = statistics.median(results["together"][name])
        print(
            f"  {name:9s} one after another {seq:6.1f} s   together {tog:6.1f} s   "
            f"ratio {tog / seq:.2f}x"
        )
    slowest = statistics.median(results["one after another"]["slowest"])
    print(f"  the slowest engine's own shutdown {slowest:6.1f} s (one after another)")
    print("  target: the start together in at most 0.7x the time; shutdown bounded by the slowest")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--only", choices=("phases", "together"), default=None)
    parser.add_argument(
        "--process-start",
        default="spawn,fork",
        help="the ways to time the start with, comma-separated (spawn, fork)",
    )
    args = parser.parse_args()
    if args.only != "together":
        one_start(args.rounds, args.process_start.split(","))
    if args.only != "phases":
        three_engines(args.rounds)


if __name__ == "__main__":
    main()
