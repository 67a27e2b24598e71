"""``examples/ray_serve_app.py`` on a local Ray instance: one replica of the chain on the CPU.

The module starts Ray on 127.0.0.1 (2 CPUs, a 200 MB object store, no dashboard), deploys one
replica (one engine, the kit's CPU engine options) and talks to it over HTTP through Ray Serve's
proxy: a scripted answer streamed as Server-Sent Events, a stream the client drops mid-way
(the replica's engine then has 0 unfinished requests), the replica killed by Ray (its engine's
processes and shared memory gone, a new replica serving), and a shutdown of Serve and Ray that
leaves none of the processes it started (raylet, GCS, workers, the replica's engine core).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest
import ray
from processes import SHM, Footprint, describe, held_shm, process_tree, shm_entries, wait_gone
from ray import serve

from vllm_inline.testing import CPU_TEST_ENGINE_KWARGS

pytestmark = [pytest.mark.parallel, pytest.mark.engine]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "ray_serve_app.py"


def load_example() -> ModuleType:
    """Import ``examples/ray_serve_app.py``; Ray ships its classes to the replica by value (the
    replica's process cannot import ``examples/``, which is not a package)."""
    spec = importlib.util.spec_from_file_location("example_ray_serve_app", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    ray.cloudpickle.register_pickle_by_value(module)
    return module


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def descendants(pid: int) -> dict[int, str]:
    """Live descendants of ``pid`` (from /proc): pid -> command line."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    found: dict[int, str] = {}
    todo = list(children.get(pid, []))
    while todo:
        child = todo.pop()
        cmdline = alive_cmdline(child)
        if cmdline is not None:
            found[child] = cmdline
        todo.extend(children.get(child, []))
    return found


def alive_cmdline(pid: int) -> str | None:
    """The command line of ``pid``, or None if it has exited (zombies count as exited)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat.rsplit(")", 1)[1].split()[0] in ("Z", "X"):
            return None
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return raw.replace(b"\0", b" ").decode(errors="replace").strip() or stat.split()[1]


def parent_of(pid: int) -> int | None:
    """The parent of ``pid``, or None if it has exited."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except OSError:
        return None


def engine_core_among(processes: dict[int, str], parents: dict[int, int]) -> bool:
    """Whether one of ``processes`` (pid -> command line) is an engine core.

    vLLM retitles an engine core "VLLM::EngineCore", but the title may not have reached
    /proc/<pid>/cmdline when it is read (Serve restarting a replica on a loaded host); until then
    the core has the command line it started with: a spawned child's, or that of the fork server
    it was forked from (``engine/seam/vllm_processes.py``), whose child it is.
    """
    server = "multiprocessing.forkserver import main"
    return any(
        "EngineCore" in cmd
        or "multiprocessing-fork" in cmd
        or (server in cmd and server in processes.get(parents.get(pid, 0), ""))
        for pid, cmd in processes.items()
    )


def events(lines: list[str]) -> list[tuple[str, str]]:
    """SSE lines -> ``(event, data)`` pairs (one space after ``data:`` is dropped)."""
    found, event, data = [], "message", []
    for line in lines:
        if not line:
            if data:
                found.append((event, "\n".join(data)))
            event, data = "message", []
        elif line.startswith("event:"):
            event = line[len("event:") :].strip()
        elif line.startswith("data:"):
            value = line[len("data:") :]
            data.append(value.removeprefix(" "))
    return found


class Cluster:
    """Ray and Serve as this module started them, and the processes they run."""

    def __init__(self, url: str, before: dict[int, str]) -> None:
        self.url = url
        """The Serve proxy's address, ``http://127.0.0.1:<port>``."""
        self.before = before
        """Processes below this one before Ray started (other modules' engines): not Ray's."""
        self.processes: dict[int, str] = {}
        """The processes below this one that Ray started (recorded before shutdown)."""
        self.parents: dict[int, int] = {}
        """The parent of each of :attr:`processes`, recorded with them."""
        self.down = False
        self.shm_before = shm_entries()
        """``/dev/shm`` before Ray started: nothing in it is the cluster's."""

    def shutdown(self) -> None:
        if self.down:
            return
        self.down = True
        now = descendants(os.getpid())
        self.processes = {pid: cmd for pid, cmd in now.items() if pid not in self.before}
        self.parents = {pid: parent for pid in self.processes if (parent := parent_of(pid))}
        try:
            serve.shutdown()
        finally:
            ray.shutdown()


@pytest.fixture(scope="module")
def cluster(scripted: Any) -> Iterator[Cluster]:
    example = load_example()
    path = scripted("demo").path
    port = free_port()
    before = descendants(os.getpid())
    # Ray keeps each session's logs and sockets under /tmp/ray unless told otherwise, and
    # leaves them there: a directory of the module's own, removed with the cluster. Short,
    # because Ray's Unix socket paths inside it must fit in 107 bytes.
    ray_tmp = tempfile.mkdtemp(prefix="ray-")
    ray.init(
        _temp_dir=ray_tmp,
        address="local",
        num_cpus=2,
        object_store_memory=200 * 2**20,
        include_dashboard=False,
        log_to_driver=False,
        _node_ip_address="127.0.0.1",
    )
    cluster = Cluster(f"http://127.0.0.1:{port}", before)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        app = example.build_app(
            path,
            num_replicas=1,
            num_cpus=1,
            chat_options={"vllm_kwargs": dict(CPU_TEST_ENGINE_KWARGS)},
        )
        serve.run(app, name="chain", route_prefix="/")
        yield cluster
    finally:
        try:
            cluster.shutdown()
        finally:
            shutil.rmtree(ray_tmp, ignore_errors=True)


def stats(cluster: Cluster) -> dict[str, Any]:
    response = httpx.get(f"{cluster.url}/stats", timeout=30)
    response.raise_for_status()
    return response.json()


def test_streams_the_scripted_answer_over_http(cluster: Cluster, scripted: Any) -> None:
    answer = scripted("demo").scenario.answer
    with httpx.stream(
        "GET", f"{cluster.url}/chat", params={"q": "What does vllm-inline do?"}, timeout=60
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = list(response.iter_lines())
    found = events(lines)
    texts = [data for event, data in found if event == "message"]
    assert len(texts) > 1
    assert "".join(texts) == answer
    usage = json.loads(next(data for event, data in found if event == "usage"))
    assert usage["finish_reason"] == "stop"
    assert usage["output_tokens"] == len(texts) + 1  # each word, then <|eot_id|>
    assert found[-1] == ("done", "[DONE]")
    after = stats(cluster)
    assert after["num_unfinished_requests"] == 0
    assert after["requests_finished"] >= 1


def test_a_dropped_stream_leaves_no_request_in_the_engine(cluster: Cluster, scripted: Any) -> None:
    answer = scripted("demo").scenario.answer
    before = stats(cluster)
    received = ""
    with httpx.stream("GET", f"{cluster.url}/chat", params={"q": "Hello"}, timeout=60) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data:"):
                received += line[len("data: ") :]
                break  # leaving the block closes the connection mid-stream
    assert received and answer.startswith(received) and received != answer
    deadline = time.monotonic() + 30
    while (now := stats(cluster))["num_unfinished_requests"] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert now["num_unfinished_requests"] == 0
    # vLLM aborted it: the request did not run to the end of its answer (one token per word,
    # then <|eot_id|>), so the cancellation reached the engine through Serve's proxy.
    generated = now["generation_tokens"] - before["generation_tokens"]
    assert 1 <= generated < len(answer.split(" ")) + 1, generated
    # and the replica answers the next request in full
    with httpx.stream("GET", f"{cluster.url}/chat", params={"q": "Again"}, timeout=60) as r:
        texts = [d for e, d in events(list(r.iter_lines())) if e == "message"]
    assert "".join(texts) == answer


def test_a_replica_killed_by_ray_leaves_nothing_and_serve_replaces_it(
    cluster: Cluster, scripted: Any
) -> None:
    """``ray.kill`` on the replica's actor (SIGKILL to its worker process, as Ray kills a replica
    that is stuck, or the OOM killer one over its memory): the replica's engine core and its
    worker are gone within 10 s, and so is every ``/dev/shm`` entry they held; Serve starts a
    new replica, which answers.

    Ray kills a dead worker's process group; the engine's processes and the resource tracker
    lead groups of their own (engine/seam/vllm_boot.py) and stop on their own. One ring buffer per
    replica was still left in ``/dev/shm`` until the engine's processes unlinked their names
    once every reader had attached (engine/seam/vllm_boot.py). Entries left anyway are removed by
    name before the test fails, so a failure leaves nothing either."""
    replica = stats(cluster)["replica"]
    name = next(
        actor["name"]
        for actor in ray.util.list_named_actors(all_namespaces=True)
        if replica in actor["name"]
    )
    handle = ray.get_actor(name, namespace="serve")
    pid = ray.get(handle.__ray_call__.remote(lambda _: os.getpid()))
    entries = shm_entries()  # the replica's engine has created its entries by now
    footprint = Footprint(process_tree(pid), set())
    footprint.shm = held_shm(footprint.processes, entries - cluster.shm_before)
    assert len(footprint.processes) >= 3, footprint.processes  # replica, engine core, worker
    killed = time.monotonic()
    ray.kill(handle, no_restart=False)
    left, shm_left, waited = wait_gone(footprint.processes, footprint.shm, 10.0, killed)
    assert not left, f"still running 10 s after the replica was killed: {describe(left)}"
    late = wait_gone([], shm_left, 40.0, killed)[1] if shm_left else set()  # slow, or never
    for name in late:  # this test's own leftovers, by name (see the docstring)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(SHM, name))
    deadline = time.monotonic() + 240  # Serve notices, starts a replica, its engine starts
    while True:
        try:
            if stats(cluster)["replica"] != replica:
                break
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "Serve did not replace the killed replica"
        time.sleep(1)
    answer = scripted("demo").scenario.answer
    with httpx.stream("GET", f"{cluster.url}/chat", params={"q": "Hi"}, timeout=60) as r:
        assert "".join(d for e, d in events(list(r.iter_lines())) if e == "message") == answer
    assert not shm_left, (
        f"the killed replica's processes were gone in {waited:.1f} s, but {sorted(shm_left)} "
        f"stayed in /dev/shm past 10 s ({sorted(late) or 'all gone'} at 40 s)"
    )


def test_shutdown_leaves_no_process_behind(cluster: Cluster) -> None:
    cluster.shutdown()
    started = cluster.processes
    names = " ".join(started.values())
    # what ran while the replica served: Ray's own processes and the replica's engine core
    assert "raylet" in names and "gcs_server" in names and "ServeReplica" in names, started
    assert engine_core_among(started, cluster.parents), "no engine core among:\n" + "\n".join(
        f"{pid} (parent {cluster.parents.get(pid)}) {cmd[:200]}" for pid, cmd in started.items()
    )
    deadline = time.monotonic() + 60
    while (left := {p: c for p in started if (c := alive_cmdline(p))}) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.5)
    assert not left, f"processes left behind: {left}"
