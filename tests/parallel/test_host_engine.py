"""One engine per host (``keep_alive``, issue 64; engine/host/): processes of the user attach to
engines that outlive them.

Real processes and real engines on scripted models, in a host directory of the module's own
(``VLLMINLINE_HOST_DIR``). Three processes at once get every feature's answer from the host
engines, equal to an in-process engine's; a process SIGKILLed in the middle of a stream has its
request aborted within 5 s while another's goes on; engines stop after their ``keep_alive``
(seconds, 0, -1 and ``engines stop``) leaving nothing; an owner SIGKILLed takes its engine cores
with it and the next process starts afresh; ``serve --workers 2 --keep-alive`` and a Jupyter
kernel restarted share one engine with the test's own process. Everything the module started is
stopped at its end and checked gone (processes, /dev/shm, files).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
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
    held_shm,
    owner_directories,
    process_tree,
    shm_entries,
    wait_gone,
)

from vllm_inline.engine import get_engine, shutdown_all
from vllm_inline.engine.host import directory as files
from vllm_inline.testing import (
    CPU_TEST_ENGINE_KWARGS,
    SCENARIOS,
    VISION_ENGINE_KWARGS,
    build_embedding_model,
    build_reranker_model,
    build_scripted_model,
    build_vision_model,
)

pytestmark = [pytest.mark.parallel, pytest.mark.engine]

APP = Path(__file__).with_name("host_app.py")
BOUND = 10.0
KIT = dict(CPU_TEST_ENGINE_KWARGS)
CHAT_KWARGS = {
    **KIT,
    "max_model_len": 4096,
    "enable_lora": True,
    "max_loras": 2,
    "max_lora_rank": 8,
}
"""The chat engine: LoRA, and room for a stream that runs for seconds (a scripted model emits
its script, then its tail again, with ``ignore_eos``)."""


class Host:
    """The module's host directory and every owner seen in it (cleaned up by pid at the end)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.env = {**os.environ, files.DIRECTORY_VARIABLE: str(directory)}
        self.env.pop(files.KEEP_ALIVE_VARIABLE, None)
        self.seen: dict[int, psutil.Process] = {}
        self.shm_before = shm_entries()
        self.held: set[str] = set()

    def records(self) -> list[files.Record]:
        return files.read_records(str(self.directory))

    def look(self) -> list[files.Record]:
        """The records now, every owner's processes remembered (for the end's clean-up)."""
        records = self.records()
        for record in records:
            with contextlib.suppress(psutil.NoSuchProcess):
                tree = process_tree(record.pid)
                self.seen.update((p.pid, p) for p in tree)
                self.held |= held_shm(tree, shm_entries() - self.shm_before)
        return records

    def record_of(self, model: str, options: dict[str, Any]) -> files.Record:
        key = files.engine_key(model, options)
        record = files.key_of(str(self.directory), key)
        assert record is not None, (model, options, self.records())
        self.look()
        return record

    def cli(self, *arguments: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "vllm_inline", "engines", *arguments],
            capture_output=True, text=True, env=self.env, timeout=600, check=False,
        )  # fmt: skip

    def python(self, code: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True, text=True, env=self.env, timeout=timeout, check=False,
        )  # fmt: skip


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Host]:
    directory = tmp_path_factory.mktemp("host")
    saved = os.environ.get(files.DIRECTORY_VARIABLE)
    os.environ[files.DIRECTORY_VARIABLE] = str(directory)
    host = Host(directory)
    try:
        yield host
    finally:
        shutdown_all()  # the test process's own engines
        owners = [r.pid for r in host.look()]
        stopped = host.cli("stop", "--all")
        left, shm_left, _ = wait_gone(list(host.seen.values()), host.held, 60)
        left_described = describe(left)
        clean_up(host.seen.values(), host.held)
        if saved is None:
            os.environ.pop(files.DIRECTORY_VARIABLE, None)
        else:
            os.environ[files.DIRECTORY_VARIABLE] = saved
        assert not left and not shm_left, (stopped.stdout, left_described, shm_left)
        assert owner_directories(owners) == []
        assert sorted(os.listdir(directory)) == ["key"], os.listdir(directory)


