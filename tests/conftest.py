"""Shared fixtures: scripted tiny models on real vLLM engines, one engine per model per session.

Every test that needs an engine asks for ``scripted("<scenario>")``; the model is built once
(:func:`vllm_inline.testing.scripted_model`) and its engine comes from :func:`get_engine` with
the kit's ``CPU_TEST_ENGINE_KWARGS`` (float32, a 512-token context, eager mode, a 128 MiB KV
cache), so the engine tests and both integrations share the same engines.

Before the first test, :func:`shared_engines_started_together` starts the shared engines the
selected tests name, two at a time (an engine start mostly waits on one core for vLLM's imports
in its new processes). After each module :func:`shared_engines_left_as_found` checks that no
test restarted, killed or left work on a shared engine. ``engine_starts.py`` counts the starts.
"""

from __future__ import annotations

import inspect
import os
import re
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from launches import Launches
from processes import RENDEZVOUS_PREFIX, left_in_tmp, remove_from_tmp, tmp_entries

from vllm_inline.testing import ScriptedModel, scripted_model

pytest_plugins = ["engine_starts"]

_LEFT_IN_TMP: list[tuple[str, list[str]]] = []  # (test, names left in /tmp after it)
_RENDEZVOUS_SEEN: dict[str, str] = {}  # vllm_dist_* file in /tmp -> test it appeared by

