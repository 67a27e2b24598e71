"""The response store's cost per call, this tree's ``SQLiteResponseStore`` against another
commit's, in the same run. A BENCHMARK HARNESS, NOT A TEST.

What a turn of ``/v1/responses`` asks of the store: a ``put`` of the finished response, a ``get``
of the previous one (``previous_response_id``), and for a background response a ``status`` poll
every 0.25 s while it runs. Each side runs in a process of its own on a file of its own, rounds
alternating A, B, B, A, ... so that drift on the host falls on both; the record is a 3-turn
agent conversation's size (~6 kB of JSON). Prints the median milliseconds per call of each side
and their ratio (this tree over the reference; below 1: faster).

The reference side loads ``vllm_inline/server/responses/sqlite_store.py`` (or, before it was
split out, ``store.py``) from ``git show <ref>:...`` into a module of its own; its imports
resolve against the installed package, as the file did at that commit.

    python benchmarks/response_store.py --ref 3c1cae0 [--rounds 8] [--calls 300]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import subprocess
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent

CHILD = """
import importlib.util, json, statistics, sys, time
source, path, calls = sys.argv[1], sys.argv[2], int(sys.argv[3])
if source == "-":
    from vllm_inline.server.responses import SQLiteResponseStore, StoredResponse
else:
    spec = importlib.util.spec_from_file_location("reference_store", source)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    SQLiteResponseStore = module.SQLiteResponseStore
    from vllm_inline.server.responses import StoredResponse
store = SQLiteResponseStore(path)
messages = [{"role": "user" if k % 2 else "assistant", "content": "x" * 300} for k in range(18)]
timings = {"put": [], "get": [], "status": []}
for k in range(calls):
    response = {"id": f"resp_{k}", "object": "response", "status": "completed",
                "output": [{"type": "message", "content": [{"text": "y" * 400}]}]}
    running = {**response, "id": f"resp_run_{k}", "status": "in_progress"}
    t = time.perf_counter(); store.put(StoredResponse(response, messages))
    timings["put"].append(time.perf_counter() - t)
    store.put(StoredResponse(running, messages))
    t = time.perf_counter(); store.get(f"resp_{k}")
    timings["get"].append(time.perf_counter() - t)
    t = time.perf_counter(); store.status(f"resp_run_{k}")
    timings["status"].append(time.perf_counter() - t)
print(json.dumps({name: statistics.median(v) * 1e3 for name, v in timings.items()}))
"""


def reference_source(ref: str, into: pathlib.Path) -> pathlib.Path:
    """The reference commit's SQLite store module, written to ``into``."""
    for path in ("vllm_inline/server/responses/sqlite_store.py",
                 "vllm_inline/server/responses/store.py"):  # fmt: skip
        shown = subprocess.run(
            ["git", "show", f"{ref}:{path}"], cwd=ROOT, capture_output=True, text=True, check=False
        )
        if shown.returncode == 0 and "class SQLiteResponseStore" in shown.stdout:
            out = into / "reference_store.py"
            out.write_text(shown.stdout)
            return out
    raise SystemExit(f"--ref {ref}: no SQLiteResponseStore in its vllm_inline/server/responses")


def one_round(source: str, path: pathlib.Path, calls: int) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, source, str(path), str(calls)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ref", required=True, help="the commit to compare with")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--calls", type=int, default=300, help="calls of each kind per round")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="vllm-inline-store-bench-") as tmp:
        root = pathlib.Path(tmp)
        sides = {"this tree": "-", args.ref: str(reference_source(args.ref, root))}
        results: dict[str, list[dict[str, float]]] = {name: [] for name in sides}
        for k in range(args.rounds):
            order = list(sides) if k % 2 == 0 else list(reversed(sides))
            for name in order:
                file = root / f"{name.replace(' ', '-')}-{k}.sqlite3"
                results[name].append(one_round(sides[name], file, args.calls))
    print(f"response store, median ms per call over {args.rounds} rounds of {args.calls}")
    print(f"{'call':8} {'this tree':>10} {args.ref:>10} {'ratio':>7}")
    for call in ("put", "get", "status"):
        ours = statistics.median(r[call] for r in results["this tree"])
        ref = statistics.median(r[call] for r in results[args.ref])
        print(f"{call:8} {ours:10.4f} {ref:10.4f} {ours / ref:7.2f}")


if __name__ == "__main__":
    main()