@pytest.fixture(scope="module")
def spec(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from test_lora import _SCRIPTS, write_lm_head_adapter

    root = tmp_path_factory.mktemp("models")
    chat = build_scripted_model("llama3", root)
    return {
        "chat": str(chat),
        "adapters": {
            name: str(write_lm_head_adapter(chat, root / name, script))
            for name, script in _SCRIPTS.items()
        },
        "tools": str(build_scripted_model("chatml_tools", root)),
        "reasoning": str(build_scripted_model("chatml_reasoning", root)),
        "demo": str(build_scripted_model("demo", root)),
        "vision": str(build_vision_model(root)),
        "embedder": str(build_embedding_model(root)),
        "reranker": str(build_reranker_model(root)),
        "kwargs": KIT,
        "lora_kwargs": CHAT_KWARGS,
        "vision_kwargs": dict(VISION_ENGINE_KWARGS),
        "keep_alive": "-1",
    }


def in_process_answers(spec: dict[str, Any]) -> dict[str, Any]:
    """What engines in this process answer (no keep_alive): the reference."""
    from test_lora import HELLO, PARIS

    assert files.KEEP_ALIVE_VARIABLE not in os.environ
    vision = get_engine(spec["vision"], **spec["vision_kwargs"])
    embedder = get_engine(spec["embedder"], runner="pooling", **spec["kwargs"])
    reranker = get_engine(spec["reranker"], runner="pooling", **spec["kwargs"])
    from vllm_inline.engine import start_engines

    start_engines(vision, embedder, reranker, max_concurrent=2)
    sys.path.insert(0, str(APP.parent))
    image_chat = _image_chat()
    reference = {
        "chat": SCENARIOS["llama3"].answer,
        "lora": {"paris": PARIS, "hello": HELLO},
        "tools": [{"name": "get_weather", "args": {"city": "Oslo"}}],
        "reasoning": {  # ChatVLLM's content keeps what follows </think>, "\n\n" included
            "reasoning": SCENARIOS["chatml_reasoning"].reasoning,
            "content": SCENARIOS["chatml_reasoning"].answer.partition("</think>")[2],
        },
        "image": [
            i for d in vision.stream(image_chat, max_tokens=8, temperature=0) for i in d.token_ids
        ],
        "embeddings": embedder.embed(["Oslo is cold.", "Bananas are yellow."]),
        "scores": reranker.score("How cold is Oslo?", ["Oslo is cold.", "Bananas are yellow."]),
    }
    shutdown_all()
    return reference


def _image_chat() -> list[dict[str, Any]]:
    import base64
    import io

    from PIL import Image

    png = io.BytesIO()
    Image.new("RGB", (64, 64), "red").save(png, "PNG")
    url = "data:image/png;base64," + base64.b64encode(png.getvalue()).decode()
    return [
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": url}},
                {"type": "text", "text": "What is in this image?"},
            ],
        }
    ]


def run_apps(host: Host, spec: dict[str, Any], count: int, hold: bool = False) -> list[Any]:
    return [
        subprocess.Popen(
            [sys.executable, str(APP), json.dumps({**spec, "hold": hold})],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=host.env,
        )
        for _ in range(count)
    ]


def result_of(output: str) -> dict[str, Any]:
    line = next(line for line in output.splitlines() if line.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :])  # type: ignore[no-any-return]


def test_three_processes_at_once_get_the_answers_of_an_in_process_engine(
    host: Host, spec: dict[str, Any]
) -> None:
    reference = in_process_answers(spec)
    apps = run_apps(host, spec, 3)
    try:
        outputs = [app.communicate(timeout=900) for app in apps]
    finally:
        for app in apps:
            app.kill()
    records = host.look()
    for app, (stdout, stderr) in zip(apps, outputs):
        assert app.returncode == 0, stderr[-3000:]
        got = result_of(stdout)
        assert got["chat"]["text"] == reference["chat"] and got["chat"]["chunks"] > 1
        assert got["llama_index"] == reference["chat"]
        assert got["lora"] == reference["lora"]
        assert got["tools"] == reference["tools"]
        assert got["reasoning"] == reference["reasoning"]
        assert got["image"] == reference["image"]
        assert len(got["embeddings"]) == len(reference["embeddings"])
        for vector, expected in zip(got["embeddings"], reference["embeddings"]):
            assert vector == pytest.approx(expected, rel=1e-4, abs=1e-5)
        assert got["scores"] == pytest.approx(reference["scores"], rel=1e-4, abs=1e-5)
    # One engine per model and options, whoever came first: the same owners for all three.
    assert len({tuple(result_of(out)["owners"]) for out, _ in outputs}) == 1
    assert len(records) == 6, [(r.model, r.options) for r in records]
    cores = [
        p for r in records for p in alive(process_tree(r.pid)) if p.name() == "VLLM::EngineCore"
    ]
    assert len(cores) == 6, describe(cores)  # one copy of each model's weights on the host