OWN_PROCESSES = (
    "tests/test_check.py::test_check_fails_when",
    "tests/test_check.py::test_cli_",
    "tests/test_clean_run.py::test_chatvllm_",
    "tests/test_docs_snippets.py::",
    "tests/test_cli.py::",
    "tests/test_engine_cpu_defaults.py::test_an_engine_with_no_options",
    "tests/test_examples.py::",
    "tests/test_langchain_standard.py::TestChatVLLMImageIntegration::",
    "tests/test_observability.py::test_prometheus_metrics_through_the_fastapi_example",
    "tests/test_observability.py::test_priority_runs_a_later_urgent_request_first",
    "tests/test_server.py::",
    "tests/test_reliability.py::test_templateless",
    "tests/test_reliability.py::test_one_log_line_per_engine_start",
    "tests/test_reliability.py::test_engine_death_ends_integration_streams",
)
"""Tests that start processes or engines of their own (a CLI, a first run, the example apps and
servers on engines with no options, a broken or template-less copy of a model, other engine
options). ``make test TEST_WORKERS=2`` runs on two pytest-xdist workers: these on one,
everything else (the tests on the shared engines, a few of their own, and those that start no
engine) on the other, so no shared engine starts twice and the two halves take about as long
(measured: a few tests of their own stay on the shared side to even the halves out)."""


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under ``--dist loadscope`` (``TEST_WORKERS=2``) two scopes: :data:`OWN_PROCESSES`, the
    rest."""
    if config.getoption("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class TwoHalves(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return "own-processes" if nodeid.startswith(OWN_PROCESSES) else "shared-engines"

    return TwoHalves(config, log)


SHARED = ("llama3", "chatml", "gemma", "chatml_reasoning", "chatml_tools", "llama3_tools", "long")
"""The scenarios whose engines (the kit's options) the suite shares; started together before
the first test when the selected modules name them (:func:`shared_engines_started_together`)."""

_MODELS = pytest.StashKey[dict[str, ScriptedModel]]()
_STARTED = pytest.StashKey[bool]()
_PARTLY_SELECTED = pytest.StashKey[set[Path]]()


def pytest_deselected(items: list[pytest.Item]) -> None:
    """Remember the modules a `-m`/`-k` selection cut into (see shared_engines_started_together)."""
    for item in items:
        item.config.stash.setdefault(_PARTLY_SELECTED, set()).add(item.path)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        # A test that asks for a scripted model runs an engine, marked or not.
        if "scripted" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.engine)


def _on_shared_engines(item: pytest.Item) -> bool:
    return (
        item.get_closest_marker("engine") is not None
        and not any(item.get_closest_marker(suite) for suite in ("parallel", "real"))
        and not item.nodeid.startswith(OWN_PROCESSES)
    )


@pytest.fixture(scope="session")
def scripted_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = os.environ.get("VLLMINLINE_TEST_MODELS")
    return Path(root) if root else tmp_path_factory.mktemp("scripted-models")


@pytest.fixture(scope="session")
def scripted(
    request: pytest.FixtureRequest, scripted_root: Path
) -> Iterator[Callable[[str], ScriptedModel]]:
    """``scripted("llama3")`` -> :class:`ScriptedModel` (model built once, engine shared)."""
    cache = request.config.stash.setdefault(_MODELS, {})

    def get(name: str) -> ScriptedModel:
        if name not in cache:
            cache[name] = scripted_model(name, root=scripted_root)
        return cache[name]

    yield get
    from vllm_inline.engine import shutdown_all

    shutdown_all()


@pytest.fixture(scope="session")
def launches(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launches]:
    """Commands run in processes of their own (tests/launches.py)."""
    running = Launches(tmp_path_factory)
    yield running
    running.close()


@pytest.fixture(autouse=True)
def shared_engines_started_together(request: pytest.FixtureRequest) -> None:
    """At the first test on the shared engines, start at once those the selected tests name
    (:data:`SHARED` scenarios their modules ask for, the embedder), two at a time: an engine
    start mostly waits on one core for vLLM's imports in its new processes. These are the
    engines the tests would start one after another at their first use (same models, same
    options). Under pytest-xdist this runs on the worker that has the shared engines."""
    if not _on_shared_engines(request.node) or request.config.stash.get(_STARTED, False):
        return
    request.config.stash[_STARTED] = True
    # The selected tests' own processes (tests/launches.py) start now and run beside these;
    # not under pytest-xdist, where another worker may run the tests that read them.
    if not hasattr(request.config, "workerinput"):
        launched = request.getfixturevalue("launches")
        for item in request.session.items:
            for marker in item.iter_markers("launches"):
                launched.start(*marker.args)
    # A whole module: its source, fixtures and helpers included. Part of one (`-m smoke`, `-k`):
    # only the selected tests' own code, so a selection starts no engine it does not use.
    partly = request.config.stash.get(_PARTLY_SELECTED, set())
    sources = {
        inspect.getsource(item.function) if item.path in partly else item.path.read_text()
        for item in request.session.items
        if _on_shared_engines(item) and isinstance(item, pytest.Function)
    }
    if len(sources) < 2:  # one module: its engines start as its tests need them
        return
    from vllm_inline.engine import get_engine, start_engines
    from vllm_inline.testing import build_embedding_model

    scripted = request.getfixturevalue("scripted")
    named = {name for source in sources for name in re.findall(r'scripted\("(\w+)"\)', source)}
    engines = [scripted(name).engine for name in SHARED if name in named]
    if any("build_embedding_model" in source for source in sources):
        root = request.getfixturevalue("scripted_root")
        kwargs = scripted("llama3").engine_kwargs
        engines.append(get_engine(str(build_embedding_model(root)), runner="pooling", **kwargs))
    start_engines(*engines, max_concurrent=2)


@pytest.fixture(scope="module", autouse=True)
def shared_engines_left_as_found(request: pytest.FixtureRequest) -> Iterator[None]:
    """After each module: every shared engine that was running before it still runs the same
    vLLM engine (not restarted, not dead) and has no request left in flight. A module that
    needs to kill, restart or reconfigure an engine uses one of its own (other options)."""
    models = request.config.stash.get(_MODELS, {})
    before = {name: (s.engine, s.engine.runtime) for name, s in models.items() if s.engine.started}
    yield
    for name, (engine, runtime) in before.items():
        assert engine.started and engine.runtime is runtime, (
            f"the shared {name!r} engine was shut down or restarted by this module"
        )
        assert not runtime.llm.errored, f"the shared {name!r} engine died in this module"
        deadline = time.monotonic() + 10  # aborts of cancelled streams land within a step
        while engine.num_unfinished_requests() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert engine.num_unfinished_requests() == 0, (
            f"the shared {name!r} engine still runs {engine.num_unfinished_requests()} request(s)"
        )


@pytest.fixture(scope="session")
def tmp_at_start() -> set[str]:
    """The temporary directory before this session's first test: nothing in it is the
    session's."""
    return tmp_entries()


@pytest.fixture(autouse=True)
def nothing_left_in_tmp(request: pytest.FixtureRequest, tmp_at_start: set[str]) -> Iterator[None]:
    """After each test, what appeared in the temporary directory during the session and is
    left behind (a socket file no process has bound, an engine owner directory whose owner is
    dead: :func:`processes.left_in_tmp`) is removed and named at the end with the test after
    which it was found, as tests/parallel/conftest.py does for ``/dev/shm``. Other runs on the
    host can add names meanwhile: the summary says what was found, it does not fail the test."""
    yield
    new = tmp_entries() - tmp_at_start
    for name in new:
        if name.startswith(RENDEZVOUS_PREFIX):
            _RENDEZVOUS_SEEN.setdefault(name, request.node.nodeid)
    if not new or not (left := left_in_tmp(new)):
        return
    left = left_in_tmp(left)  # again: a socket bound between its file and the kernel's table
    remove_from_tmp(left)
    if left:
        _LEFT_IN_TMP.append((request.node.nodeid, sorted(left)))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    # A rendezvous file is in use while its engine runs, which may outlive a test (a module's
    # server): one still there when every fixture is down was left by the test it appeared in.
    root = tempfile.gettempdir()
    for name, test in _RENDEZVOUS_SEEN.items():
        if os.path.exists(os.path.join(root, name)):
            remove_from_tmp([name])
            _LEFT_IN_TMP.append((test, [name]))
    for test, names in _LEFT_IN_TMP:
        terminalreporter.write_line(
            f"left in {tempfile.gettempdir()} after {test} (removed): {', '.join(names)}",
            yellow=True,
        )
