"""What the engine measures: per-request timings, engine stats and the Prometheus registry.

vLLM measures all of it already. Its engine core reports scheduler and iteration stats to
"stat loggers" after every step, and each ``RequestOutput`` carries the request's timestamps.
This module only keeps those figures in a typed form:

- :class:`RequestMetrics`: one request's queue time, time to first token, prefill, decode and
  end-to-end time, on the last :class:`~vllm_inline.engine.stream.deltas.Delta` of the request
  (``delta.metrics``).
- :class:`EngineStats`: a snapshot of one engine, from :meth:`Engine.stats
  <vllm_inline.engine.Engine.stats>`, with one snapshot per engine core when the engine runs
  several (``data_parallel_size``). :class:`StatsBook` keeps the latest figures; a stat logger
  registered with vLLM (``vllm_stats``) writes them after every step of every engine core.
- :func:`prometheus_registry`: vLLM's own Prometheus metrics (``vllm:num_requests_running``,
  ``vllm:time_to_first_token_seconds``, ...) for every engine of the process, labelled by model.

Nothing here imports vLLM.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import Any

from vllm_inline.engine.errors import StatsDisabledError
from vllm_inline.engine.life import group
from vllm_inline.engine.seam.vllm_types import IterationStats, SchedulerStats

__all__ = [
    "EngineStats",
    "RequestMetrics",
    "StatsBook",
    "prometheus_registry",
    "request_metrics",
]


_registry: Any = None
_registry_lock = threading.Lock()


def prometheus_registry() -> Any:
    """The ``prometheus_client.CollectorRegistry`` holding vLLM's metrics of every engine in the
    process (created on first use).

    Serve it like any registry, e.g. ``app.mount("/metrics", make_asgi_app(registry=...))``. It
    is separate from ``prometheus_client.REGISTRY`` because vLLM clears the ``vllm:`` metrics of
    the global registry each time an engine starts; here the engines of one process keep their
    series side by side, told apart by the ``model_name`` label.
    """
    global _registry
    with _registry_lock:
        if _registry is None:
            from prometheus_client import CollectorRegistry  # a dependency of vLLM

            if group.joined() and os.environ.get(MULTIPROCESS_VARIABLE):
                _registry = _group_registry(CollectorRegistry)
            else:
                _registry = CollectorRegistry(auto_describe=True)
        return _registry


MULTIPROCESS_VARIABLE = "PROMETHEUS_MULTIPROC_DIR"
"""prometheus_client's multiprocess mode: set by a group's launcher for its workers."""


def _group_registry(base: type) -> Any:
    """A worker's registry: its metrics register here as in one process, and collecting it
    reads every worker's values from prometheus_client's multiprocess files (the engine cores
    are shared, so a worker alone has only the requests it served), as ``vllm serve
    --api-server-count N`` serves them."""

    class GroupRegistry(base):  # type: ignore[misc]
        def collect(self) -> Any:
            from prometheus_client import CollectorRegistry, multiprocess

            every_worker = CollectorRegistry()
            collector: Any = multiprocess.MultiProcessCollector  # untyped in prometheus_client
            collector(every_worker)
            return every_worker.collect()

    return GroupRegistry(auto_describe=True)


@dataclass(frozen=True, slots=True)
class RequestMetrics:
    """Timings of one request, in seconds, from vLLM's request stats."""

    queue_time: float
    """Time waiting in the scheduler's queue before the first step that ran it."""
    time_to_first_token: float
    """From the request's arrival to its first generated token."""
    prefill_time: float
    """From the first scheduled step to the first token (the prompt's forward passes)."""
    decode_time: float
    """From the first token to the last one."""
    e2e_time: float
    """From the request's arrival to its end."""


def request_metrics(stats: Any, finished_at: float | None = None) -> RequestMetrics | None:
    """:class:`RequestMetrics` of vLLM's ``RequestOutput.metrics`` (``RequestStateStats``),
    or ``None`` when vLLM kept none. ``finished_at`` is wall-clock time (default: now)."""
    if stats is None or not getattr(stats, "arrival_time", 0.0):
        return None
    end = time.time() if finished_at is None else finished_at
    queued, scheduled = stats.queued_ts, stats.scheduled_ts
    first, last = stats.first_token_ts, stats.last_token_ts
    return RequestMetrics(
        queue_time=max(0.0, scheduled - queued) if scheduled and queued else 0.0,
        time_to_first_token=max(0.0, stats.first_token_latency),
        prefill_time=max(0.0, first - scheduled) if first and scheduled else 0.0,
        decode_time=max(0.0, last - first) if last and first else 0.0,
        e2e_time=max(0.0, end - stats.arrival_time),
    )


