"""What each way of stopping an engine leaves in the temporary directory: vLLM's own server
(``python -m vllm.entrypoints.openai.api_server``), raw vLLM (``AsyncLLM.from_engine_args``,
one request) and vllm-inline (one engine, the server, a ``--workers`` group). A MEASUREMENT
HARNESS, NOT A TEST (docs/deployment.md, "Files in /tmp").

Each case runs with ``TMPDIR`` set to a directory of its own, so everything that goes through
the standard library's ``tempfile`` (vLLM's IPC socket paths, ``VLLM_RPC_BASE_PATH``'s default,
multiprocessing's ``pymp-*`` directories) lands there and is counted exactly, whatever else runs
on the host; ``/tmp`` itself is counted too (``find /tmp -maxdepth 1 -newer <marker>``), where
other users of the host add noise. The case starts, answers one request, is stopped (``shutdown``
in the script, the script's end without it, SIGTERM, SIGKILL), and once every process of its tree
has ended (30 s at most) the entries are counted.

    python benchmarks/tmp_files.py [--cases raw,vllm-serve,ours,ours-serve,ours-workers]
                                   [--out benchmarks/results/tmp-files.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import httpx
import psutil
from report import machine, now_utc, versions, write_json
from servers import USER_ENV, cli_flags, free_port

from vllm_inline.testing import CPU_TEST_ENGINE_KWARGS, build_scripted_model

RAW = """
import asyncio, os, sys, time
from vllm import AsyncEngineArgs, SamplingParams
from vllm.v1.engine.async_llm import AsyncLLM

async def main():
    llm = AsyncLLM.from_engine_args(AsyncEngineArgs(model=sys.argv[1], **{kwargs!r}))
    async for _ in llm.generate("Hello", SamplingParams(max_tokens=4), "r1"):
        pass
    print("READY", flush=True)
    if sys.argv[2] == "shutdown":
        llm.shutdown()
    elif sys.argv[2] in ("sigterm", "sigkill"):
        time.sleep(600)

if __name__ == "__main__":
    asyncio.run(main())
"""

OURS = """
import sys, time
from vllm_inline.engine import get_engine, shutdown_all

if __name__ == "__main__":
    engine = get_engine(sys.argv[1], **{kwargs!r})
    "".join(d.text for d in engine.stream([{{"role": "user", "content": "Hi"}}], max_tokens=4))
    print("READY", flush=True)
    if sys.argv[2] == "shutdown":
        shutdown_all()
    elif sys.argv[2] in ("sigterm", "sigkill"):
        time.sleep(600)
"""

CASES: dict[str, tuple[str, ...]] = {
    "raw": ("shutdown", "exit", "sigterm", "sigkill"),
    "vllm-serve": ("sigterm", "sigint", "sigkill"),
    "ours": ("shutdown", "exit", "sigterm", "sigkill"),
    "ours-serve": ("sigterm", "sigkill"),
    "ours-workers": ("sigterm", "sigkill"),
    "ours-dp": ("shutdown", "sigterm", "sigkill"),
    "ours-tp": ("shutdown", "sigterm", "sigkill"),
}
LAYOUTS = {
    "ours-dp": ({"data_parallel_size": 2}, {}),
    "ours-tp": ({"tensor_parallel_size": 2}, {"VLLM_CPU_OMP_THREADS_BIND": "0|1"}),
}
"""The parallel layouts' engine options and environment (tests/parallel/layouts.py)."""


def entries(directory: str, marker: str | None = None) -> list[str]:
    """Names directly in ``directory`` (newer than ``marker``, if given)."""
    command = ["find", directory, "-mindepth", "1", "-maxdepth", "1"]
    if marker is not None:
        command += ["-newer", marker]
    found = subprocess.run(command, capture_output=True, text=True, check=False).stdout
    return sorted(os.path.basename(line) for line in found.splitlines() if line)


def describe(directory: str, names: list[str]) -> list[str]:
    """``name (socket|dir|file)`` of each name."""
    out = []
    for name in names:
        path = os.path.join(directory, name)
        kind = "socket" if _is_socket(path) else "dir" if os.path.isdir(path) else "file"
        out.append(f"{name} ({kind})")
    return out


def _is_socket(path: str) -> bool:
    import stat

    with contextlib.suppress(OSError):
        return stat.S_ISSOCK(os.lstat(path).st_mode)
    return False


