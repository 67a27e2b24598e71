"""Drive one path under steady load, to profile it from outside (py-spy) or with cProfile.

    python benchmarks/profile_path.py ChatVLLM.astream --concurrency 32 --seconds 20 &
    py-spy record --pid $! --threads --format raw -o /tmp/profile.txt --duration 15

``raw`` drives ``AsyncLLM.generate`` on the engine's own loop (the baseline to compare with).
The engine starts first (~20 s, longer on a busy machine); load starts when "loading" is
printed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time

os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import paths as P
from models import SPECS, build_model
from run import ENGINE_OPTIONS


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("path", choices=["raw", *P.PATHS[1:-1]])
    ap.add_argument("--model", default="tiny", choices=list(SPECS))
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=20)
    args = ap.parse_args()
    spec = SPECS[args.model]
    model = str(build_model(spec))
    from vllm_inline.engine import get_engine

    engine = get_engine(model, **ENGINE_OPTIONS).start()
    runtime = engine.runtime
    tokens = spec.tokens
    kw = P.sampling(tokens)
    makers = {
        "raw": lambda: P.raw_request(runtime.llm, P.prompt_ids(model), tokens),
        "Engine.astream": lambda: P.engine_async(engine, tokens),
        "Engine.stream": lambda: P.engine_sync(engine, tokens),
        "ChatVLLM.astream": lambda: P.langchain_async(
            P.chat_vllm(model, ENGINE_OPTIONS), tokens, **kw
        ),
        "ChatVLLM.stream": lambda: P.langchain_sync(
            P.chat_vllm(model, ENGINE_OPTIONS), tokens, **kw
        ),
        "VLLM.astream_chat": lambda: P.llama_index_async(
            P.llama_index_llm(model, ENGINE_OPTIONS), tokens
        ),
        "VLLM.stream_chat": lambda: P.llama_index_sync(
            P.llama_index_llm(model, ENGINE_OPTIONS), tokens
        ),
    }
    request = makers[args.path]()
    sync = args.path.endswith(("stream", "stream_chat")) and ".a" not in args.path
    print(f"loading: pid {os.getpid()}", flush=True)
    deadline = time.monotonic() + args.seconds
    total = 0
    t0 = time.perf_counter()
    cpu0 = time.process_time()
    while time.monotonic() < deadline:
        if args.path == "raw":
            recs = runtime.loop.submit(P.run_async_load(request, args.concurrency, 1)).result()
        elif sync:
            recs = P.run_sync_load(request, args.concurrency, 1)
        else:
            recs = asyncio.run(P.run_async_load(request, args.concurrency, 1))
        total += sum(r.tokens for r in recs)
    wall = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    print(
        f"{args.path}: {total / wall:.0f} tok/s, client CPU {cpu * 1e6 / total:.0f} us/token",
        flush=True,
    )
    engine.shutdown()


if __name__ == "__main__":
    main()
