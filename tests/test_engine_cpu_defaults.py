"""CPU defaults on real engines: no ``vllm_kwargs`` at all starts and answers on this CPU; what
the user sets is kept; a request for more memory than is free fails typed, before any process
is spawned. The decision itself is unit-tested in ``test_platform_defaults.py``."""

from __future__ import annotations

import pathlib
from typing import Any

import psutil
import pytest

from vllm_inline.engine import get_engine
from vllm_inline.engine.errors import InsufficientMemoryError, ModelLoadError, ParallelLayoutError

pytestmark = pytest.mark.engine

USER = [{"role": "user", "content": "Hi"}]


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def _this_cpu_has_bf16() -> bool:
    """Read off ``/proc/cpuinfo`` here, not through the code under test: the hosts these tests
    run on differ (some AMD EPYC VMs have ``avx512_bf16``, others do not)."""
    flags = {
        flag
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines()
        if line.startswith(("flags", "Features"))
        for flag in line.split(":", 1)[1].split()
    }
    return bool(flags & {"avx512_bf16", "amx_bf16", "bf16"})


def test_an_engine_with_no_options_starts_and_answers_on_this_cpu(scripted: Any) -> None:
    """On the examples' engine (tests/test_examples.py): the ``demo`` model with no options, one
    engine per process for both modules, left running for them (the session ends it)."""
    s = scripted("demo")
    engine = get_engine(s.path)  # no vllm_kwargs: the engine picks what this CPU needs
    text = "".join(d.text for d in engine.stream(USER))
    assert text == s.scenario.answer
    chosen = {c.name: c for c in engine.platform_defaults.chosen}
    # bfloat16 only where the CPU has the instructions (without them the worker dies of SIGILL)
    assert chosen["dtype"].value == ("bfloat16" if _this_cpu_has_bf16() else "float32")
    assert chosen["enforce_eager"].value is True
    kv = chosen["kv_cache_memory_bytes"].value
    assert 0 < kv <= 4 * 2**30 and "free" in chosen["kv_cache_memory_bytes"].reason
    assert engine.platform_defaults.kwargs == {c.name: c.value for c in chosen.values()}
    assert engine.vllm_kwargs == {}  # the user's options are untouched


def test_options_the_user_sets_are_kept(scripted: Any) -> None:
    s = scripted("llama3")  # the suite's engine: dtype, KV cache and eager mode all set
    engine = s.engine.start()
    assert engine.platform_defaults.kwargs == s.engine_kwargs
    assert engine.platform_defaults.kwargs["kv_cache_memory_bytes"] == 128 * 2**20
    assert engine.platform_defaults.chosen == ()
    assert "".join(d.text for d in engine.stream(USER, max_tokens=32)) == s.scenario.answer


def test_more_kv_cache_than_free_memory_fails_typed_before_spawning(scripted: Any) -> None:
    s = scripted("llama3")
    too_much = psutil.virtual_memory().total * 2
    engine = get_engine(s.path, kv_cache_memory_bytes=too_much)
    before = _children()
    with pytest.raises(InsufficientMemoryError) as info:
        engine.start()
    assert _children() - before == set()  # no engine-core process was spawned
    assert not engine.started
    err = info.value
    assert isinstance(err, ModelLoadError)
    assert err.option == "kv_cache_memory_bytes" and err.requested_bytes == too_much
    assert "kv_cache_memory_bytes" in str(err) and "free memory" in str(err)
    assert 0 < err.free_bytes < too_much


@pytest.mark.parametrize(
    ("layout", "option"),
    [
        ({"tensor_parallel_size": 3}, "tensor_parallel_size"),  # 4 heads
        ({"tensor_parallel_size": 4}, "tensor_parallel_size"),  # 4 ranks, 2 CPUs here
        ({"pipeline_parallel_size": 2, "enforce_eager": True}, "enforce_eager"),
    ],
)
def test_a_parallel_layout_that_cannot_run_fails_typed_before_spawning(
    scripted: Any, layout: dict[str, Any], option: str
) -> None:
    s = scripted("llama3")
    engine = get_engine(s.path, **{**s.engine_kwargs, **layout})
    before = _children()
    with pytest.raises(ParallelLayoutError) as info:
        engine.start()
    assert _children() - before == set()
    assert not engine.started
    assert info.value.option == option and f"{option}=" in str(info.value)
