"""``--workers N``: an app's worker processes on one engine per model (vllm_inline.workers).

Each test runs ``python -m vllm_inline serve --workers 2`` in a process of its own and follows
every process below it by pid: both workers answer from exactly one engine core per model, a
stream cancelled in a worker is aborted in the shared engine, and the launcher stopped by
SIGTERM or SIGKILL, a worker killed, or bad use leaves no process and no ``/dev/shm`` segment.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from processes import (
    alive,
    clean_up,
    describe,
    free_port,
    owner_directories,
    process_tree,
    shm_entries,
    wait_gone,
)

from vllm_inline.testing import CPU_TEST_ENGINE_KWARGS, build_embedding_model, scripted_model
from vllm_inline.workers import WORKER_HEADER

pytestmark = [pytest.mark.engine, pytest.mark.parallel]

HELLO = [{"role": "user", "content": "Hello"}]


class Launched:
    """The launcher's process, every process seen below it, and its log."""

    def __init__(self, child: subprocess.Popen[bytes], log: Path, url: str) -> None:
        self.child = child
        self.log = log
        self.url = url
        self.tree: dict[int, psutil.Process] = {}

    def look(self) -> list[psutil.Process]:
        with contextlib.suppress(psutil.NoSuchProcess):
            self.tree.update({p.pid: p for p in process_tree(self.child.pid)})
        return alive(self.tree.values())

    def named(self, name: str) -> list[psutil.Process]:
        found = []
        for p in self.look():
            with contextlib.suppress(psutil.NoSuchProcess):
                if name in " ".join(p.cmdline()):
                    found.append(p)
        return found

    def text(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def assert_stopped_quietly(self) -> None:
        """Nothing in the log of an ERROR or a traceback (issue 63: the group and ``run`` stop
        their engines in order, the output handlers before the engine cores)."""
        log = self.log.read_text(errors="replace")
        bad = [line for line in log.splitlines() if " ERROR " in line or "Traceback" in line]
        assert not bad, bad[:20]


@contextlib.contextmanager
def launched(tmp_path: Path, *arguments: str, healthy: bool = True) -> Iterator[Launched]:
    port = free_port()
    command = [
        sys.executable, "-m", "vllm_inline", "serve", "--port", str(port),
        "--vllm-kwargs", json.dumps(dict(CPU_TEST_ENGINE_KWARGS)), *arguments,
    ]  # fmt: skip
    log_path = tmp_path / "launcher.log"
    before = shm_entries()
    with log_path.open("w") as log:
        child = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, process_group=0)
        run = Launched(child, log_path, f"http://127.0.0.1:{port}")
        try:
            if healthy:
                deadline = time.monotonic() + 300
                while not _healthy(run, twice=True):
                    run.look()
                    assert child.poll() is None, run.text()
                    assert time.monotonic() < deadline, "no healthy workers\n" + run.text()
                    time.sleep(0.5)
                run.look()
            yield run
        finally:
            run.look()
            clean_up(run.tree.values(), shm_entries() - before)
            remove_metrics_files(child.pid)


def _native_libraries(pid: int, needles: tuple[str, ...]) -> list[str]:
    """The files mapped in process ``pid`` whose path holds one of ``needles`` (torch's and
    vLLM's native libraries are mapped once they are imported)."""
    with open(f"/proc/{pid}/maps") as maps:
        paths = {line.split(maxsplit=5)[-1].strip() for line in maps if "/" in line}
    return sorted(p for p in paths if any(n in p for n in needles))


def remove_metrics_files(launcher: int) -> None:
    """The workers' metric files, which a launcher killed by SIGKILL leaves for the next one to
    sweep (vllm_inline.workers): this test's own, removed by the launcher's pid."""
    pattern = os.path.join(tempfile.gettempdir(), f"vllm-inline-metrics-{launcher}-*")
    for directory in glob.glob(pattern):
        shutil.rmtree(directory, ignore_errors=True)


def _healthy(run: Launched, twice: bool) -> bool:
    """``/health`` answers 200 from both workers (new connections land on either)."""
    seen = set()
    for _ in range(20 if twice else 1):
        try:
            response = httpx.get(f"{run.url}/health", timeout=5)
        except httpx.HTTPError:
            return False
        if response.status_code != 200:
            return False
        seen.add(response.headers[WORKER_HEADER])
        if len(seen) == 2 or not twice:
            return True
    return False


