"""The chat page at ``/`` (vllm_inline/server/chat.html) in a real headless Chromium, driven by
selenium, on a real engine (the ``demo`` scripted model: its long answer streams in many
tokens): the answer grows as the deltas arrive and ends as the scripted answer, usage and the
time to first token show, a second turn carries the first, a locked server takes the key typed
in the page, and the browser logs no error.

Needs Debian's ``chromium`` and ``chromium-driver`` and ``selenium``: ``make test-browser``
installs them and runs this module (the default run leaves the ``browser`` marker out).
"""

from __future__ import annotations

import importlib.util
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from serving import serving

from vllm_inline.server import Limits, create_app
from vllm_inline.testing import build_embedding_model

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
MISSING = [
    what
    for what, there in (
        (f"{CHROMIUM} (apt-get install chromium)", CHROMIUM.exists()),
        (f"{CHROMEDRIVER} (apt-get install chromium-driver)", CHROMEDRIVER.exists()),
        ("selenium (pip install selenium)", importlib.util.find_spec("selenium") is not None),
    )
    if not there
]

pytestmark = [
    pytest.mark.engine,
    pytest.mark.browser,
    pytest.mark.skipif(
        bool(MISSING), reason=f"missing {', '.join(MISSING)}: make test-browser installs them"
    ),
]

SCENARIO = "demo"
API_KEY = "page-secret"
READ = """const el = (id) => document.getElementById(id);
return {answer: el("answer")?.textContent, busy: el("answer")?.getAttribute("aria-busy"),
        turns: document.querySelectorAll("#log .assistant").length,
        usage: el("usage").textContent, ttft: el("ttft").textContent, error: el("error").textContent,
        models: [...el("model").options].map((o) => o.value)};"""
"""Everything a poll reads, in one WebDriver round trip."""


@pytest.fixture(scope="module")
def demo(scripted: Any) -> Any:
    return scripted(SCENARIO)


@pytest.fixture(scope="module")
def url(demo: Any, scripted_root: Path) -> Iterator[str]:
    """The page's server on the ``demo`` engine and an embedder (started by its lifespan): the
    page lists the chat model only."""
    embedder = str(build_embedding_model(scripted_root))
    app = create_app(demo.path, embedding=embedder, vllm_kwargs=demo.engine_kwargs)
    with serving(app) as base:
        yield base


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    """A fresh headless Chromium (its own profile, nothing fetched from the network), quit
    however the test ends."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--disable-gpu",
        f"--user-data-dir={tmp_path / 'profile'}",
        "--window-size=1000,900",
    ):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    try:
        driver.set_page_load_timeout(60)
        driver.set_script_timeout(30)
        yield driver
    finally:
        driver.quit()


def wait_for(driver: Any, done: Any, what: str, timeout: float = 60) -> dict[str, Any]:
    """Poll the page until ``done(state)``; the last state."""
    deadline = time.monotonic() + timeout
    while not done(state := driver.execute_script(READ)):
        assert time.monotonic() < deadline, f"the page never showed {what}: {state}"
        time.sleep(0.05)
    return state


def ask(driver: Any, question: str) -> tuple[dict[str, Any], list[str]]:
    """Type ``question``, send it, and read the answer every ~20 ms until the page marks it
    finished: the final state and the answer's successive texts."""
    from selenium.webdriver.common.by import By

    turns = driver.execute_script(READ)["turns"]
    driver.find_element(By.ID, "prompt").send_keys(question)
    driver.find_element(By.ID, "send").click()
    seen: list[str] = []
    deadline = time.monotonic() + 120  # the engine may share these 2 cores with other work
    while True:
        tick = time.monotonic()
        state = driver.execute_script(READ)
        if state["turns"] > turns:  # the new turn's answer holds the id "answer"
            if state["answer"] and (not seen or seen[-1] != state["answer"]):
                seen.append(state["answer"])
            if state["busy"] == "false":
                return state, seen
        assert time.monotonic() < deadline, f"no finished answer after 120 s: {state}"
        time.sleep(max(0.0, tick + 0.02 - time.monotonic()))  # a read every 20 ms


def usage_of(state: dict[str, Any]) -> tuple[int, int]:
    found = re.fullmatch(r"(\d+) prompt \+ (\d+) completion tokens", state["usage"])
    assert found, f"no usage shown: {state['usage']!r}"
    return int(found[1]), int(found[2])


def test_the_page_streams_answers_and_keeps_the_conversation(
    url: str, demo: Any, browser: Any
) -> None:
    answer = demo.scenario.answer
    completion_tokens = demo.scenario.script.index(demo.scenario.chat.stop) + 1  # with the stop
    browser.get(url + "/")
    assert browser.title == "vllm-inline chat"
    state = wait_for(browser, lambda s: s["models"], "the models")
    assert state["models"] == [demo.path] and not state["error"]

    messages = [{"role": "user", "content": "What is vllm-inline?"}]
    state, seen = ask(browser, messages[0]["content"])
    assert not state["error"]
    assert state["answer"] == seen[-1] == answer
    growing = seen[:-1]
    assert len(growing) >= 3, f"the answer did not grow over several updates: {seen}"
    assert all(answer.startswith(text) for text in seen), seen
    assert usage_of(state) == (len(demo.engine.prompt_token_ids(messages)), completion_tokens)
    ttft = re.fullmatch(r"first token in (\d+) ms", state["ttft"])
    assert ttft and 0 < int(ttft[1]) < 120_000, state["ttft"]

    # The second request carries the whole conversation: its prompt is the three turns.
    messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": "More?"}]
    state, seen = ask(browser, "More?")
    assert not state["error"] and state["answer"] == answer and len(seen) >= 2
    assert state["turns"] == 2
    assert usage_of(state) == (len(demo.engine.prompt_token_ids(messages)), completion_tokens)
    assert re.fullmatch(r"first token in \d+ ms", state["ttft"])

    severe = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert not severe, severe


def test_a_locked_server_takes_the_key_typed_in_the_page(url: str, demo: Any, browser: Any) -> None:
    """Without the key the page says why it has no model; with it, it lists them and answers."""
    from selenium.webdriver.common.by import By

    locked = create_app(demo.path, vllm_kwargs=demo.engine_kwargs, limits=Limits(api_key=API_KEY))
    with serving(locked, lifespan="off") as base:  # next to `url`'s server, on its engine
        browser.get(base + "/")
        state = wait_for(browser, lambda s: s["error"], "the missing key")
        assert "Unauthorized" in state["error"] and not state["models"]

        browser.find_element(By.ID, "api-key").send_keys(API_KEY + "\t")  # the change event
        state = wait_for(browser, lambda s: s["models"], "the models")
        assert state["models"] == [demo.path] and not state["error"]
        state, _ = ask(browser, "Hello")
        assert not state["error"] and state["answer"] == demo.scenario.answer
        usage_of(state)
