"""``/v1/responses`` on the two workers of ``python -m vllm_inline serve --workers 2``, in a
process of its own (``make test-server``): LlamaIndex's ``OpenAIResponses`` with
``track_previous_responses=True`` holds two-turn conversations whose second turn lands on the
other worker (every request on a new connection), a response stored by one worker is read by
the other, a background response is cancelled through the worker that does not run it, a
background stream left by its client is resumed on the other worker, and after the launcher
is stopped and started again on the same store file the responses are still there; a
background response whose worker is then killed is failed in the store, not left queued.
Every process is followed by pid and cleaned up.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from processes import clean_up, describe, free_port, process_tree, shm_entries, wait_gone
from serving import sse_events

from vllm_inline.engine.life.group import WORKER_VARIABLE
from vllm_inline.testing import CPU_TEST_ENGINE_KWARGS, scripted_model
from vllm_inline.workers import WORKER_HEADER

pytestmark = [pytest.mark.engine, pytest.mark.server]


class Launched:
    def __init__(self, child: subprocess.Popen[bytes], url: str, log: Path) -> None:
        self.child, self.url, self.log = child, url, log
        self.tree: dict[int, Any] = {}
        self.victim: Any = None
        """A worker process the test kills at the end instead of SIGTERM to the launcher."""

    def look(self) -> None:
        with contextlib.suppress(Exception):
            self.tree.update({p.pid: p for p in process_tree(self.child.pid)})

    def worker(self, index: str) -> Any:
        """The worker process that answers with ``index`` in its worker header."""
        self.look()
        for process in self.tree.values():
            with contextlib.suppress(Exception):
                if process.environ().get(WORKER_VARIABLE) == index and any(
                    "worker_main" in part for part in process.cmdline()
                ):
                    return process
        raise AssertionError(f"no worker {index} among {describe(self.tree.values())}")


@contextlib.contextmanager
def launched(tmp_path: Path, model: str, store: Path) -> Iterator[Launched]:
    """``serve --workers 2`` on ``model`` and ``store``, healthy on both workers."""
    port = free_port()
    command = [
        sys.executable, "-m", "vllm_inline", "serve", "--workers", "2", "--model", model,
        "--served-model-name", "llama3", "--responses-store", str(store), "--port", str(port),
        "--vllm-kwargs", json.dumps(dict(CPU_TEST_ENGINE_KWARGS)),
    ]  # fmt: skip
    log = tmp_path / f"serve-{port}.log"
    before = shm_entries()
    with log.open("w") as out:
        child = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, process_group=0)
    run = Launched(child, f"http://127.0.0.1:{port}", log)
    try:
        deadline = time.monotonic() + 300
        seen: set[str] = set()
        while len(seen) < 2:
            run.look()
            assert child.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "no two healthy workers\n" + log.read_text()
            with contextlib.suppress(httpx.HTTPError):
                answer = httpx.get(f"{run.url}/health", timeout=5)
                if answer.status_code == 200:
                    seen.add(answer.headers[WORKER_HEADER])
                    continue
            time.sleep(0.5)
        run.look()
        yield run
        if run.victim is None:
            child.send_signal(signal.SIGTERM)
            assert child.wait(timeout=90) == 0, log.read_text()[-3000:]
        else:  # one worker killed: the group stops, status 1
            run.victim.kill()
            assert child.wait(timeout=90) == 1, log.read_text()[-3000:]
        left, shm_left, _ = wait_gone(list(run.tree.values()), shm_entries() - before, 30)
        assert not left and not shm_left, (describe(left), shm_left)
    finally:
        run.look()
        clean_up(run.tree.values(), shm_entries() - before)


def test_llama_index_conversations_across_workers_and_a_restart(
    scripted_root: Path, tmp_path: Path
) -> None:
    from llama_index.core.llms import ChatMessage
    from llama_index.llms.openai import OpenAIResponses

    chat = scripted_model("llama3", scripted_root)
    store = tmp_path / "responses.sqlite3"
    workers: list[str] = []

    def remember(response: httpx.Response) -> None:
        workers.append(response.headers[WORKER_HEADER])

    with launched(tmp_path, chat.path, store) as run:
        # No keep-alive: each request on a new connection, which either worker may accept.
        http = httpx.Client(
            limits=httpx.Limits(max_keepalive_connections=0),
            event_hooks={"response": [remember]},
            timeout=60,
        )
        crossed = None
        for _ in range(12):
            workers.clear()
            llm = OpenAIResponses(
                model="llama3", api_base=f"{run.url}/v1", api_key="unused", context_window=512,
                track_previous_responses=True, max_retries=0, http_client=http,
            )  # fmt: skip
            first = llm.chat([ChatMessage(role="user", content="Hello")])
            second = llm.chat([ChatMessage(role="user", content="And again?")])
            assert first.message.content == second.message.content == chat.scenario.answer
            assert second.raw.previous_response_id == first.raw.id
            if workers[0] != workers[1]:  # the second turn's worker read the first's response
                crossed = first.raw.id
                break
        assert crossed is not None, (
            f"every second turn landed on its first turn's worker: {workers}"
        )

        read_by: dict[str, Any] = {}
        for _ in range(40):
            answer = httpx.get(f"{run.url}/v1/responses/{crossed}", timeout=30)
            assert answer.status_code == 200, answer.text
            read_by.setdefault(answer.headers[WORKER_HEADER], answer.json())
            if len(read_by) == 2:
                break
        assert sorted(read_by) == ["0", "1"]
        assert read_by["0"] == read_by["1"]

        # A background response cancelled through the other worker: the one running it stops
        # and keeps it cancelled.
        long = {"model": "llama3", "input": "Hello", "background": True, "ignore_eos": True,
                "max_output_tokens": 400}  # fmt: skip
        for _ in range(12):
            started = http.post(f"{run.url}/v1/responses", json=long)
            cancel = http.post(f"{run.url}/v1/responses/{started.json()['id']}/cancel")
            assert cancel.status_code == 200, cancel.text
            if cancel.headers[WORKER_HEADER] != started.headers[WORKER_HEADER]:
                break
        assert cancel.headers[WORKER_HEADER] != started.headers[WORKER_HEADER]
        time.sleep(1.5)  # the running worker polls every 0.25 s
        got = http.get(f"{run.url}/v1/responses/{started.json()['id']}").json()
        assert got["status"] == "cancelled" and got["output"] == []
        http.close()

        # A background stream left by its client after 4 events and resumed on the other
        # worker (while it may still run there): every event once, in order, to the end.
        body = {**long, "stream": True}
        with httpx.stream("POST", f"{run.url}/v1/responses", json=body, timeout=60) as r:
            origin = r.headers[WORKER_HEADER]
            head = sse_events(r.iter_lines(), most=4)
        url = f"{run.url}/v1/responses/{head[0]['response']['id']}"
        # The busy worker (its loop awake) often wins the shared socket's accept while it runs
        # the stream: try until a deadline, not a count (once it ends, either worker may).
        rest = None
        deadline = time.monotonic() + 90
        while rest is None and time.monotonic() < deadline:
            query = {"stream": "true", "starting_after": 3}
            with httpx.stream("GET", url, params=query, timeout=60) as r:
                if r.headers[WORKER_HEADER] != origin:
                    rest = sse_events(r.iter_lines())
            time.sleep(0.05)
        assert rest is not None, "every resumption landed on the worker that runs it"
        events = head + rest
        assert [e["sequence_number"] for e in events] == list(range(len(events)))
        assert events[-1]["type"] == "response.incomplete"  # max_output_tokens reached
        text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
        final = events[-1]["response"]
        assert text and text == final["output"][0]["content"][0]["text"]
        assert httpx.get(url, timeout=30).json() == final

    assert store.exists()
    with launched(tmp_path, chat.path, store) as run:  # the launcher again, on the same file
        again = httpx.get(f"{run.url}/v1/responses/{crossed}", timeout=30)
        assert again.status_code == 200 and again.json() == read_by["0"]
        body = {"model": "llama3", "input": "More?", "previous_response_id": crossed}
        more = httpx.post(f"{run.url}/v1/responses", json=body, timeout=60)
        assert more.status_code == 200, more.text
        assert more.json()["output"][0]["content"][0]["text"] == chat.scenario.answer

        # A background response whose worker is killed while it runs: the group stops, and
        # the store (as the next group reads it) says it failed, naming that worker.
        started = httpx.post(f"{run.url}/v1/responses", json={**long, "max_output_tokens": 480},
                             timeout=60)  # fmt: skip
        assert started.status_code == 200, started.text
        run.victim = run.worker(started.headers[WORKER_HEADER])
        running = httpx.get(f"{run.url}/v1/responses/{started.json()['id']}", timeout=30)
        assert running.json()["status"] in ("queued", "in_progress"), running.json()["status"]

    from vllm_inline.server.responses import SQLiteResponseStore

    after = SQLiteResponseStore(store)
    failed = after.get(started.json()["id"])
    after.close()
    assert failed is not None and failed.response["status"] == "failed"
    assert failed.response["error"]["code"] == "server_error"
    assert f"pid {run.victim.pid}" in failed.response["error"]["message"]
