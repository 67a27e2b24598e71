"""The host engine (``keep_alive``, docs/host.md) against an engine in each process, measured.

    python benchmarks/host_engine.py [--rounds 3] [--tokens 1000]

1. **From ``ChatVLLM(...)`` to the first token**, each in a fresh process (the interpreter's
   start not counted; imports counted): an engine started in the process (a cold start) against
   the first, second and third process with ``keep_alive`` (the first launches the host
   engine: a cold start too). The attached time is split into its parts: importing the
   package, attaching (connect, greet), the first request.
2. **Memory**: three processes holding the model (proportional set size, ``/proc/*/smaps_rollup``,
   so pages shared by forked processes count once): three engines of their own, against
   three processes on one host engine, against ``vllm serve`` and three ``ChatOpenAI``
   processes; and one app process's own memory, in-process engine against attached.
3. **Streaming**: tokens per second and time to the first token of one stream and of 16 at
   once (``ignore_eos``, ``--tokens`` each), an attached process against an engine started in
   that process, alternating rounds; the app process's CPU time per token in both (the
   host's own CPU per token said beside it).

The scripted ``long`` model with the test kit's CPU options. Ratios are printed; figures go to
docs/performance.md ("One engine per host"). Not a timed test.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from servers import free_port, start_server, stop_server, wait_healthy

FIRST_TOKEN = textwrap.dedent(
    """
    import json, sys, time
    t0 = time.perf_counter()
    from vllm_inline.integrations.langchain import ChatVLLM
    imported = time.perf_counter() - t0
    spec = json.loads(sys.argv[1])
    t1 = time.perf_counter()
    chat = ChatVLLM(model=spec["model"], vllm_kwargs=spec["kwargs"], max_tokens=4,
                    keep_alive=spec["keep_alive"])
    if spec["keep_alive"] is not None:
        chat.engine.start()
    attached = time.perf_counter() - t1
    for chunk in chat.stream("Hi"):
        break
    first = time.perf_counter() - t0
    print("TIMES", json.dumps({"import": imported, "attach": attached, "first": first,
                               "vllm": "vllm" in sys.modules}), flush=True)
    if spec.get("hold"):
        print("HOLDING", flush=True)
        sys.stdin.read()
    """
)

STREAMS = textwrap.dedent(
    """
    import asyncio, json, resource, statistics, sys, time
    from vllm_inline.engine import get_engine
    spec = json.loads(sys.argv[1])
    engine = get_engine(spec["model"], keep_alive=spec["keep_alive"], **spec["kwargs"])
    engine.start()
    messages = [{"role": "user", "content": "Hi"}]

    async def one():
        began, first, tokens = time.perf_counter(), None, 0
        async for delta in engine.astream(messages, max_tokens=spec["tokens"], ignore_eos=True):
            if first is None:
                first = time.perf_counter() - began
            tokens += len(delta.token_ids)
        return first, tokens

    async def main(n):
        began = time.perf_counter()
        cpu = resource.getrusage(resource.RUSAGE_SELF)
        results = await asyncio.gather(*(one() for _ in range(n)))
        wall = time.perf_counter() - began
        after = resource.getrusage(resource.RUSAGE_SELF)
        used = (after.ru_utime - cpu.ru_utime) + (after.ru_stime - cpu.ru_stime)
        tokens = sum(t for _, t in results)
        return {"tok_s": tokens / wall, "ttft": statistics.median(f for f, _ in results),
                "cpu_per_token_us": 1e6 * used / tokens, "tokens": tokens}

    asyncio.run(main(2))  # warm-up
    out = {n: asyncio.run(main(n)) for n in spec["concurrency"]}
    print("STREAMS", json.dumps(out), flush=True)
    """
)


def _pss(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        total += int(line.split()[1]) * 1024
        except OSError:
            pass
    return total


def _tree(pid: int) -> list[int]:
    """``pid`` and every process below it (``/proc``)."""
    from vllm_inline.engine.host.status import tree

    return tree(pid)


def _cpu_seconds(pids: list[int]) -> float:
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / ticks
        except (OSError, ValueError, IndexError):
            pass
    return total


def _run(code: str, spec: dict[str, Any], env: dict[str, str], marker: str) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-c", code, json.dumps(spec)], capture_output=True,
                          text=True, env=env, timeout=900, check=False)  # fmt: skip
    for line in done.stdout.splitlines():
        if line.startswith(marker + " "):
            return json.loads(line[len(marker) + 1 :])  # type: ignore[no-any-return]
    raise RuntimeError(done.stderr[-3000:])


def _stop_host(env: dict[str, str]) -> None:
    subprocess.run([sys.executable, "-m", "vllm_inline", "engines", "stop", "--all"], env=env,
                   capture_output=True, check=False, timeout=120)  # fmt: skip


def first_tokens(model: str, kwargs: dict[str, Any], env: dict[str, str], rounds: int) -> None:
    print("\n== 1. From ChatVLLM(...) to the first token (fresh process each; seconds)")
    cold, attached = [], [[], [], []]
    parts: list[dict[str, Any]] = []
    for _ in range(rounds):
        cold.append(_run(FIRST_TOKEN, {"model": model, "kwargs": kwargs, "keep_alive": None},
                         env, "TIMES")["first"])  # fmt: skip
        for i in range(3):
            spec = {"model": model, "kwargs": kwargs, "keep_alive": "-1"}
            times = _run(FIRST_TOKEN, spec, env, "TIMES")
            attached[i].append(times["first"])
            if i:
                parts.append(times)
        _stop_host(env)
    c = statistics.median(cold)
    print(
        f"engine in the process (cold start): median {c:.2f} s ({', '.join(f'{x:.2f}' for x in cold)})"
    )
    for i, times in enumerate(attached):
        m = statistics.median(times)
        print(f"keep_alive, process {i + 1}: median {m:.2f} s = {m / c:.2f}x the cold start "
              f"({', '.join(f'{x:.2f}' for x in times)})")  # fmt: skip
    imp = statistics.median(p["import"] for p in parts)
    att = statistics.median(p["attach"] for p in parts)
    first = statistics.median(p["first"] - p["import"] - p["attach"] for p in parts)
    print(f"attached (processes 2 and 3): import {imp:.2f} s, attach {att:.3f} s, first request "
          f"{first:.3f} s; vLLM imported: {any(p['vllm'] for p in parts)}")  # fmt: skip


def _holders(spec: dict[str, Any], env: dict[str, str], n: int) -> list[subprocess.Popen[str]]:
    holders = []
    for _ in range(n):
        p = subprocess.Popen([sys.executable, "-c", FIRST_TOKEN, json.dumps({**spec, "hold": True})],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)  # fmt: skip
        assert p.stdout is not None
        for line in p.stdout:
            if line.startswith("HOLDING"):
                break
        holders.append(p)
    return holders


OPENAI_CLIENT = textwrap.dedent(
    """
    import sys
    from langchain_openai import ChatOpenAI
    chat = ChatOpenAI(base_url=sys.argv[1], api_key="none", model=sys.argv[2], max_tokens=4)
    chat.invoke("Hi")
    print("HOLDING", flush=True)
    sys.stdin.read()
    """
)


def _openai_client(port: int, model: str, env: dict[str, str]) -> subprocess.Popen[str]:
    p = subprocess.Popen([sys.executable, "-c", OPENAI_CLIENT, f"http://127.0.0.1:{port}/v1", model],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)  # fmt: skip
    assert p.stdout is not None
    for line in p.stdout:
        if line.startswith("HOLDING"):
            break
    return p


def memory(model: str, kwargs: dict[str, Any], env: dict[str, str]) -> None:
    print("\n== 2. Memory of three processes holding the model (PSS, GiB)")
    own = _holders({"model": model, "kwargs": kwargs, "keep_alive": None}, env, 3)
    own_pss = _pss([q for p in own for q in _tree(p.pid)])
    app_own = statistics.median(_pss([p.pid]) for p in own)
    for p in own:
        p.kill()
        p.wait()
    time.sleep(3)
    shared = _holders({"model": model, "kwargs": kwargs, "keep_alive": "-1"}, env, 3)
    from vllm_inline.engine.host import directory as files

    (record,) = files.read_records(os.environ[files.DIRECTORY_VARIABLE])
    shared_pss = _pss([p.pid for p in shared] + _tree(record.pid))
    app_attached = statistics.median(_pss([p.pid]) for p in shared)
    for p in shared:
        p.kill()
        p.wait()
    _stop_host(env)
    serve_pss = None
    port = free_port()
    # vLLM leaves its IPC socket files behind (docs/deployment.md): in a directory of its own.
    with tempfile.TemporaryDirectory(prefix="vllm-serve-") as scratch:
        log = pathlib.Path(scratch) / "server.log"
        scratch_env = {"VLLM_RPC_BASE_PATH": scratch, "TMPDIR": scratch}
        server = start_server(model, port, kwargs, log, env=scratch_env)
        try:
            wait_healthy(f"http://127.0.0.1:{port}/health", server, timeout=300)
            clients = [_openai_client(port, model, env) for _ in range(3)]
            serve_pss = _pss(_tree(server.pid) + [c.pid for c in clients])
            for c in clients:
                c.kill()
                c.wait()
        finally:
            stop_server(server)
    gib = 2**30
    print(f"3 engines of their own:        {own_pss / gib:.2f}")
    print(f"3 processes on one host engine: {shared_pss / gib:.2f} ({shared_pss / own_pss:.2f}x)")
    if serve_pss:
        print(f"vllm serve + 3 ChatOpenAI:      {serve_pss / gib:.2f} ({serve_pss / own_pss:.2f}x)")
    print(f"one app process: engine in it {app_own / gib:.2f}, attached {app_attached / gib:.2f} "
          f"({app_attached / app_own:.2f}x)")  # fmt: skip


def streams(
    model: str, kwargs: dict[str, Any], env: dict[str, str], rounds: int, tokens: int
) -> None:
    print(f"\n== 3. Streaming ({tokens} tokens a stream, ignore_eos), alternating rounds")
    concurrency = [1, 16]
    got: dict[str, list[dict[str, Any]]] = {"own": [], "attached": []}
    host_cpu: list[float] = []
    for _ in range(rounds):
        for way, keep in (("own", None), ("attached", "-1")):
            spec = {"model": model, "kwargs": kwargs, "keep_alive": keep, "tokens": tokens,
                    "concurrency": concurrency}  # fmt: skip
            if keep is not None:  # the host engine up first: its start is not measured
                _run(
                    FIRST_TOKEN,
                    {"model": model, "kwargs": kwargs, "keep_alive": keep},
                    env,
                    "TIMES",
                )
                from vllm_inline.engine.host import directory as files

                (record,) = files.read_records(os.environ[files.DIRECTORY_VARIABLE])
                before = _cpu_seconds([record.pid])  # the front end's process, as the app's own
            got[way].append(_run(STREAMS, spec, env, "STREAMS"))
            if keep is not None:
                used = _cpu_seconds([record.pid]) - before
                total = sum(r["tokens"] for r in got[way][-1].values()) + 2 * tokens * 2
                host_cpu.append(1e6 * used / total)
                _stop_host(env)
    for n in map(str, concurrency):
        own = statistics.median(r[n]["tok_s"] for r in got["own"])
        att = statistics.median(r[n]["tok_s"] for r in got["attached"])
        own_t = statistics.median(r[n]["ttft"] for r in got["own"])
        att_t = statistics.median(r[n]["ttft"] for r in got["attached"])
        own_c = statistics.median(r[n]["cpu_per_token_us"] for r in got["own"])
        att_c = statistics.median(r[n]["cpu_per_token_us"] for r in got["attached"])
        print(f"{n:>2} stream(s): tok/s own {own:.0f}, attached {att:.0f} ({att / own:.2f}x); "
              f"TTFT own {own_t * 1e3:.1f} ms, attached {att_t * 1e3:.1f} ms ({att_t / own_t:.2f}x); "
              f"app CPU/token own {own_c:.0f} us, attached {att_c:.0f} us")  # fmt: skip
    print(f"the host process's own CPU per token (its front end) while attached: "
          f"{statistics.median(host_cpu):.0f} us")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=1000)
    parser.add_argument("--only", choices=["first", "memory", "streams"])
    args = parser.parse_args()
    from vllm_inline.testing import CPU_TEST_ENGINE_KWARGS, build_scripted_model

    model = str(build_scripted_model("long"))
    kwargs = {**CPU_TEST_ENGINE_KWARGS, "max_model_len": 4096}
    with tempfile.TemporaryDirectory(prefix="host-bench-") as directory:
        os.environ["VLLMINLINE_HOST_DIR"] = directory
        env = {**os.environ}
        env.pop("VLLMINLINE_KEEP_ALIVE", None)
        try:
            if args.only in (None, "first"):
                first_tokens(model, kwargs, env, args.rounds)
            if args.only in (None, "memory"):
                memory(model, kwargs, env)
            if args.only in (None, "streams"):
                streams(model, kwargs, env, args.rounds, args.tokens)
        finally:
            _stop_host(env)


if __name__ == "__main__":
    main()
