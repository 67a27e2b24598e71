"""vLLM's stat-logger API, as the engine uses it (a companion of :mod:`.vllm_engine`).

Two loggers are handed to ``AsyncLLM.from_engine_args(stat_loggers=...)`` for every engine:

- :class:`BookLogger` writes each step's figures into the engine's :class:`StepRecorder` (the
  ``StatsBook`` behind ``Engine.stats()``);
- :class:`SharedPrometheusStatLogger` is vLLM's own ``PrometheusStatLogger`` with its metrics
  in the registry it is given (``prometheus_registry()``) instead of the global one. vLLM's logger
  unregisters every ``vllm:`` metric of the global registry when an engine starts (one server,
  one engine), so a second in-process engine would erase the first one's series; here the
  metric objects are created once per process and shared, and each engine writes its own
  ``model_name`` label values. A few of vLLM's metrics (``PerfMetricsProm``, the connectors'
  and speculative decoding's) still go to the global registry, unregistered and registered
  again by every logger: two engines finishing their start at once (``start_engines``, or the
  workers of a group, whose engines attach in a moment) would interleave the two and fail with
  ``DuplicateTimeseries``, so loggers are built one at a time.

Imported only when an engine starts.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable
from typing import Any, Protocol

from prometheus_client import Counter, Gauge, Histogram
from vllm.v1.metrics.loggers import PrometheusStatLogger, StatLoggerBase

__all__ = ["BookLogger", "SharedPrometheusStatLogger", "StepRecorder", "stat_loggers"]


class StepRecorder(Protocol):
    """Where an engine's step figures go (``vllm_inline.engine.life.metrics.StatsBook``)."""

    enabled: bool
    """False when the engine was started with vLLM's stats off."""

    def record(self, scheduler_stats: Any, iteration_stats: Any, engine_index: int = 0) -> None:
        """Add one step's ``SchedulerStats`` and ``IterationStats`` of engine core
        ``engine_index``."""


_metrics: dict[str, Any] = {}
_metrics_lock = threading.Lock()
_registry: list[Any] = []  # the registry stat_loggers was given (one per process)
_building_lock = threading.Lock()  # one PrometheusStatLogger.__init__ at a time (see above)


def _shared(cls: Callable[..., Any], **kwargs: Any) -> Any:
    """The process's ``cls`` metric of this name, created in the shared registry once."""
    name = kwargs["name"]
    labelnames = tuple(kwargs.get("labelnames") or ())
    with _metrics_lock:
        metric = _metrics.get(name)
        if metric is not None and type(metric) is cls and tuple(metric._labelnames) == labelnames:
            return metric
        if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):  # only read in multiprocess mode
            kwargs.pop("multiprocess_mode", None)
        if metric is not None:  # same name, other labels: keep it apart, unexported
            return cls(**kwargs, registry=None)
        metric = _metrics[name] = cls(**kwargs, registry=_registry[0])
        return metric


class SharedPrometheusStatLogger(PrometheusStatLogger):
    """vLLM's Prometheus logger, writing to the registry :func:`stat_loggers` was given."""

    # vLLM only calls these, as factories of its metrics: a partial stands in for the class.
    _gauge_cls = functools.partial(_shared, Gauge)  # type: ignore[assignment]
    _counter_cls = functools.partial(_shared, Counter)  # type: ignore[assignment]
    _histogram_cls = functools.partial(_shared, Histogram)  # type: ignore[assignment]

    def __init__(self, vllm_config: Any, engine_indexes: list[int] | None = None) -> None:
        with _building_lock:
            super().__init__(vllm_config, engine_indexes)


class BookLogger(StatLoggerBase):
    """Writes each step's scheduler and iteration stats into a :class:`StepRecorder`."""

    def __init__(self, vllm_config: Any, engine_index: int = 0, *, book: StepRecorder) -> None:
        self.book = book
        """Where the figures go."""
        self.engine_index = engine_index
        """The engine core (data-parallel rank) this logger is for: vLLM makes one per core."""

    def record(
        self,
        scheduler_stats: Any,
        iteration_stats: Any,
        mm_cache_stats: Any = None,
        engine_idx: int = 0,
    ) -> None:
        self.book.record(scheduler_stats, iteration_stats, self.engine_index)

    def log_engine_initialized(self) -> None:
        pass


def stat_loggers(book: StepRecorder, registry: Any) -> list[Any]:
    """The ``stat_loggers`` argument of ``AsyncLLM.from_engine_args`` for one engine; its
    Prometheus metrics go to ``registry``, the process's one ``CollectorRegistry``."""
    with _metrics_lock:
        _registry[:] = [registry]
    return [functools.partial(BookLogger, book=book), SharedPrometheusStatLogger]
