"""The environment an engine start sets while vLLM spawns its processes
(``vllm_processes.spawn_environment``): starts that want the same values overlap, one that
wants another value waits, and the caller's environment comes back when the last one ends."""

from __future__ import annotations

import os
import threading
import time

from vllm_inline.engine.seam.vllm_processes import spawn_environment

NAME = "VLLMINLINE_TEST_SPAWN_VARIABLE"


def test_same_values_overlap_and_the_callers_value_returns_after_the_last(monkeypatch) -> None:
    monkeypatch.setenv(NAME, "callers")
    with spawn_environment({NAME: "engine"}):
        with spawn_environment({NAME: "engine"}):  # would deadlock if starts took turns
            assert os.environ[NAME] == "engine"
        assert os.environ[NAME] == "engine"  # the first start still spawning
    assert os.environ[NAME] == "callers"


def test_another_value_waits_for_the_starts_using_the_variable(monkeypatch) -> None:
    monkeypatch.delenv(NAME, raising=False)
    seen: list[str] = []
    first_in, release = threading.Event(), threading.Event()

    def first() -> None:
        with spawn_environment({NAME: "0|1"}):
            first_in.set()
            release.wait(10)
            seen.append(os.environ[NAME])

    def second() -> None:
        first_in.wait(10)
        with spawn_environment({NAME: "0"}):
            seen.append(os.environ[NAME])

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    first_in.wait(10)
    time.sleep(0.2)
    assert seen == []  # the second start waits while the first one's value is set
    release.set()
    for thread in threads:
        thread.join(10)
    assert seen == ["0|1", "0"]
    assert NAME not in os.environ
