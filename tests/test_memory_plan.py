"""The memory plan of engines started together (:mod:`vllm_inline.engine.life.memory_plan`): a pure
function, checked here against the rules it encodes.

The GPU side was derived from vLLM's code and is unit-tested here, not run on a GPU (there is
none on these machines). :func:`vllm_starts` replays vLLM's own accounting for engines sharing
one device, in every order they can reach it:

- ``vllm/v1/worker/utils.py::request_memory`` (called by ``Worker.init_device`` in
  ``vllm/v1/worker/gpu_worker.py``): an engine requests ``ceil(total * gpu_memory_utilization)``
  and refuses to start when the free memory is less;
- ``Worker.determine_available_memory``: with ``kv_cache_memory_bytes`` set, that is the KV
  cache, whatever the profile run measured.

:func:`test_the_rules_are_vllms` reads those two functions in the installed vLLM and, under
``make test-compat``, in vLLM 0.30.0 (installed there) and 0.33.0's sources
(``VLLMINLINE_VLLM_SOURCES``), so a vLLM release that changes them fails here.
"""

from __future__ import annotations

import ast
import importlib.util
import itertools
import math
import os
from pathlib import Path

import pytest

from vllm_inline.engine.errors import InsufficientMemoryError
from vllm_inline.engine.life.memory_plan import (
    GPU_MARGIN,
    GPU_OVERHEAD,
    VLLM_DEFAULT_UTILIZATION,
    EngineNeeds,
    check_alone_start,
    plan_memory,
    sized_by_user,
)
from vllm_inline.engine.life.platform_defaults import MachineFacts, choose_engine_kwargs

GiB = 2**30
MiB = 2**20

# A RAG app's three models: a 0.6B chat model (Qwen3-0.6B's shape), a MiniLM-sized embedder
# and reranker (6 layers x 12 heads x 32).
CHAT = {
    "weights_bytes": int(1.2 * GiB),
    "kv_elements_per_token": 2 * 28 * 8 * 128,
    "model_max_len": 40960,
    "checkpoint_dtype": "bfloat16",
}
SMALL = {
    "weights_bytes": 90 * MiB,
    "kv_elements_per_token": 2 * 6 * 12 * 32,
    "model_max_len": 512,
    "checkpoint_dtype": "float32",
}
# An 8B chat model on a GPU (Llama 3 8B's shape): 32 layers x 8 KV heads x 128, bfloat16.
LLAMA8B = {
    "weights_bytes": 16 * GiB,
    "kv_elements_per_token": 2 * 32 * 8 * 128,
    "model_max_len": 8192,
    "checkpoint_dtype": "bfloat16",
}


def cpu(free: int = 20 * GiB, **model) -> MachineFacts:
    return MachineFacts(
        is_cpu=True,
        free_memory_bytes=free,
        total_memory_bytes=24 * GiB,
        cpu_flags=frozenset({"avx2"}),
        **model,
    )


def gpu(free: int = 79 * GiB, total: int = 80 * GiB, **model) -> MachineFacts:
    return MachineFacts(is_cpu=False, free_memory_bytes=free, total_memory_bytes=total, **model)


def rag(facts, chat=CHAT, user=None) -> list[EngineNeeds]:
    """The three engines of a RAG app on ``facts`` (``user``: options set by model name)."""
    user = user or {}
    return [
        EngineNeeds("chat", dict(user.get("chat", {})), facts(**chat)),
        EngineNeeds("embedder", {"runner": "pooling", **user.get("embedder", {})}, facts(**SMALL)),
        EngineNeeds("reranker", {"runner": "pooling", **user.get("reranker", {})}, facts(**SMALL)),
    ]


def options(plan) -> list[dict]:
    return [{c.name: c.value for c in choices} for choices in plan]


# -- the CPU ------------------------------------------------------------------------------------


def test_cpu_engines_that_fit_get_what_they_would_get_alone():
    engines = rag(cpu)
    planned = options(plan_memory(engines))
    for need, got in zip(engines, planned):
        alone = choose_engine_kwargs(need.user_kwargs, need.facts).kwargs
        assert got["kv_cache_memory_bytes"] == alone["kv_cache_memory_bytes"], need.model
        assert got.get("max_model_len") == alone.get("max_model_len"), need.model


def test_cpu_kv_caches_share_what_is_left_after_all_the_weights():
    free = 6 * GiB
    engines = rag(lambda **m: cpu(free=free, **m))
    planned = options(plan_memory(engines))
    weights = sum(e.weights for e in engines)
    kv = sum(p["kv_cache_memory_bytes"] for p in planned)
    assert kv <= (free - weights - 3 * GiB) * 0.5  # the reserve per engine, half of the rest
    # alone, the first engine would take half of what is free after its own weights only
    alone = choose_engine_kwargs({}, engines[0].facts).kwargs["kv_cache_memory_bytes"]
    assert planned[0]["kv_cache_memory_bytes"] < alone
    # shares in proportion to what each would take alone, the small models' untouched in kind
    assert planned[1]["kv_cache_memory_bytes"] == planned[2]["kv_cache_memory_bytes"] > 0
    # the chat model's window is lowered to what its share holds, a multiple of the block size
    assert planned[0]["max_model_len"] % 16 == 0 and planned[0]["max_model_len"] < 40960


