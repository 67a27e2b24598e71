"""``/v1/responses`` through this tree's route against another commit's, in the same run: the
front end's CPU per stream event and the wall time per request. A BENCHMARK HARNESS, NOT A
TEST.

Each side is a process of its own with vllm-inline imported from its tree (``trees.py``: the
reference checked out in a git worktree), serving ``OpenAIServer`` in-process (httpx's ASGI
transport: no socket, the client's cost equal on both sides) on the test kit's scripted
``long`` model (an answer of ``--tokens`` tokens, ``ignore_eos``) with the SQLite response
store in a file of its own. Paths: ``stream`` (``stream: true``: an event per delta),
``background`` (``background`` with ``stream``: each event written to the store and read back
from it; on this tree only, where it is served), ``whole`` (the JSON answer). Rounds alternate A, B, B, A, ... so that drift on the host falls
on both sides; each round sends ``--requests`` requests, ``--concurrency`` at a time. The CPU
is the side's whole process (our route, vLLM's front end, the store; the engine core is a
process of its own), per request, and for ``stream`` per SSE event too. Prints each side's
medians and the ratio this tree / reference (below 1: cheaper).

    python benchmarks/responses_stream.py --ref 27301af [--rounds 6] [--requests 16]
"""

from __future__ import annotations

import argparse
import asyncio
import pathlib
import statistics
import sys
import tempfile
import time
from typing import Any

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import trees
from children import LineChild, answer_lines, exit_on_sigterm

PATHS = ("stream", "background", "whole")


def child(tree: pathlib.Path, model: str, store: str, tokens: int) -> None:
    """One side: the server on the scripted model, one JSON command per stdin line."""
    trees.use_tree(tree)
    import httpx
    from fastapi import FastAPI

    from vllm_inline.engine import get_engine, start_engines
    from vllm_inline.server import OpenAIServer
    from vllm_inline.testing import CPU_TEST_ENGINE_KWARGS

    engine = get_engine(model, **CPU_TEST_ENGINE_KWARGS)
    start_engines(engine)
    app = FastAPI()
    OpenAIServer(chat={"long": engine}, responses_store=store).install(app)
    body = {"model": "long", "input": "Hello", "max_output_tokens": tokens, "ignore_eos": True}

    async def one(client: httpx.AsyncClient, path: str) -> int:
        if path == "whole":
            answer = await client.post("/v1/responses", json=body, timeout=300)
            assert answer.status_code == 200, answer.text
            return 1
        streamed = {**body, "stream": True, "background": path == "background"}
        async with client.stream("POST", "/v1/responses", json=streamed, timeout=300) as r:
            if r.status_code == 400 and path == "background":
                return 0  # not served by this side
            assert r.status_code == 200
            return sum([line.startswith("data: ") async for line in r.aiter_lines()])

    async def measure(path: str, requests: int, concurrency: int) -> dict[str, float]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://bench") as client:
            gate = asyncio.Semaphore(concurrency)

            async def gated() -> int:
                async with gate:
                    return await one(client, path)

            cpu, wall = time.process_time(), time.perf_counter()
            counts = await asyncio.gather(*(gated() for _ in range(requests)))
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        if not sum(counts):
            return {}
        return {"cpu_ms_per_request": 1000 * cpu / requests,
                "cpu_ms_per_event": 1000 * cpu / sum(counts),
                "wall_ms_per_request": 1000 * wall / requests,
                "events_per_request": sum(counts) / requests}  # fmt: skip

    def handle(cmd: dict[str, Any]) -> dict[str, float]:
        return asyncio.run(measure(cmd["path"], cmd["requests"], cmd["concurrency"]))

    for path in PATHS:  # warm-up
        handle({"path": path, "requests": 4, "concurrency": 2})
    answer_lines(handle)
    engine.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ref", required=True, help="the commit to compare with")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        exit_on_sigterm()
        child(pathlib.Path(args.child[0]), args.child[1], args.child[2], args.tokens)
        return

    from vllm_inline.testing import scripted_model

    sha = trees.git("rev-parse", "--short", args.ref)
    with (
        tempfile.TemporaryDirectory(prefix="vllm-inline-responses-bench-") as tmp,
        trees.worktrees({"this tree": None, args.ref: sha}) as where,
    ):
        model = scripted_model("long", pathlib.Path(tmp) / "models").path
        sides: dict[str, LineChild] = {}
        try:
            for name, tree in where.items():
                store = str(pathlib.Path(tmp) / f"{name.replace(' ', '-')}.sqlite3")
                cmd = [sys.executable, __file__, "--ref", args.ref, "--tokens", str(args.tokens),
                       "--child", str(tree), model, store]  # fmt: skip
                sides[name] = LineChild(cmd, f"the {name} child", own_group=True)
                sides[name].ready()
            results: dict[tuple[str, str], list[dict[str, float]]] = {}
            for k in range(args.rounds):
                order = list(sides) if k % 2 == 0 else list(reversed(sides))
                for path in PATHS:
                    for name in order:
                        cmd = {"path": path, "requests": args.requests,
                               "concurrency": args.concurrency}  # fmt: skip
                        results.setdefault((name, path), []).append(sides[name].ask(cmd))
        finally:
            for side in sides.values():
                side.close()
                side.kill()
    names = list(where)
    print(f"/v1/responses, {args.tokens} tokens, {args.requests} requests "
          f"{args.concurrency} at a time, medians of {args.rounds} rounds")  # fmt: skip
    print(f"{'path':10} {'figure':22} {names[0]:>10} {names[1]:>10} {'ratio':>6}")

    def median(name: str, path: str, figure: str) -> float | None:
        rounds = [r[figure] for r in results[(name, path)] if r]
        return statistics.median(rounds) if rounds else None

    for path in PATHS:
        figures = ["cpu_ms_per_request", "wall_ms_per_request"]
        if path != "whole":  # deltas merge while a consumer lags: the count varies a little
            figures += ["cpu_ms_per_event", "events_per_request"]
        for figure in figures:
            a, b = median(names[0], path, figure), median(names[1], path, figure)
            cells = [f"{v:10.3f}" if v is not None else f"{'n/a':>10}" for v in (a, b)]
            ratio = f"{a / b:6.2f}" if a is not None and b is not None else f"{'':6}"
            print(f"{path:10} {figure:22} {cells[0]} {cells[1]} {ratio}")
    for figure in ("cpu_ms_per_event", "wall_ms_per_request"):
        a, b = median(names[0], "background", figure), median(names[0], "stream", figure)
        if a is not None and b is not None:
            print(f"{names[0]}: background / stream, {figure}: {a / b:.2f}")


if __name__ == "__main__":
    main()