def test_a_process_without_the_key_is_turned_away_and_the_latest_keep_alive_wins(
    host: Host, spec: dict[str, Any]
) -> None:
    import socket

    from vllm_inline.engine.host import wire
    from vllm_inline.engine.host.status import versions

    record = host.record_of(spec["chat"], CHAT_KWARGS)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(30)
        sock.connect(str(host.directory / f"{record.key}.sock"))
        assert set(wire.read_json_blocking(sock)) == {"challenge"}
        hello = {"pid": os.getpid(), "versions": versions(), "proof": "00" * 32}
        sock.sendall(wire.frame_json(hello))
        assert sock.recv(1) == b""  # closed: nothing was answered, nothing unpickled
    engine = get_engine(spec["chat"], keep_alive="-1", **CHAT_KWARGS).start()
    assert engine.host_status()["keep_alive"] == float("inf")
    assert get_engine(spec["chat"], keep_alive="7m", **CHAT_KWARGS) is engine  # asked again
    assert engine.host_status()["keep_alive"] == 420.0
    assert host.record_of(spec["chat"], CHAT_KWARGS).keep_alive == 420.0
    engine.set_keep_alive(-1)  # the module's later tests want it until stopped
    assert engine.host_status()["keep_alive"] == float("inf")
    engine.shutdown()


def _unfinished(engine: Any, want: int, within: float) -> float:
    began = time.monotonic()
    while engine.num_unfinished_requests() != want:
        assert time.monotonic() - began < within, (engine.num_unfinished_requests(), want)
        time.sleep(0.05)
    return time.monotonic() - began


def test_a_killed_process_has_only_its_own_requests_aborted(
    host: Host, spec: dict[str, Any]
) -> None:
    """Two processes stream long answers; one is SIGKILLed: its request leaves the engine within
    5 s, the other's streams on. A stream this process leaves by ``break`` is aborted too."""
    observer = get_engine(spec["chat"], keep_alive="-1", **CHAT_KWARGS).start()
    assert observer.num_unfinished_requests() == 0
    first, second = run_apps(host, spec, 2, hold=True)
    try:
        for app in (first, second):
            assert app.stdout is not None
            for line in app.stdout:
                if line.startswith("STREAMING"):
                    break
            else:
                raise AssertionError(app.communicate()[1][-3000:])
        _unfinished(observer, 2, BOUND)
        first.kill()
        took = _unfinished(observer, 1, 5.0)
        print(f"the killed process's request left the engine in {took:.2f} s")
        assert second.stdout is not None and second.stdout.readline().startswith("STREAMING")
        assert second.poll() is None
        stream = observer.stream(
            [{"role": "user", "content": "Hi"}], max_tokens=3000, ignore_eos=True
        )
        next(stream)
        _unfinished(observer, 2, BOUND)
        stream.close()  # leaving a stream early
        _unfinished(observer, 1, 5.0)
    finally:
        for app in (first, second):
            app.kill()
            app.communicate()
    _unfinished(observer, 0, 5.0)
    observer.shutdown()


LIFE = textwrap.dedent(
    """
    import json, sys
    from vllm_inline.integrations.langchain import ChatVLLM

    chat = ChatVLLM(model=sys.argv[1], vllm_kwargs=json.loads(sys.argv[2]), keep_alive=sys.argv[3])
    print(chat.invoke("Hi").content, chat.engine.host_status()["pid"])
    """
)