def test_cpu_plan_that_cannot_fit_names_the_model_and_the_option():
    with pytest.raises(InsufficientMemoryError) as caught:
        plan_memory(rag(lambda **m: cpu(free=3 * GiB, **m)))  # weights + 3 x 1 GiB reserve
    assert caught.value.option == "model" and "chat" in str(caught.value)
    user = {"chat": {"max_model_len": 40960}}
    with pytest.raises(InsufficientMemoryError) as caught:
        plan_memory(rag(lambda **m: cpu(free=6 * GiB, **m), user=user))
    assert caught.value.option == "max_model_len"
    assert str(caught.value).startswith("chat:") and "max_model_len=40960" in str(caught.value)


def test_what_the_user_sets_wins_and_is_counted():
    user = {"embedder": {"kv_cache_memory_bytes": 2 * GiB}}
    engines = rag(lambda **m: cpu(free=8 * GiB, **m), user=user)
    planned = plan_memory(engines)
    assert planned[1] == ()  # the embedder the user sized: nothing chosen for it
    without = options(plan_memory(rag(lambda **m: cpu(free=8 * GiB, **m))))
    assert options(planned)[0]["kv_cache_memory_bytes"] < without[0]["kv_cache_memory_bytes"]
    # and the plan reaches the engine's options as chosen ones, under the user's
    chosen = choose_engine_kwargs({"max_model_len": 1024}, engines[0].facts, planned[0])
    assert chosen.kwargs["max_model_len"] == 1024
    assert chosen.kwargs["kv_cache_memory_bytes"] == options(planned)[0]["kv_cache_memory_bytes"]
    assert "planned with 2 other engine(s)" in chosen.summary()


def test_one_engine_alone_or_no_free_memory_plans_nothing():
    assert plan_memory(rag(cpu)[:1]) == [()]
    assert plan_memory(rag(lambda **m: MachineFacts(is_cpu=True, **m))) == [(), (), ()]


def test_engines_all_sized_by_their_users_plan_nothing():
    # start_engines then measures nothing either: no vLLM import, no model configs read
    user = {
        "chat": {"gpu_memory_utilization": 0.3},
        "embedder": {"kv_cache_memory_bytes": GiB},
        "reranker": {"kv_cache_memory_bytes": GiB},
    }
    engines = rag(cpu, user=user)
    assert all(sized_by_user(e.user_kwargs) for e in engines)
    assert plan_memory(engines) == [(), (), ()]
    assert not sized_by_user({"kv_cache_memory_bytes": None, "max_model_len": 512})


# -- the GPU: vLLM's accounting, replayed --------------------------------------------------------


def vllm_starts(engines, plan, free, total, overhead) -> None:
    """Start ``engines`` with ``plan`` on one GPU in every order, as vLLM would: each start is
    ``request_memory``'s check against the free memory then, and the engine then holds its
    weights, ``overhead(e)`` (what vLLM's profile finds: CUDA context, activations, graphs) and
    its KV cache (``kv_cache_memory_bytes`` when set, else what is left of its request)."""
    chosen = options(plan)
    for order in itertools.permutations(range(len(engines))):
        now = free
        for i in order:
            e = engines[i]
            got = {**chosen[i], **e.user_kwargs}
            utilization = got.get("gpu_memory_utilization", VLLM_DEFAULT_UTILIZATION)
            requested = math.ceil(total * utilization)
            assert now >= requested, (
                f"{e.model} refused after {[engines[j].model for j in order[: order.index(i)]]}: "
                f"free {now / GiB:.2f} GiB < {requested / GiB:.2f} GiB requested"
            )
            kv = got.get("kv_cache_memory_bytes") or requested - e.weights - overhead(e)
            assert kv >= e.one_sequence, f"{e.model}: KV cache below one sequence"
            now -= e.weights + overhead(e) + kv


def estimated(e: EngineNeeds) -> int:
    return GPU_OVERHEAD + e.weights // 10