def run_case(
    case: str, stop: str, model: str, work: pathlib.Path, python: str, logs: pathlib.Path
) -> dict[str, Any]:
    # Short: a socket's path has room for 107 bytes, and vLLM's names take 37 of them.
    own_tmp = tempfile.mkdtemp(prefix="tf-")
    marker = os.path.join(work, f"marker-{case}-{stop}")
    pathlib.Path(marker).touch()
    time.sleep(1.1)  # -newer compares whole seconds on some file systems
    env = {**USER_ENV, "TMPDIR": own_tmp, "PYTHONUNBUFFERED": "1"}
    kwargs = dict(CPU_TEST_ENGINE_KWARGS)
    if case in LAYOUTS:
        kwargs.update(LAYOUTS[case][0])
        env.update(LAYOUTS[case][1])
    port = free_port()
    if case == "raw":
        command = [python, "-c", RAW.format(kwargs=kwargs), model, stop]
    elif case in ("ours", *LAYOUTS):
        command = [python, "-c", OURS.format(kwargs=kwargs), model, stop]
    elif case == "vllm-serve":
        command = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
                   "--port", str(port), *cli_flags(kwargs)]  # fmt: skip
    else:
        workers = ["--workers", "2"] if case == "ours-workers" else []
        command = [python, "-m", "vllm_inline", "serve", "--model", model, "--port",
                   str(port), "--vllm-kwargs", json.dumps(kwargs), *workers]  # fmt: skip
    log = logs / f"{case}-{stop}.log"
    piped = case in ("raw", "ours", *LAYOUTS)
    with log.open("wb") as out:
        proc = subprocess.Popen(
            command, env=env, stdout=subprocess.PIPE if piped else out, stderr=out, cwd=HERE
        )
    tree: dict[int, psutil.Process] = {}
    started = time.monotonic()
    try:
        _wait_ready(case, proc, port, workers=2 if case == "ours-workers" else 1)
        root = psutil.Process(proc.pid)
        tree.update({p.pid: p for p in [root, *root.children(recursive=True)]})
        during = entries(own_tmp)
        if stop == "sigterm":
            proc.send_signal(signal.SIGTERM)
        elif stop == "sigint":
            proc.send_signal(signal.SIGINT)
        elif stop == "sigkill":
            proc.kill()
        proc.wait(timeout=120)
        _, alive = psutil.wait_procs(list(tree.values()), timeout=30)
        left_running = [p.pid for p in alive]
    finally:
        for p in tree.values():
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
    left = entries(own_tmp)
    in_tmp = [
        n
        for n in entries(tempfile.gettempdir(), marker)
        if n not in (work.name, os.path.basename(own_tmp))
    ]
    result = {
        "seconds": round(time.monotonic() - started, 1),
        "during": len(during),
        "left": len(left),
        "left_names": describe(own_tmp, left),
        "tmp_newer_noisy": len(in_tmp),
        "processes_alive_30s_after": left_running,
    }
    shutil.rmtree(own_tmp, ignore_errors=True)
    return result


def _wait_ready(case: str, proc: subprocess.Popen[bytes], port: int, workers: int) -> None:
    deadline = time.monotonic() + 400
    if case in ("raw", "ours", *LAYOUTS):
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.strip() == b"READY":
                return
        raise RuntimeError(f"{case}: exited with {proc.wait()} before READY")
    seen: set[str] = set()
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{case}: exited with {proc.returncode}")
        with contextlib.suppress(httpx.HTTPError):
            r = httpx.post(
                f"http://127.0.0.1:{port}/v1/completions",
                json={"model": _served(port), "prompt": "Hi", "max_tokens": 2},
                timeout=30,
            )
            if r.status_code == 200:
                seen.add(r.headers.get("x-vllm-inline-worker", "0"))
                if len(seen) >= workers:
                    return
                continue
        time.sleep(0.5)
    raise TimeoutError(case)


def _served(port: int) -> str:
    return str(httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=10).json()["data"][0]["id"])


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--stops", help="only these stops (comma-separated)")
    parser.add_argument("--out", default=str(HERE / "results" / "tmp-files.json"))
    parser.add_argument("--python", default=sys.executable, help="the interpreter of the cases")
    parser.add_argument("--logs", help="keep the cases' logs in this directory")
    args = parser.parse_args()
    model = str(build_scripted_model("llama3"))
    data: dict[str, Any] = {
        "machine": machine(),
        "date": now_utc(),
        "versions": versions(),
        "python": args.python,
    }
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="vllm-inline-tmp-files-") as tmp:
        for case in args.cases.split(","):
            for stop in CASES[case]:
                if args.stops and stop not in args.stops.split(","):
                    continue
                logs = pathlib.Path(args.logs or tmp)
                logs.mkdir(parents=True, exist_ok=True)
                row = run_case(case, stop, model, pathlib.Path(tmp), args.python, logs)
                results[f"{case} {stop}"] = row
                print(f"{case} {stop}: {row}", flush=True)
    data["results"] = results
    write_json(args.out, data)


if __name__ == "__main__":
    main()