def _from_both(run: Launched, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """POST ``body`` on new connections until both workers have answered (two minutes at
    most); each answer by worker. The workers share one listening socket, and whichever wakes
    first accepts: on a loaded host one of them can take dozens of connections in a row, so the
    requests are spread over time, not only counted."""
    answers: dict[str, Any] = {}
    deadline = time.monotonic() + 120
    attempts = 0
    while time.monotonic() < deadline:
        attempts += 1
        response = httpx.post(f"{run.url}{path}", json=body, timeout=60)
        assert response.status_code == 200, response.text
        answers.setdefault(response.headers[WORKER_HEADER], response.json())
        if len(answers) == 2:
            return answers
        time.sleep(0.1)
    raise AssertionError(f"only worker(s) {sorted(answers)} answered {path} in {attempts} tries")


def test_two_workers_answer_from_one_engine_core_per_model(
    scripted_root: Path, tmp_path: Path
) -> None:
    chat = scripted_model("llama3", scripted_root)
    embedder = str(build_embedding_model(scripted_root))
    before = shm_entries()
    with launched(
        tmp_path, "--workers", "2", "--model", chat.path, "--embedding-model", embedder
    ) as run:
        workers = run.named("import worker_main")
        cores = [p for p in run.look() if p.name().startswith("VLLM::EngineCore")]
        assert len(workers) == 2, describe(run.look())
        assert len(cores) == 2, describe(run.look())  # one per model, not one per worker
        # The launcher holds neither torch nor vLLM, and no fork server runs in the group.
        assert _native_libraries(run.child.pid, ("libtorch", "/vllm/")) == []
        assert run.named("forkserver") == [], describe(run.look())
        body = {"model": chat.path, "messages": HELLO}
        for answer in _from_both(run, "/v1/chat/completions", body).values():
            assert answer["choices"][0]["message"]["content"] == chat.scenario.answer
        streamed: dict[str, str] = {}
        for _ in range(40):
            with httpx.stream(
                "POST", f"{run.url}/v1/chat/completions", json={**body, "stream": True}
            ) as response:
                worker = response.headers[WORKER_HEADER]
                text = ""
                for line in response.iter_lines():
                    if line.startswith("data: {"):
                        for choice in json.loads(line[6:])["choices"]:
                            text += choice["delta"].get("content") or ""
            streamed.setdefault(worker, text)
            if len(streamed) == 2:
                break
        assert streamed == {"0": chat.scenario.answer, "1": chat.scenario.answer}
        vectors = _from_both(run, "/v1/embeddings", {"model": embedder, "input": ["a", "b"]})
        assert vectors["0"]["data"] == vectors["1"]["data"]

        # A stream that would run to the end of the context, cancelled after a few chunks: the
        # engine core aborts it (its process goes idle) instead of generating on for nobody.
        long = {**body, "stream": True, "max_tokens": 400, "ignore_eos": True}
        with httpx.stream("POST", f"{run.url}/v1/chat/completions", json=long) as response:
            for number, _ in enumerate(response.iter_lines()):
                if number > 6:
                    break
        time.sleep(1.0)
        busy = [p for c in cores for p in (c, *c.children(recursive=True))]
        spent = sum(sum(p.cpu_times()[:2]) for p in busy)
        time.sleep(2.0)
        assert sum(sum(p.cpu_times()[:2]) for p in busy) - spent < 0.5, "the stream ran on"

        run.child.send_signal(signal.SIGTERM)
        assert run.child.wait(timeout=90) == 0, run.text()
        left, shm_left, _ = wait_gone(list(run.tree.values()), shm_entries() - before, 30)
        assert not left and not shm_left, (describe(left), shm_left)
        assert owner_directories(run.tree) == []


def test_sigterm_lets_a_stream_on_another_worker_finish_before_the_cores_stop(
    scripted_root: Path, tmp_path: Path
) -> None:
    """The worker that started the engine cores owns them (vllm_inline.engine.life.group): on
    SIGTERM its own stop waits until the other worker has drained, so a stream running there
    ends as it would (finish_reason "length"), and then everything stops."""
    chat = scripted_model("llama3", scripted_root)
    before = shm_entries()
    with launched(tmp_path, "--workers", "2", "--model", chat.path) as run:
        (core,) = [p for p in run.look() if p.name().startswith("VLLM::EngineCore")]
        owner = psutil.Process(core.ppid()).environ()["VLLMINLINE_WORKER"]
        long = {
            "model": chat.path,
            "messages": HELLO,
            "stream": True,
            "max_tokens": 300,
            "ignore_eos": True,
        }
        for _ in range(40):
            with httpx.stream(
                "POST", f"{run.url}/v1/chat/completions", json=long, timeout=120
            ) as response:
                if response.headers[WORKER_HEADER] == owner:
                    continue  # landed on the owner: another connection
                lines = response.iter_lines()
                for number, _ in enumerate(lines):
                    if number > 4:
                        break
                run.child.send_signal(signal.SIGTERM)
                rest = [line for line in lines if line]
                break
        else:
            raise AssertionError("no stream landed on the worker that does not own the cores")
        finishes = [
            choice.get("finish_reason")
            for line in rest
            if line.startswith("data: {")
            for choice in json.loads(line[6:])["choices"]
        ]
        assert rest[-1] == "data: [DONE]" and "length" in finishes, rest[-3:]
        assert run.child.wait(timeout=90) == 0, run.text()
        run.assert_stopped_quietly()
        left, shm_left, _ = wait_gone(list(run.tree.values()), shm_entries() - before, 30)
        assert not left and not shm_left, (describe(left), shm_left)


def test_sigkill_in_the_middle_of_a_start_leaves_nothing(
    scripted_root: Path, tmp_path: Path
) -> None:
    chat = scripted_model("llama3", scripted_root)
    with launched(tmp_path, "--workers", "2", "--model", chat.path, healthy=False) as run:
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:  # the workers importing (the launcher imports no vLLM)
            run.look()
            time.sleep(0.1)
        assert len(run.look()) >= 3, run.text()
        run.child.kill()
        left, _, _ = wait_gone(list(run.tree.values()), set(), timeout=10)
        assert not left, (describe(left), run.text())


def test_bad_use_gets_a_clear_error_and_leaves_no_process(tmp_path: Path) -> None:
    with launched(tmp_path, "--workers", "0", healthy=False) as run:
        assert run.child.wait(timeout=60) == 2
        assert "--workers: must be a whole number of worker processes, 1 or more; got '0'" in (
            run.text()
        )
    missing = str(tmp_path / "no-such-model")
    with launched(tmp_path, "--workers", "2", "--model", missing, healthy=False) as run:
        assert run.child.wait(timeout=120) == 1, run.text()
        assert f"Model path {missing!r} does not exist" in run.text()
        run.look()
        left, _, _ = wait_gone(list(run.tree.values()), set(), timeout=30)
        assert not left, describe(left)


def _each_worker(run: Launched, path: str) -> dict[str, Any]:
    """GET ``path`` on new connections until both workers have answered (spread over two
    minutes at most, as :func:`_from_both`); answers by worker."""
    answers: dict[str, Any] = {}
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        response = httpx.get(f"{run.url}{path}", timeout=60)
        assert response.status_code == 200, response.text
        answer = response.json()
        assert answer["worker"] == response.headers[WORKER_HEADER]
        answers.setdefault(answer["worker"], answer)
        if len(answers) == 2:
            return answers
        time.sleep(0.1)
    raise AssertionError(f"only worker(s) {sorted(answers)} answered {path}")


def _metric_sum(text: str, name: str, model: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and f'model_name="{model}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_a_users_app_under_run_works_from_every_worker(scripted_root: Path, tmp_path: Path) -> None:
    """``python -m vllm_inline run --workers 2 module:factory``: streaming with a priority, LoRA
    per request, tool calls, reasoning, structured output, a deadline and reranking from both
    workers on one engine core per model, ``/metrics`` summed over the workers."""
    from test_lora import _SCRIPTS, HELLO, PARIS, write_lm_head_adapter

    from vllm_inline.testing.reranker import build_reranker_model

    chat = scripted_model("llama3", scripted_root)
    tools = scripted_model("chatml_tools", scripted_root)
    thinker = scripted_model("chatml_reasoning", scripted_root)
    reranker = str(build_reranker_model(scripted_root))
    adapters = {
        name: write_lm_head_adapter(Path(chat.path), tmp_path / name, script)
        for name, script in _SCRIPTS.items()
    }
    settings = {
        "chat": chat.path,
        "tools": tools.path,
        "reasoning": thinker.path,
        "reasoning_parser": thinker.scenario.reasoning_parser,
        "reranker": reranker,
        "adapters": adapters,
        "vllm_kwargs": dict(CPU_TEST_ENGINE_KWARGS),
    }
    port = free_port()
    command = [
        sys.executable, "-m", "vllm_inline", "run", "--workers", "2", "--factory",
        "--port", str(port), "worker_app:create_app",
    ]  # fmt: skip
    environment = {**os.environ, "WORKER_APP": json.dumps(settings)}
    log_path = tmp_path / "launcher.log"
    before = shm_entries()
    with log_path.open("w") as log:
        child = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            process_group=0,
            cwd=Path(__file__).parent,
            env=environment,
        )
        run = Launched(child, log_path, f"http://127.0.0.1:{port}")
        try:
            deadline = time.monotonic() + 400
            while not _healthy_route(run):
                run.look()
                assert child.poll() is None, run.text()
                assert time.monotonic() < deadline, "the app did not start\n" + run.text()
                time.sleep(0.5)
            cores = [p for p in run.look() if p.name().startswith("VLLM::EngineCore")]
            assert len(cores) == 4, describe(run.look())  # four models, two workers
            for adapter, text in ((None, chat.scenario.answer), ("paris", PARIS), ("hello", HELLO)):
                path = "/chat" + (f"?adapter={adapter}" if adapter else "")
                for answer in _each_worker(run, path).values():
                    assert answer["text"] == text and answer["chunks"] > 1, answer
            for answer in _each_worker(run, "/tools").values():
                expected = {"name": "get_weather", "args": {"city": "Oslo"}}
                assert answer["tool_calls"] == [expected]
            for answer in _each_worker(run, "/reasoning").values():
                assert answer["reasoning"] == thinker.scenario.reasoning, answer
            for answer in _each_worker(run, "/structured").values():
                assert set(answer["mood"]) == {"mood", "sunny"}, answer
            for answer in _each_worker(run, "/deadline").values():
                assert answer["timed_out"], answer
            ranked = _each_worker(run, "/rerank")
            assert ranked["0"]["ranked"] == ranked["1"]["ranked"]
            served = sum(a["requests"] for a in _each_worker(run, "/stats").values())
            assert served >= 6  # each worker counts its own requests
            metrics = httpx.get(f"{run.url}/metrics", timeout=30).text
            assert _metric_sum(metrics, "vllm:request_success_total", chat.path) == served
            run.child.send_signal(signal.SIGTERM)
            assert run.child.wait(timeout=90) == 0, run.text()
            run.assert_stopped_quietly()
            left, shm_left, _ = wait_gone(list(run.tree.values()), shm_entries() - before, 30)
            assert not left and not shm_left, (describe(left), shm_left)
        finally:
            run.look()
            clean_up(run.tree.values(), shm_entries() - before)
            remove_metrics_files(child.pid)


def _healthy_route(run: Launched) -> bool:
    try:
        return httpx.get(f"{run.url}/stats", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


EXAMPLES = Path(__file__).parents[2] / "examples"


@contextlib.contextmanager
def example(tmp_path: Path, script: str, *arguments: str, end: str) -> Iterator[Launched]:
    """Run an example with ``arguments``; at the end stop it by ``end``: ``sigterm`` (status 0),
    ``kill the launcher`` (SIGKILL: everything gone within 10 s) or ``kill a worker`` (the
    group stops, status 1); nothing may be left either way."""
    port = free_port()
    command = [sys.executable, str(EXAMPLES / script), "--port", str(port), *arguments]
    log_path = tmp_path / f"{script}.log"
    before = shm_entries()
    with log_path.open("w") as log:
        child = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, process_group=0)
        run = Launched(child, log_path, f"http://127.0.0.1:{port}")
        try:
            yield run
            entries, bound = shm_entries() - before, 30.0
            if end == "sigterm":
                run.child.send_signal(signal.SIGTERM)
                assert run.child.wait(timeout=90) == 0, run.text()
            elif end == "kill the launcher":
                run.child.kill()
                bound = 10.0
            else:
                run.named("import worker_main")[0].kill()
                assert run.child.wait(timeout=90) == 1, run.text()
                assert "exited with status -9: stopping the group" in run.text()
            left, shm_left, _ = wait_gone(list(run.tree.values()), entries, bound)
            assert not left and not shm_left, (end, describe(left), shm_left, run.text())
            # No engine files in /tmp either: the workers' owner directories went with them.
            assert owner_directories(run.tree) == [], end
        finally:
            run.look()
            clean_up(run.tree.values(), shm_entries() - before)
            remove_metrics_files(child.pid)


def _wait_for(run: Launched, path: str) -> None:
    deadline = time.monotonic() + 300
    while True:
        run.look()
        assert run.child.poll() is None, run.text()
        assert time.monotonic() < deadline, f"{path} never answered\n" + run.text()
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{run.url}{path}", timeout=5).status_code == 200:
                return
        time.sleep(0.5)


def test_the_openai_server_example_with_two_workers(scripted_root: Path, tmp_path: Path) -> None:
    """Both workers answer the API and the RAG route; SIGKILL to the launcher then leaves no
    process and no segment within 10 s (the workers die with it, the engine cores watch it)."""
    chat = scripted_model("llama3", scripted_root)
    arguments = ("--model", chat.path, "--workers", "2")
    with example(tmp_path, "openai_server.py", *arguments, end="kill the launcher") as run:
        _wait_for(run, "/health")
        cores = [p for p in run.look() if p.name().startswith("VLLM::EngineCore")]
        assert len(cores) == 2, describe(run.look())  # the chat model and the embedder
        assert len(run.named("import worker_main")) == 2
        body = {"model": chat.path, "messages": HELLO}
        for answer in _from_both(run, "/v1/chat/completions", body).values():
            assert answer["choices"][0]["message"]["content"] == chat.scenario.answer
        asked: set[str] = set()
        for _ in range(40):
            response = httpx.get(f"{run.url}/ask", params={"q": "What is it?"}, timeout=60)
            assert response.status_code == 200 and response.json()["sources"], response.text
            asked.add(response.headers[WORKER_HEADER])
            if len(asked) == 2:
                break
        assert asked == {"0", "1"}


def test_the_sse_example_with_two_workers(scripted_root: Path, tmp_path: Path) -> None:
    """Both workers stream; a worker killed then stops the whole group (status 1), nothing
    left running for it (vllm_inline.workers: one dies, all stop)."""
    chat = scripted_model("llama3", scripted_root)
    arguments = ("--model", chat.path, "--workers", "2")
    with example(tmp_path, "fastapi_sse.py", *arguments, end="kill a worker") as run:
        _wait_for(run, "/metrics/")
        cores = [p for p in run.look() if p.name().startswith("VLLM::EngineCore")]
        assert len(cores) == 1, describe(run.look())
        seen: dict[str, str] = {}
        for _ in range(40):
            response = httpx.get(f"{run.url}/chat", params={"q": "Hello"}, timeout=60)
            data = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
            seen.setdefault(response.headers[WORKER_HEADER], "".join(data[:-2]))
            if len(seen) == 2:
                break
        assert seen == {"0": chat.scenario.answer, "1": chat.scenario.answer}


def test_images_from_both_workers(scripted_root: Path, tmp_path: Path) -> None:
    """A vision model served by two workers: each colour gets one answer, the same from both
    workers and on repeats (vLLM's multimodal cache, mirrored between one front end and its
    engine core only, is set up for several front ends), and the two colours differ."""
    from test_images import QUESTION, _data_url, _png

    from vllm_inline.testing import VISION_ENGINE_KWARGS, build_vision_model

    model = str(build_vision_model(scripted_root))
    kwargs = json.dumps(VISION_ENGINE_KWARGS)
    with launched(tmp_path, "--workers", "2", "--model", model, "--vllm-kwargs", kwargs) as run:
        answers: dict[str, set[str]] = {}
        for color in ("red", "blue", "red", "blue"):
            image = {"type": "image_url", "image_url": {"url": _data_url(_png(color))}}
            body = {
                "model": model,
                "messages": [
                    {"role": "user", "content": [image, {"type": "text", "text": QUESTION}]}
                ],
                "max_tokens": 8,
                "temperature": 0,
            }
            for answer in _from_both(run, "/v1/chat/completions", body).values():
                answers.setdefault(color, set()).add(answer["choices"][0]["message"]["content"])
        assert all(len(texts) == 1 for texts in answers.values()), answers
        assert answers["red"] != answers["blue"], answers
        # Stopped as a group stops (the clean-up's SIGKILL would leave its owner directory to
        # the next start's sweep).
        run.child.send_signal(signal.SIGTERM)
        assert run.child.wait(timeout=90) == 0, run.text()
