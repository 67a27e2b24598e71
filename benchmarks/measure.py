"""Per-request timing records, the figures computed from them, and the samplers: the wall and
CPU time of a call (:func:`clocked`) and the best of interleaved rounds (:func:`best_times`),
peak RSS, PSS and client CPU (:class:`RssSampler`), and the garbage collector's pauses
(:class:`GcPauses`).

Definitions, the same for every path:
- time to first token (TTFT): from the request call to the first chunk that carries text;
- inter-token latency (ITL): gaps between consecutive text-carrying chunks of a request;
- chunks: every item the consumer receives (including empty ones, e.g. OpenAI's role chunk);
- text bytes: UTF-8 bytes of the new text of every chunk, summed over the request;
- tokens/s: generated tokens of all requests / (last end - first start).
"""

from __future__ import annotations

import gc
import math
import os
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from typing_extensions import Self

__all__ = [
    "GcPauses",
    "Record",
    "RssSampler",
    "best_times",
    "clocked",
    "percentile",
    "summarize",
]

T = TypeVar("T")


@dataclass
class Record:
    """What the consumer of one streamed request saw."""

    start: float = field(default_factory=time.perf_counter)
    end: float = 0.0
    text_times: list[float] = field(default_factory=list)
    chunks: int = 0
    text_bytes: int = 0
    tokens: int = 0
    text_parts: list[str] = field(default_factory=list)

    def chunk(self, text: str | None) -> None:
        self.chunks += 1
        if text:
            self.text_times.append(time.perf_counter())
            self.text_bytes += len(text.encode())
            self.text_parts.append(text)

    def done(self, tokens: int) -> Record:
        self.end = time.perf_counter()
        self.tokens = tokens
        return self


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (q in [0, 100]); NaN for no values."""
    if not values:
        return math.nan
    s = sorted(values)
    k = (len(s) - 1) * q / 100
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def summarize(records: list[Record], expected_tokens: int) -> dict[str, Any]:
    """The figures of one measured run."""
    ttft = [(r.text_times[0] - r.start) * 1e3 for r in records if r.text_times]
    itl = [(b - a) * 1e3 for r in records for a, b in zip(r.text_times, r.text_times[1:])]
    wall = max(r.end for r in records) - min(r.start for r in records)
    tokens = sum(r.tokens for r in records)
    final_bytes = [len("".join(r.text_parts).encode()) for r in records]
    return {
        "requests": len(records),
        "tokens": tokens,
        "tokens_ok": all(r.tokens == expected_tokens for r in records),
        "wall_s": wall,
        "tok_s": tokens / wall if wall > 0 else math.nan,
        "ttft_p50_ms": percentile(ttft, 50),
        "ttft_p95_ms": percentile(ttft, 95),
        "itl_p50_ms": percentile(itl, 50),
        "itl_p99_ms": percentile(itl, 99),
        "chunks_per_req": statistics.fmean(r.chunks for r in records),
        "text_bytes_per_req": statistics.fmean(r.text_bytes for r in records),
        # Delivered bytes / final text bytes: 1.0 when chunks are true deltas (O(n)).
        "bytes_ratio": sum(r.text_bytes for r in records) / max(1, sum(final_bytes)),
    }


def clocked(call: Callable[[], T]) -> tuple[T, float, float]:
    """``call()``'s result, the wall seconds it took and the CPU seconds this process used
    meanwhile (``time.process_time``: not the engine core's, its workers' or a server's)."""
    t0, c0 = time.perf_counter(), time.process_time()
    result = call()
    return result, time.perf_counter() - t0, time.process_time() - c0


def best_times(calls: dict[str, Callable[[], Any]], rounds: int) -> dict[str, float]:
    """Each call's shortest wall time (s) over ``rounds`` rounds; each round runs every call
    once, so that drift in the machine's load hits them all alike."""
    best = dict.fromkeys(calls, float("inf"))
    for _ in range(rounds):
        for name, call in calls.items():
            _, wall, _ = clocked(call)
            best[name] = min(best[name], wall)
    return best


class RssSampler:
    """Peak resident memory of this process and all its descendants (engine core, workers, an
    HTTP server), sampled every ``interval`` seconds while active; their proportional set size
    (PSS) once at the end; and the CPU time this process alone (the client: not the engine core,
    its workers or a server) used meanwhile.

    RSS counts a page shared by several processes once in each: the libraries every vLLM process
    maps, and the pages a forked engine process shares with the process it was forked from. PSS
    divides each shared page among the processes that map it, so the PSS of a set of processes
    sums to the memory they take together. It is read once, at the end, because reading it
    walks every process's page tables (``/proc/<pid>/smaps_rollup``): not while the block runs.
    """

    def __init__(self, interval: float = 0.1) -> None:
        import psutil

        self._proc = psutil.Process(os.getpid())
        self._interval = interval
        self._peak = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _sum(self, of: Callable[[Any], int]) -> int:
        """``of(process)`` summed over this process and its live descendants."""
        import psutil

        total = 0
        for p in [self._proc, *self._proc.children(recursive=True)]:
            try:
                total += of(p)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
        return total

    def _sample(self) -> int:
        return self._sum(lambda p: p.memory_info().rss)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self._peak = max(self._peak, self._sample())

    def _cpu(self) -> float:
        t = self._proc.cpu_times()
        return t.user + t.system

    def __enter__(self) -> Self:
        self._cpu0 = self._cpu()
        self._peak = self._sample()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join()
        self._peak = max(self._peak, self._sample())
        self.cpu_s = self._cpu() - self._cpu0
        self.pss_mib = self._sum(lambda p: p.memory_full_info().pss) / 2**20
        """The PSS of this process and its descendants at the end of the block (MiB)."""

    @property
    def peak_mib(self) -> float:
        return self._peak / 2**20


class GcPauses:
    """The garbage collector's pauses while it is installed (``gc.callbacks``): every thread
    of the process waits for a collection, so each one is lag for every stream.

    A pause is the collecting thread's CPU time between the two callbacks, not the wall time:
    entering the "stop" callback is a Python call, where the interpreter hands over to the
    threads that waited during the collection, and the wall time then counts their turns too
    (a synthetic heap with a busy second thread: wall 45-48 ms, CPU 29-41 ms,
    ``gc.DEBUG_STATS``' own clock 26-37 ms).
    """

    def __init__(self) -> None:
        self.pauses: list[tuple[float, int, float]] = []
        """``(end perf_counter, generation, seconds)`` per collection."""
        self._start = 0.0

    def start(self) -> None:
        gc.callbacks.append(self._callback)

    def stop(self) -> None:
        gc.callbacks.remove(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        cpu = time.thread_time()
        if phase == "start":
            self._start = cpu
        else:
            self.pauses.append((time.perf_counter(), info["generation"], cpu - self._start))

    def within(self, lo: float, hi: float) -> dict[str, float]:
        """Full collections, the longest of them and all pauses together (ms) that ended
        between ``lo`` and ``hi`` (``perf_counter`` times)."""
        full = [d for t, g, d in self.pauses if lo <= t <= hi and g == 2]
        every = [d for t, g, d in self.pauses if lo <= t <= hi]
        return {
            "gc_full_collections": len(full),
            "gc_full_max_ms": max(full, default=0.0) * 1e3,
            "gc_total_ms": sum(every) * 1e3,
        }
