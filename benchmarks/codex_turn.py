"""A Codex CLI turn through ``python -m vllm_inline serve`` and through ``vllm serve``, on the same
model and engine options, in alternating rounds: the time from ``codex exec`` to its first item
event, and the whole turn (until ``codex exec`` exits), medians and ratios (ours / vLLM's).

Codex's turn is one streamed ``/v1/responses`` request of about 22k prompt tokens (its
instructions and tools: function, namespace and ``web_search``) on the scripted demo model,
whose answer is its fixed script (45 words): the figures are the servers' handling of a large
agent request and its stream, not a model's speed. Codex CLI comes from ``make test-agents``
(build/agents), or ``CODEX=/path/to/codex``.

    python benchmarks/codex_turn.py [--rounds 5]
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
import time

from servers import USER_ENV, start_both, stop_server, wait_healthy

from vllm_inline.testing import CPU_TEST_ENGINE_KWARGS, build_scripted_model

ROOT = pathlib.Path(__file__).resolve().parents[1]
CODEX = pathlib.Path(os.environ.get("CODEX", ROOT / "build/agents/node_modules/.bin/codex"))
OPTIONS = {**CPU_TEST_ENGINE_KWARGS, "max_model_len": 32768, "kv_cache_memory_bytes": 2**29}
"""The engine options of both servers: Codex's prompt needs the demo model's whole context."""


def codex_turn(url: str, home: pathlib.Path, work: pathlib.Path) -> tuple[float, float]:
    """One ``codex exec`` against ``url``: seconds to its first item event, and to its exit."""
    (home / "config.toml").write_text(
        'model = "demo"\nmodel_provider = "server"\n\n[model_providers.server]\n'
        f'name = "server"\nbase_url = "{url}/v1"\nwire_api = "responses"\n'
    )
    env = {**USER_ENV, "CODEX_HOME": str(home)}
    start = time.perf_counter()
    first = None
    with subprocess.Popen(
        [str(CODEX), "exec", "--skip-git-repo-check", "--json", "Say hi"],
        cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    ) as codex:  # fmt: skip
        assert codex.stdout is not None
        for line in codex.stdout:
            event = json.loads(line) if line.startswith("{") else {}
            if first is None and str(event.get("type", "")).startswith("item."):
                first = time.perf_counter() - start
        status = codex.wait()
    total = time.perf_counter() - start
    if status != 0 or first is None:
        raise RuntimeError(f"codex exec ended with {status} against {url}")
    return first, total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    if not CODEX.exists():
        print(f"{CODEX} is missing: run `make test-agents` (or set CODEX)")
        return 2
    model = str(build_scripted_model("demo"))
    with tempfile.TemporaryDirectory(prefix="vllm-inline-codex-bench-") as tmp:
        tmp_path = pathlib.Path(tmp)
        started = start_both(model, OPTIONS, "demo", tmp)
        ports = {name: port for name, (port, _) in started.items()}
        procs = {name: proc for name, (_, proc) in started.items()}
        try:
            for name, proc in procs.items():
                wait_healthy(f"http://127.0.0.1:{ports[name]}/health", proc, timeout=300)
            times: dict[str, list[tuple[float, float]]] = {name: [] for name in procs}
            for round_index in range(args.rounds + 1):  # the first round warms both up
                order = list(procs) if round_index % 2 == 0 else list(procs)[::-1]
                for name in order:
                    home, work = tmp_path / f"home-{name}", tmp_path / "work"
                    home.mkdir(exist_ok=True)
                    work.mkdir(exist_ok=True)
                    turn = codex_turn(f"http://127.0.0.1:{ports[name]}", home, work)
                    if round_index:
                        times[name].append(turn)
        finally:
            for proc in procs.values():
                stop_server(proc)
    print(f"Codex CLI {CODEX.name} exec turn, {args.rounds} alternating rounds, medians:")
    medians = {}
    for name, turns in times.items():
        first = statistics.median(t[0] for t in turns)
        total = statistics.median(t[1] for t in turns)
        medians[name] = (first, total)
        print(f"  {name:12} first item event {first:6.3f} s   turn {total:6.3f} s   (turns: "
              f"{', '.join(f'{t[1]:.2f}' for t in turns)})")  # fmt: skip
    ours, theirs = medians["vllm-inline"], medians["vllm serve"]
    print(f"  ratio (ours / vllm serve): first item event {ours[0] / theirs[0]:.2f}x, "
          f"turn {ours[1] / theirs[1]:.2f}x")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