def _answer(
    host: Host, model: str, options: dict[str, Any], keep_alive: str, scenario: str = "llama3"
) -> int:
    """Run a process that answers through the host engine; the engine's pid."""
    done = subprocess.run(
        [sys.executable, "-c", LIFE, model, json.dumps(options), keep_alive],
        capture_output=True, text=True, env=host.env, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    text, pid = done.stdout.rsplit(maxsplit=1)
    assert text == SCENARIOS[scenario].answer
    return int(pid)


def _gone(host: Host, record: files.Record, within: float) -> float:
    tree = [p for p in host.seen.values() if p.pid == record.pid or _below(p, record.pid)]
    left, shm_left, waited = wait_gone(tree, host.held, within)
    assert not left and not shm_left, (describe(left), shm_left)
    assert files.key_of(str(host.directory), record.key) is None
    assert not any(n.startswith(record.key) for n in os.listdir(host.directory))
    assert owner_directories([record.pid]) == []
    return waited


def _below(process: psutil.Process, pid: int) -> bool:
    with contextlib.suppress(psutil.NoSuchProcess):
        return any(parent.pid == pid for parent in process.parents())
    return False


@pytest.mark.parametrize(("keep_alive", "seed"), [("3s", 3), ("0", 4)])
def test_the_engine_stays_keep_alive_after_the_last_process_then_leaves_nothing(
    host: Host, spec: dict[str, Any], keep_alive: str, seed: int
) -> None:
    options = {**KIT, "seed": seed}  # an engine of this test's own
    engine = get_engine(spec["chat"], keep_alive=keep_alive, **options).start()
    pid = _answer(host, spec["chat"], options, keep_alive)  # another process on it
    record = host.record_of(spec["chat"], options)
    assert record.pid == pid
    engine.shutdown()  # the last process detaches
    ended = time.monotonic()
    if keep_alive != "0":
        listed = host.cli()
        assert listed.returncode == 0, listed.stderr
        assert str(pid) in listed.stdout and "more (keep_alive 3s)" in listed.stdout
    waited = _gone(host, record, files.parse_keep_alive(keep_alive) + BOUND)
    print(f"keep_alive {keep_alive}: gone {time.monotonic() - ended:.1f} s after the last process")
    assert waited >= 0


def test_keep_alive_minus_one_stays_until_stopped_and_a_killed_owner_is_replaced(
    host: Host, spec: dict[str, Any]
) -> None:
    """``engines start`` loads it ahead of time; it stays; its owner SIGKILLed takes the engine
    cores with it within 10 s; the next process sweeps the record and starts a new one;
    ``engines stop MODEL`` stops that."""
    options = {**KIT, "seed": 5}
    model = spec["demo"]  # a model of this test's own: `engines stop MODEL` stops only it
    started = host.cli("start", "--model", model, "--keep-alive", "-1",
                       "--vllm-kwargs", json.dumps(options))  # fmt: skip
    assert started.returncode == 0, started.stderr[-3000:]
    record = host.record_of(model, options)
    listed = host.cli()
    assert "until stopped (keep_alive -1)" in listed.stdout, listed.stdout
    assert _answer(host, model, options, "-1", "demo") == record.pid  # attached, not started
    tree = process_tree(record.pid)
    assert any(p.name() == "VLLM::EngineCore" for p in tree), describe(tree)
    os.kill(record.pid, signal.SIGKILL)
    left, shm_left, waited = wait_gone(tree, host.held, BOUND)
    assert not left and not shm_left, (describe(left), shm_left)
    print(f"the killed owner's engine processes were gone in {waited:.1f} s")
    assert "gone" in host.cli().stdout  # its record stays until the next process asks
    new_pid = _answer(host, model, options, "-1", "demo")
    assert new_pid != record.pid
    new = host.record_of(model, options)
    stopped = host.cli("stop", model)
    assert stopped.returncode == 0 and f"pid {new_pid}" in stopped.stdout, stopped.stdout
    _gone(host, new, BOUND)


def test_serve_workers_and_this_process_share_one_engine(host: Host, spec: dict[str, Any]) -> None:
    """``serve --workers 2 --keep-alive -1`` on the model: both workers attach to the engine
    this process attaches to too; one engine core for all."""
    port = free_port()
    command = [
        sys.executable, "-m", "vllm_inline", "serve", "--model", spec["chat"], "--port", str(port),
        "--vllm-kwargs", json.dumps(CHAT_KWARGS), "--workers", "2", "--keep-alive", "-1",
        "--responses-store", str(host.directory.parent / "responses.sqlite3"),
    ]  # fmt: skip
    server = subprocess.Popen(command, env=host.env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)  # fmt: skip
    workers: list[psutil.Process] = []
    try:
        body = {"model": spec["chat"], "messages": [{"role": "user", "content": "Hi"}]}
        deadline = time.monotonic() + 600
        answer = None
        while answer is None:
            assert server.poll() is None and time.monotonic() < deadline
            with contextlib.suppress(httpx.HTTPError):
                r = httpx.post(
                    f"http://127.0.0.1:{port}/v1/chat/completions", json=body, timeout=60
                )
                answer = r.json()["choices"][0]["message"]["content"]
            time.sleep(0.5)
        assert answer == SCENARIOS["llama3"].answer
        engine = get_engine(spec["chat"], keep_alive="-1", **CHAT_KWARGS)
        assert "".join(d.text for d in engine.stream(body["messages"])) == answer
        workers = [
            p for p in process_tree(server.pid)[1:] if "worker_main" in " ".join(p.cmdline())
        ]
        status = engine.host_status()
        assert set(status["attached"]) >= {p.pid for p in workers} | {os.getpid()}, status
        cores = [p for p in process_tree(status["pid"]) if p.name() == "VLLM::EngineCore"]
        assert len(cores) == 1, describe(cores)
        assert not [p for p in process_tree(server.pid) if p.name() == "VLLM::EngineCore"]
        engine.shutdown()
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=60)
        finally:
            clean_up(process_tree(server.pid) if server.poll() is None else [], ())
    assert server.returncode == 0