@pytest.mark.parametrize(
    ("chat", "free", "total"),
    [
        (CHAT, 79 * GiB, 80 * GiB),
        (LLAMA8B, 79 * GiB, 80 * GiB),
        (CHAT, 22 * GiB, 24 * GiB),
        (LLAMA8B, 40 * GiB, 48 * GiB),
    ],
    ids=["0.6B-80G", "8B-80G", "0.6B-24G", "8B-48G-busy"],
)
def test_gpu_engines_started_together_all_start_in_any_order(chat, free, total):
    engines = rag(lambda **m: gpu(free=free, total=total, **m), chat=chat)
    plan = plan_memory(engines)
    # vLLM's defaults: the second engine is refused, whichever starts first
    with pytest.raises(AssertionError, match="refused"):
        vllm_starts(engines, [()] * 3, free, total, estimated)
    vllm_starts(engines, plan, free, total, estimated)
    # ... also when vLLM's overhead is half the estimate (more room left, never less)
    vllm_starts(engines, plan, free, total, lambda e: estimated(e) // 2)
    # ... and when it is larger, by up to the margin shared among the engines that start before
    # the last; past that, the last one to start is refused (the estimate is not measured here)
    over = int(total * GPU_MARGIN) // (len(engines) - 1)
    vllm_starts(engines, plan, free, total, lambda e: estimated(e) + over)
    with pytest.raises(AssertionError, match="refused"):
        vllm_starts(engines, plan, free, total, lambda e: estimated(e) + 2 * over)
    planned = options(plan)
    requested = sum(math.ceil(total * p["gpu_memory_utilization"]) for p in planned)
    assert requested <= free - total * GPU_MARGIN
    # the chat model gets the room; the pooling models a few sequences each
    assert planned[0]["kv_cache_memory_bytes"] > 10 * planned[1]["kv_cache_memory_bytes"]
    assert planned[1]["kv_cache_memory_bytes"] >= engines[1].one_sequence


def test_gpu_plan_counts_an_engine_the_user_sized():
    user = {"embedder": {"gpu_memory_utilization": 0.2}}
    engines = rag(gpu, chat=LLAMA8B, user=user)
    plan = plan_memory(engines)
    assert plan[1] == ()
    vllm_starts(engines, plan, 79 * GiB, 80 * GiB, estimated)


def test_gpu_plan_that_cannot_fit_names_the_model_and_the_option():
    small_gpu = lambda **m: gpu(free=15 * GiB, total=16 * GiB, **m)
    with pytest.raises(InsufficientMemoryError) as caught:
        plan_memory(rag(small_gpu, chat=LLAMA8B))  # 16 GiB of weights
    assert str(caught.value).startswith("chat:")
    assert caught.value.option == "gpu_memory_utilization"
    long = dict(LLAMA8B, weights_bytes=4 * GiB, model_max_len=131072)  # 16 GiB of KV for one
    with pytest.raises(InsufficientMemoryError) as caught:
        plan_memory(rag(small_gpu, chat=long))
    assert caught.value.option == "max_model_len"


def test_a_gpu_engine_started_alone_next_to_vllms_default_share_is_refused_by_name():
    facts = gpu(**SMALL)
    running = [("chat", {"model": "chat"})]  # started with vLLM's default share
    with pytest.raises(InsufficientMemoryError) as caught:
        check_alone_start("embedder", {"runner": "pooling"}, facts, running)
    message = str(caught.value)
    assert message.startswith("embedder:") and "chat" in message and "start_engines" in message
    assert "shutdown()" in message
    assert caught.value.option == "gpu_memory_utilization"
    # sized by the user, next to a sized engine, or on a CPU: vLLM's own check applies
    check_alone_start("embedder", {"gpu_memory_utilization": 0.05}, facts, running)
    check_alone_start("embedder", {}, facts, [("chat", {"gpu_memory_utilization": 0.5})])
    check_alone_start("embedder", {}, cpu(**SMALL), running)


# -- the rules are vLLM's ------------------------------------------------------------------------


def _vllm_roots() -> list[Path]:
    spec = importlib.util.find_spec("vllm")  # finds the package without importing it
    assert spec is not None and spec.submodule_search_locations
    roots = [Path(next(iter(spec.submodule_search_locations))).parent]
    extra = os.environ.get("VLLMINLINE_VLLM_SOURCES")
    return roots + [Path(p) for p in (extra or "").split(os.pathsep) if p]


def _function(path: Path, name: str, cls: str | None = None) -> ast.FunctionDef:
    tree = ast.parse(path.read_text())
    scope = tree
    if cls is not None:
        scope = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == cls)
    return next(n for n in ast.walk(scope) if isinstance(n, ast.FunctionDef) and n.name == name)


@pytest.mark.parametrize("root", _vllm_roots(), ids=str)
def test_the_rules_are_vllms(root):
    worker = root / "vllm" / "v1" / "worker"
    request = ast.unparse(_function(worker / "utils.py", "request_memory"))
    assert "init_snapshot.total_memory * cache_config.gpu_memory_utilization" in request
    assert "init_snapshot.free_memory < requested_memory" in request
    init = ast.unparse(_function(worker / "gpu_worker.py", "init_device", "Worker"))
    assert "request_memory(" in init
    available = _function(worker / "gpu_worker.py", "determine_available_memory", "Worker")
    first_if = next(n for n in available.body if isinstance(n, ast.If))
    assert "kv_cache_memory_bytes := self.cache_config.kv_cache_memory_bytes" in ast.unparse(
        first_if.test
    )
    assert isinstance(first_if.body[-1], ast.Return)  # the KV cache is that, profiling aside