@dataclass(frozen=True, slots=True)
class EngineStats:
    """A snapshot of one engine, as of its last step."""

    requests_running: int
    """Requests in the running batch."""
    requests_waiting: int
    """Requests queued for the batch."""
    kv_cache_usage: float
    """Share of the KV cache in use, 0 to 1."""
    prefix_cache_hit_rate: float
    """Prompt tokens found in the prefix cache over prompt tokens looked up, since start."""
    prompt_tokens: int
    """Prompt tokens prefilled since start (cached ones excluded)."""
    generation_tokens: int
    """Tokens generated since start."""
    requests_finished: int
    """Requests finished since start."""
    engine_cores: tuple[EngineStats, ...] = ()
    """The same figures per engine core (data-parallel rank), in rank order; the figures above
    are their sums (``kv_cache_usage``: their mean). Each core's own ``engine_cores`` is empty."""


@dataclass(slots=True)
class _CoreFigures:
    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0
    queries: int = 0
    hits: int = 0
    prompt: int = 0
    generated: int = 0
    finished: int = 0

    def stats(self, cores: tuple[EngineStats, ...] = ()) -> EngineStats:
        return EngineStats(
            requests_running=self.running,
            requests_waiting=self.waiting,
            kv_cache_usage=self.kv_usage,
            prefix_cache_hit_rate=self.hits / self.queries if self.queries else 0.0,
            prompt_tokens=self.prompt,
            generation_tokens=self.generated,
            requests_finished=self.finished,
            engine_cores=cores,
        )


class StatsBook:
    """The running figures of one engine, per engine core; vLLM's stat loggers call
    :meth:`record` after every step, on the engine loop, and :meth:`snapshot` may be called from
    any thread."""

    def __init__(self, *, enabled: bool = True) -> None:
        self.enabled = enabled
        """False for an engine started with ``disable_log_stats=True``: vLLM then records no
        stats (no stat loggers, no per-step ``IterationStats``), so this book stays empty."""
        self._lock = threading.Lock()
        self._cores: dict[int, _CoreFigures] = {}

    def record(
        self,
        scheduler_stats: SchedulerStats | None,
        iteration_stats: IterationStats | None,
        engine_index: int = 0,
    ) -> None:
        """Add one step's ``SchedulerStats`` and ``IterationStats`` (either may be ``None``) of
        engine core ``engine_index``."""
        with self._lock:
            core = self._cores.setdefault(engine_index, _CoreFigures())
            if scheduler_stats is not None:
                core.running = scheduler_stats.num_running_reqs
                core.waiting = scheduler_stats.num_waiting_reqs
                core.kv_usage = float(scheduler_stats.kv_cache_usage)
                prefix = scheduler_stats.prefix_cache_stats
                if prefix is not None:
                    core.queries += prefix.queries
                    core.hits += prefix.hits
            if iteration_stats is not None:
                core.prompt += iteration_stats.num_prompt_tokens
                core.generated += iteration_stats.num_generation_tokens
                core.finished += len(iteration_stats.finished_requests)

    def snapshot(self) -> EngineStats:
        """The figures now: the sums over the engine cores, and each core's own.
        :class:`StatsDisabledError` when the book is not :attr:`enabled`."""
        if not self.enabled:
            raise StatsDisabledError(
                "This engine was started with disable_log_stats=True, so vLLM records no stats "
                "for it (none here, no Prometheus series, no request metrics): start it without "
                "that option to have them."
            )
        with self._lock:
            cores = [self._cores[i] for i in sorted(self._cores)] or [_CoreFigures()]
            total = _CoreFigures(
                running=sum(c.running for c in cores),
                waiting=sum(c.waiting for c in cores),
                kv_usage=sum(c.kv_usage for c in cores) / len(cores),
                queries=sum(c.queries for c in cores),
                hits=sum(c.hits for c in cores),
                prompt=sum(c.prompt for c in cores),
                generated=sum(c.generated for c in cores),
                finished=sum(c.finished for c in cores),
            )
            return total.stats(tuple(c.stats() for c in cores))