KERNEL_CODE = """
import sys
from vllm_inline.integrations.langchain import ChatVLLM
chat = ChatVLLM(model={model!r}, vllm_kwargs={kwargs!r})
print("ANSWER", chat.invoke("Hi").content, "|", chat.engine.host_status()["pid"], "vllm" in sys.modules)
"""


def test_a_restarted_jupyter_kernel_attaches_to_the_same_engine(
    host: Host, spec: dict[str, Any], tmp_path: Path
) -> None:
    """A kernel with ``VLLMINLINE_KEEP_ALIVE`` set (as a notebook's environment sets it) answers
    from the host engine; Jupyter's restart SIGKILLs the kernel's process group; the new
    kernel answers from the same engine, having imported no vLLM."""
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager

    kernels = tmp_path / "kernels" / "vllm-inline-host"
    kernels.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (kernels / "kernel.json").write_text(
        json.dumps({"argv": argv, "display_name": "host", "language": "python"})
    )
    km = KernelManager(
        kernel_name=kernels.name,
        kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(kernels.parent)]),
    )
    env = {**host.env, files.KEEP_ALIVE_VARIABLE: "-1"}
    code = KERNEL_CODE.format(model=spec["chat"], kwargs=CHAT_KWARGS)
    answers = []
    with open(tmp_path / "kernel.log", "w") as log:
        km.start_kernel(cwd=str(tmp_path), stdout=log, stderr=log, env=env)
        try:
            for restart in (False, True):
                if restart:
                    km.restart_kernel(now=True)
                kc = km.client()
                kc.start_channels()
                try:
                    kc.wait_for_ready(timeout=60)
                    out: list[str] = []
                    keep = _keeper(out)
                    reply = kc.execute_interactive(code, timeout=600, output_hook=keep)
                    assert reply["content"]["status"] == "ok", "".join(out)
                    answers.append("".join(out).split("ANSWER ", 1)[1].split("\n")[0])
                finally:
                    kc.stop_channels()
        finally:
            km.shutdown_kernel(now=True)
    first, second = (a.rsplit(" | ", 1) for a in answers)
    assert first[0] == second[0] == SCENARIOS["llama3"].answer
    assert first[1] == second[1] and first[1].endswith("False"), answers  # same pid, no vLLM


def _keeper(out: list[str]) -> Any:
    def keep(message: dict[str, Any]) -> None:
        out.append(message["content"].get("text", ""))

    return keep


def test_a_start_that_fails_raises_its_error_in_the_process_that_asked(
    host: Host, spec: dict[str, Any]
) -> None:
    """The host engine's start error (here vLLM's refusal of an option) is raised where the
    engine was asked for, with its type and message; the host process then ends and removes
    its files; the next process gets the same error from a new start."""
    from vllm_inline.engine import ModelLoadError

    options = {**KIT, "not_an_engine_option": 1}
    for _ in range(2):
        engine = get_engine(spec["chat"], keep_alive="10m", **options)
        with pytest.raises(ModelLoadError, match="not_an_engine_option"):
            engine.start()
    deadline = time.monotonic() + BOUND
    key = files.engine_key(spec["chat"], options)
    while any(n.startswith(key) for n in os.listdir(host.directory)):
        assert time.monotonic() < deadline, os.listdir(host.directory)
        time.sleep(0.1)
