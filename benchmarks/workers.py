"""Two worker processes on one engine (``python -m vllm_inline run --workers 2``) against two
workers with an engine each (``uvicorn --workers 2``, as before) and against ``vllm serve
--api-server-count 2`` with two app workers on ``ChatOpenAI``. A BENCHMARK HARNESS, NOT A TEST.

Every side runs ``benchmarks/workers_app.py`` on the same scripted model and engine options.

**Part 1, a real engine** (the tiny scripted model on these CPUs): memory (PSS of every process
of the side), time to ready (launch to both workers answering), first-token latency at c=1
over HTTP (SSE, a new connection per request). "one" is the app in one process (one engine and
one front end): the reference for the memory target (two workers within 1.1x of one engine
plus the front ends: the one-process app plus one more worker's own PSS).

**Part 2, GPU rates: a SIMULATION** (``benchmarks/simulated_step``): the engine core's model
step takes a fixed cadence of ``step`` seconds and none of these CPUs, the rest is real
(scheduler, ZMQ, output processing, detokenizer, parsers, frameworks). ``streams`` streams of
``tokens`` tokens run inside the workers (``/load``, one request per worker, ``streams /
workers`` streams each), through ``ChatVLLM.astream``, LlamaIndex's
``VLLM.astream_chat`` or, on the vllm serve side, ``ChatOpenAI.astream``. Offered rate: streams
/ step tokens/s. A side sustains it if it delivers >= 95 % of it with lag p99 <= 50 ms (a
token's lag: how late it arrived against the cadence, from its stream's first token).

    python benchmarks/workers.py [--part 1|2|all] [--steps 0.04,0.02,0.01] [--streams 128]
                                 [--tokens 200] [--out benchmarks/results/workers.json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import httpx
import psutil
from measure import percentile
from report import aligned, machine, now_utc, versions, write_json
from servers import USER_ENV, cli_flags, free_port, stop_server

from vllm_inline.testing import CPU_TEST_ENGINE_KWARGS, build_scripted_model

SIDES_1 = ("one", "ours", "own engines", "vllm serve")
SIDES_2 = ("ours 1 worker", "ours", "vllm serve")
LAG_BUDGET_S, DELIVERY_FLOOR = 0.050, 0.95


@contextlib.contextmanager
def side(
    name: str, model: str, workers: int, step: float | None, log: pathlib.Path
) -> Iterator[str]:
    """Start side ``name``; yields its URL; stops every process of it (by pid) at the end."""
    port, env = free_port(), {**USER_ENV, "PYTHONUNBUFFERED": "1"}
    kwargs = dict(CPU_TEST_ENGINE_KWARGS)
    if step is not None:
        env["PYTHONPATH"] = os.pathsep.join(
            [str(HERE / "simulated_step"), env.get("PYTHONPATH", "")]
        )
        env["VLLMINLINE_SIMULATED_STEP"] = str(step)
        # Room for every stream at once: 128 MiB of KV cache holds ~48 of 64 streams of 150
        # tokens, and the scheduler then runs only those (the rate would be the cache's).
        kwargs.update(max_num_seqs=512, kv_cache_memory_bytes=2 * 2**30)
    settings: dict[str, Any] = {"mode": "inline", "model": model, "vllm_kwargs": kwargs}
    procs: list[subprocess.Popen[bytes]] = []
    app = ["workers_app:app", "--port", str(port)]
    with log.open("ab") as out:
        if name == "vllm serve":
            vport = free_port()
            server_log = log.with_suffix(".vllm.log")
            extra = ["--api-server-count", str(workers)]
            procs.append(_serve(model, vport, kwargs, server_log, extra, env))
            settings = {
                "mode": "openai",
                "model": model,
                "base_url": f"http://127.0.0.1:{vport}/v1",
            }
        env["WORKERS_BENCH"] = json.dumps(settings)
        if name in ("ours", "ours 1 worker"):
            cmd = [sys.executable, "-m", "vllm_inline", "run", "--workers", str(workers), *app]
        else:
            cmd = [sys.executable, "-m", "uvicorn", *app, "--workers", str(workers)]
        procs.append(
            subprocess.Popen(cmd, cwd=HERE, env=env, stdout=out, stderr=out, process_group=0)
        )
    tree: dict[int, psutil.Process] = {}
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        for proc in procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                tree.update(
                    {
                        p.pid: p
                        for p in [
                            psutil.Process(proc.pid),
                            *psutil.Process(proc.pid).children(True),
                        ]
                    }
                )
        for proc in reversed(procs):
            stop_server(proc)
        _, alive = psutil.wait_procs(list(tree.values()), timeout=30)
        for p in alive:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()


def _serve(
    model: str,
    port: int,
    kwargs: dict[str, Any],
    log: pathlib.Path,
    extra: list[str],
    env: dict[str, str],
) -> subprocess.Popen[bytes]:
    # vLLM's own `serve` (benchmarks/vllm_serve.py): `python -m vllm.entrypoints.openai.api_server`
    # runs one API server whatever --api-server-count says (runs before 2026-12-05 did so).
    cmd = [sys.executable, str(HERE / "vllm_serve.py"), model, "--host", "127.0.0.1", "--port",
           str(port), *cli_flags(kwargs), *extra]  # fmt: skip
    # vLLM leaves its IPC socket files behind (docs/deployment.md): in the run's own directory.
    sockets = log.parent / "vllm-serve-sockets"
    sockets.mkdir(exist_ok=True)
    with log.open("wb") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, process_group=0,
                                env={**env, "VLLM_LOGGING_LEVEL": "WARNING",
                                     "VLLM_RPC_BASE_PATH": str(sockets)})  # fmt: skip


def wait_ready(url: str, workers: int, started: float, timeout: float = 400) -> float:
    """Seconds from ``started`` until ``workers`` distinct workers have answered a chat."""
    seen: set[int] = set()
    while len(seen) < workers:
        if time.monotonic() - started > timeout:
            raise TimeoutError(f"{url}: {len(seen)} of {workers} workers ready")
        try:
            r = httpx.get(f"{url}/chat", params={"max_tokens": 1}, timeout=30)
            if r.status_code == 200:
                seen.add(httpx.get(f"{url}/ready", timeout=5).json()["pid"])
                continue
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    return time.monotonic() - started


def pss_mib(roots: list[int]) -> tuple[float, dict[str, float]]:
    """PSS of every process below ``roots``, in all and by kind of process."""
    kinds: dict[str, float] = {}
    for pid in roots:
        root = psutil.Process(pid)
        for p in [root, *root.children(recursive=True)]:
            with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                kind = _kind(" ".join(p.cmdline()))
                kinds[kind] = kinds.get(kind, 0.0) + p.memory_full_info().pss / 2**20
    return sum(kinds.values()), kinds


def _kind(line: str) -> str:
    for needle, kind in (
        ("VLLM::EngineCore", "engine core"), ("VLLM::Worker", "model worker"),
        ("worker_main", "app worker"), ("forkserver", "fork server"),
        ("resource_tracker", "resource tracker"), ("vllm_inline run", "launcher"),
        ("VLLM::APIServer", "vllm serve API server"), ("vllm_serve.py", "vllm serve"),
        ("api_server", "vllm serve"), ("spawn_main", "spawned (uvicorn worker or API server)"),
        ("uvicorn", "uvicorn parent"),
    ):  # fmt: skip
        if needle in line:
            return kind
    return line[:40]


def first_tokens(url: str, requests: int) -> list[float]:
    out = []
    for _ in range(requests):
        start = time.monotonic()
        with httpx.stream("GET", f"{url}/chat", params={"max_tokens": 16}, timeout=60) as r:
            first = None
            for line in r.iter_lines():
                if first is None and line.startswith("data: ") and line != "data: [DONE]":
                    first = time.monotonic() - start
            assert first is not None, "no token"
            out.append(first)
    return out


def part1(
    model: str, logs: pathlib.Path, requests: int, count: int, sides: tuple[str, ...] = SIDES_1
) -> dict[str, Any]:
    results = {}
    for name in sides:
        workers = 1 if name == "one" else count
        started = time.monotonic()
        log = logs / f"part1-{name.replace(' ', '-')}.log"
        with side(name, model, workers, None, log) as url:
            ready = wait_ready(url, workers, started)
            first_tokens(url, 4)  # warm
            roots = [
                p.pid for p in psutil.Process().children() if p.status() != psutil.STATUS_ZOMBIE
            ]
            memory, kinds = pss_mib(roots)
            per_worker = _worker_pss(roots)
            ttft = first_tokens(url, requests)
        results[name] = {"ready_s": ready, "pss_mib": memory, "worker_pss_mib": per_worker, "pss_by_kind": kinds,
                         "ttft_p50_ms": 1000 * percentile(ttft, 50), "ttft_p90_ms": 1000 * percentile(ttft, 90)}  # fmt: skip
        print(f"  {name}: {results[name]}", flush=True)
    return results


def _worker_pss(roots: list[int]) -> float:
    """PSS of one vllm-inline worker (the smallest), ``nan`` on the other sides."""
    sizes = []
    for pid in roots:
        for p in psutil.Process(pid).children(recursive=True):
            with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                if "worker_main" in " ".join(p.cmdline()):
                    sizes.append(p.memory_full_info().pss / 2**20)
    return min(sizes) if sizes else float("nan")


async def _load(
    url: str, workers: int, streams: int, tokens: int, step: float, path: str
) -> list[dict[str, Any]]:
    """One ``/load`` of ``streams / workers`` streams per worker, each over a connection that
    lands on its worker (a burst of new connections goes to whichever worker accepts first)."""
    clients = await _one_client_per_worker(url, workers)
    params = {"streams": streams // workers, "tokens": tokens, "step": step, "path": path}
    try:
        answers = await asyncio.gather(*(c.get(f"{url}/load", params=params) for c in clients))
    finally:
        for client in clients:
            await client.aclose()
    for answer in answers:
        answer.raise_for_status()
    return [a.json() for a in answers]


async def _one_client_per_worker(url: str, workers: int) -> list[httpx.AsyncClient]:
    pinned: dict[int, httpx.AsyncClient] = {}
    for _ in range(200):
        client = httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=1))
        pid = (await client.get(f"{url}/ready")).json()["pid"]
        if pid in pinned:
            await client.aclose()
        else:
            pinned[pid] = client
        if len(pinned) == workers:
            return list(pinned.values())
    raise RuntimeError(f"{url}: found {len(pinned)} of {workers} workers")


def part2(
    model: str, logs: pathlib.Path, steps: list[float], streams: int, tokens: int, sides: list[str]
) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for name in sides:
        workers = 1 if name == "ours 1 worker" else 2
        paths = (
            ["ChatOpenAI.astream"]
            if name == "vllm serve"
            else ["ChatVLLM.astream", "VLLM.astream_chat"]
        )
        for step in steps:
            log = logs / f"part2-{name.replace(' ', '-')}-{step}.log"
            started = time.monotonic()
            with side(name, model, workers, step, log) as url:
                wait_ready(url, workers, started)
                for path in paths:
                    asyncio.run(_load(url, workers, 16, 20, step, path))  # warm
                    answers = asyncio.run(_load(url, workers, streams, tokens, step, path))
                    lags = sorted(lag for a in answers for lag in a["lags"])
                    delivered = sum(a["delivered"] for a in answers)
                    wall = max(a["wall"] for a in answers)
                    offered = streams / step
                    row = {"offered": offered, "delivered_tok_s": delivered / wall,
                           "lag_p50_ms": 1000 * percentile(lags, 50), "lag_p99_ms": 1000 * percentile(lags, 99),
                           "cpu_us_per_token": 1e6 * sum(a["cpu"] for a in answers) / max(delivered, 1),
                           "requests_by_worker": _count(a["pid"] for a in answers)}  # fmt: skip
                    row["sustained"] = (row["delivered_tok_s"] >= DELIVERY_FLOOR * offered
                                        and row["lag_p99_ms"] <= 1000 * LAG_BUDGET_S)  # fmt: skip
                    results.setdefault(f"{name} | {path}", {})[str(step)] = row
                    print(f"  {name} {path} step {step}: {row}", flush=True)
    return results


def _count(pids: Any) -> list[int]:
    counts: dict[int, int] = {}
    for pid in pids:
        counts[pid] = counts.get(pid, 0) + 1
    return sorted(counts.values(), reverse=True)


def report(data: dict[str, Any]) -> str:
    lines = []
    one = data.get("part1")
    if one:
        rows = [["side", "ready s", "PSS MiB", "first token p50 ms", "p90 ms"]]
        for name, r in one.items():
            rows.append(
                [
                    name,
                    f"{r['ready_s']:.1f}",
                    f"{r['pss_mib']:.0f}",
                    f"{r['ttft_p50_ms']:.1f}",
                    f"{r['ttft_p90_ms']:.1f}",
                ]
            )
        lines.append(aligned(rows))
        if "one" in one and "ours" in one:
            workers = data.get("args", {}).get("workers", 2)
            budget = one["one"]["pss_mib"] + (workers - 1) * one["ours"]["worker_pss_mib"]
            lines.append(
                f"ours / (one engine + its front ends): {one['ours']['pss_mib'] / budget:.2f}x (target <= 1.1x)"
            )
        for other in ("own engines", "vllm serve"):
            if other not in one or "ours" not in one:
                continue
            o = one[other]
            lines.append(
                f"ours / {other}: memory {one['ours']['pss_mib'] / o['pss_mib']:.2f}x, ready {one['ours']['ready_s'] / o['ready_s']:.2f}x, first token {one['ours']['ttft_p50_ms'] / o['ttft_p50_ms']:.2f}x"
            )
    two = data.get("part2")
    if two:
        lines.append("GPU rates, SIMULATED model step (benchmarks/simulated_step):")
        rows = [
            [
                "side | path",
                "offered tok/s",
                "delivered",
                "lag p50 ms",
                "p99 ms",
                "CPU us/tok",
                "sustained",
            ]
        ]
        for key, by_step in two.items():
            for r in by_step.values():
                rows.append(
                    [
                        key,
                        f"{r['offered']:.0f}",
                        f"{r['delivered_tok_s']:.0f}",
                        f"{r['lag_p50_ms']:.1f}",
                        f"{r['lag_p99_ms']:.1f}",
                        f"{r['cpu_us_per_token']:.0f}",
                        "yes" if r["sustained"] else "no",
                    ]
                )
        lines.append(aligned(rows))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--part", choices=["1", "2", "all"], default="all")
    parser.add_argument("--steps", default="0.04,0.02,0.01")
    parser.add_argument("--streams", type=int, default=128)
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--requests", type=int, default=30)
    parser.add_argument("--workers", type=int, default=2, help="N of part 1 (default: 2)")
    parser.add_argument("--part1-sides", help=f"part 1's sides (default: {SIDES_1})")
    parser.add_argument("--sides", help=f"part 2's sides, comma-separated (default: {SIDES_2})")
    parser.add_argument("--out", default=str(HERE / "results" / "workers.json"))
    args = parser.parse_args()
    model = str(build_scripted_model("llama3"))
    data: dict[str, Any] = {
        "machine": machine(),
        "date": now_utc(),
        "versions": versions(),
        "args": vars(args),
    }
    with tempfile.TemporaryDirectory(prefix="vllm-inline-workers-bench-") as tmp:
        logs = pathlib.Path(tmp)
        if args.part in ("1", "all"):
            sides_1 = tuple(args.part1_sides.split(",")) if args.part1_sides else SIDES_1
            data["part1"] = part1(model, logs, args.requests, args.workers, sides_1)
        if args.part in ("2", "all"):
            steps = [float(s) for s in args.steps.split(",")]
            sides = args.sides.split(",") if args.sides else list(SIDES_2)
            data["part2"] = part2(model, logs, steps, args.streams, args.tokens, sides)
    write_json(args.out, data)
    print(report(data))


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    main()
