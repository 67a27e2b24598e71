"""When the last request of a bulk call reaches vLLM: ``vllm.LLM.chat`` against
``ChatVLLM.abatch`` and LlamaIndex's gather over ``VLLM.achat``, on the same N conversations.

    python benchmarks/bulk_arrival.py              # 64 inputs, 8 runs per path
    python benchmarks/bulk_arrival.py --inputs 256 --runs 5

A small bulk call ends a fixed number of engine steps after its last request joins the engine
(every input generates ``--tokens`` tokens, ``ignore_eos``), so the time from the call's start
to vLLM's ``add_request`` of the last input is a share of the whole call that the engine cannot
win back (docs/performance.md, "Results at the same engine options"). Each path runs in a child
process of its own (an ``LLM`` and an ``AsyncLLM`` in one process would leave one engine's
worker polling), one after the other, on engines with the same options, vLLM's stats on as
vllm-inline's default engine records them. vLLM's own ``add_request`` (``LLMEngine``'s for
``LLM.chat``, ``AsyncLLM``'s for ours) is wrapped to note when it is called; nothing else is
changed. After the warm-up each child freezes its heap and collects before every timed run.
Prints, per path, the median time to the last ``add_request`` and the call's wall time, and
the ratios against ``LLM.chat``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from bulk_paths import conversations, prompts
from models import SPECS, build_model
from paths import sampling
from run import ENGINE_OPTIONS

PATHS = ("vllm.LLM.chat", "ChatVLLM.abatch", "LlamaIndex gather(achat)")
RESULT = "RESULT "


def _llm_chat(model: str, n: int, stamps: list[float], kw: dict[str, Any]) -> Callable[[], Any]:
    from vllm import LLM, SamplingParams
    from vllm.v1.engine.llm_engine import LLMEngine

    add = LLMEngine.add_request

    def noted(self: Any, *args: Any, **kwargs: Any) -> Any:
        stamps.append(time.perf_counter())
        return add(self, *args, **kwargs)

    LLMEngine.add_request = noted  # type: ignore[method-assign]
    llm = LLM(model=model, **ENGINE_OPTIONS, disable_log_stats=False)
    params, convs = SamplingParams(**kw), conversations(n)
    return lambda: llm.chat(convs, params, use_tqdm=False)


def _ours(
    path: str, model: str, n: int, stamps: list[float], kw: dict[str, Any]
) -> Callable[[], Any]:
    from vllm.v1.engine.async_llm import AsyncLLM

    add = AsyncLLM.add_request

    async def noted(self: Any, *args: Any, **kwargs: Any) -> Any:
        stamps.append(time.perf_counter())
        return await add(self, *args, **kwargs)

    AsyncLLM.add_request = noted  # type: ignore[method-assign]
    texts = prompts(n)
    if path == "ChatVLLM.abatch":
        from vllm_inline.integrations.langchain import ChatVLLM

        chat = ChatVLLM(model=model, vllm_kwargs=ENGINE_OPTIONS)
        return lambda: asyncio.run(chat.abatch(texts, **kw))
    from llama_index.core.base.llms.types import ChatMessage

    from vllm_inline.integrations.llama_index import VLLM

    llm = VLLM(model=model, vllm_kwargs=ENGINE_OPTIONS)

    async def gather() -> list[Any]:
        return await asyncio.gather(
            *(llm.achat([ChatMessage(role="user", content=t)], **kw) for t in texts)
        )

    return lambda: asyncio.run(gather())


def child(path: str, model: str, n: int, tokens: int, runs: int) -> None:
    """Time ``runs`` calls of ``path`` on ``n`` inputs; print one ``RESULT`` JSON line."""
    stamps: list[float] = []
    kw = sampling(tokens)
    call = (
        _llm_chat(model, n, stamps, kw) if path == PATHS[0] else _ours(path, model, n, stamps, kw)
    )
    call()  # warm-up
    gc.collect()
    gc.freeze()
    last, wall = [], []
    for _ in range(runs):
        time.sleep(1.5)  # an engine's processes spin for a second after a run
        gc.collect()
        stamps.clear()
        started = time.perf_counter()
        call()
        wall.append(time.perf_counter() - started)
        assert len(stamps) == n, (path, len(stamps), n)
        last.append(stamps[-1] - started)
    print(
        RESULT
        + json.dumps(
            {"last_added_ms": [1e3 * x for x in last], "call_ms": [1e3 * x for x in wall]}
        ),
        flush=True,
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny", help="a models.SPECS name: " + ", ".join(SPECS))
    ap.add_argument("--inputs", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=32, help="generated tokens per input")
    ap.add_argument("--runs", type=int, default=8)
    ap.add_argument("--child", choices=PATHS, help=argparse.SUPPRESS)
    args = ap.parse_args()
    model = str(build_model(SPECS[args.model]))
    if args.child:
        child(args.child, model, args.inputs, args.tokens, args.runs)
        return 0
    results: dict[str, dict[str, list[float]]] = {}
    for path in PATHS:
        cmd = [sys.executable, __file__, "--child", path, "--model", args.model]
        cmd += [
            "--inputs",
            str(args.inputs),
            "--tokens",
            str(args.tokens),
            "--runs",
            str(args.runs),
        ]
        # vLLM's LLM leaves its IPC sockets in the temporary directory (docs/deployment.md,
        # "Files in /tmp"): each child gets one of its own, removed after it.
        with tempfile.TemporaryDirectory(prefix="vllm-inline-bulk-arrival-") as tmp:
            env = {**os.environ, "TMPDIR": tmp}
            out = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=True, env=env).stdout
        line = next(x for x in out.splitlines() if x.startswith(RESULT))
        results[path] = json.loads(line[len(RESULT) :])
    print(
        f"\n== the last of {args.inputs} requests reaching vLLM ({args.model}, {args.tokens} "
        f"tokens each, stats on, median of {args.runs} runs [range]) =="
    )
    ref_last = statistics.median(results[PATHS[0]]["last_added_ms"])
    ref_call = statistics.median(results[PATHS[0]]["call_ms"])
    for path, got in results.items():
        last, call = statistics.median(got["last_added_ms"]), statistics.median(got["call_ms"])
        print(
            f"{path:<26} last add_request {last:6.1f} ms [{min(got['last_added_ms']):.1f}-"
            f"{max(got['last_added_ms']):.1f}] = {last / ref_last:.2f}x; call {call:6.0f} ms "
            f"= {call / ref_call:.2f}x; the last request {100 * last / call:.0f} % into the call"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
