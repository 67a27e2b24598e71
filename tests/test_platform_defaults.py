"""The CPU defaults decision (:func:`choose_engine_kwargs`): a pure function of the user's
options and the measured facts, checked here without an engine. The real-engine side (an engine
with no options starts on this CPU) is in ``test_engine_cpu_defaults.py``."""

from __future__ import annotations

import pytest

from vllm_inline.engine.errors import InsufficientMemoryError, ModelLoadError
from vllm_inline.engine.platform_defaults import (
    Choice,
    MachineFacts,
    PlatformDefaults,
    choose_engine_kwargs,
    cpu_supports_bf16,
)

GiB = 2**30
MiB = 2**20

# Qwen3-0.6B-like: 28 layers x 8 KV heads x 128 = 57344 K+V elements per token, 40960 tokens.
QWEN = dict(
    kv_elements_per_token=2 * 28 * 8 * 128,
    model_max_len=40960,
    checkpoint_dtype="bfloat16",
    weights_bytes=int(1.2 * GiB),
)
# SmolLM2-135M-like: 30 layers x 3 KV heads x 64, 8192 tokens, float32 weights.
SMOL = dict(
    kv_elements_per_token=2 * 30 * 3 * 64,
    model_max_len=8192,
    checkpoint_dtype="float32",
    weights_bytes=540 * MiB,
)


def cpu(free: int = 13 * GiB, flags: frozenset[str] = frozenset({"avx2"}), **model) -> MachineFacts:
    return MachineFacts(
        is_cpu=True, free_memory_bytes=free, total_memory_bytes=24 * GiB, cpu_flags=flags, **model
    )


def chosen(result: PlatformDefaults) -> dict:
    return {c.name: c.value for c in result.chosen}


def test_gpu_changes_nothing() -> None:
    user = {"max_model_len": 4096}
    result = choose_engine_kwargs(user, MachineFacts(is_cpu=False))
    assert result.kwargs == user and result.chosen == ()
    assert "not a CPU" in result.summary()


def test_cpu_without_bf16_gets_float32_eager_and_a_kv_cache_that_fits() -> None:
    result = choose_engine_kwargs({}, cpu(**SMOL))
    picks = chosen(result)
    assert picks["dtype"] == "float32"
    assert picks["enforce_eager"] is True
    per_sequence = SMOL["kv_elements_per_token"] * 4 * 8192  # float32, whole window
    assert picks["kv_cache_memory_bytes"] == 4 * per_sequence  # a few full-length sequences
    assert "max_model_len" not in picks  # the model's window fits
    assert result.kwargs == picks
    reasons = {c.name: c.reason for c in result.chosen}
    assert "SIGILL" in reasons["dtype"] and "92 %" in reasons["kv_cache_memory_bytes"]
    assert "dtype=float32" in result.summary()


@pytest.mark.parametrize("flag", ["avx512_bf16", "amx_bf16", "bf16"])
def test_cpu_with_bf16_gets_bfloat16(flag: str) -> None:
    assert cpu_supports_bf16(frozenset({flag, "avx2"}))
    result = choose_engine_kwargs({}, cpu(flags=frozenset({flag}), **SMOL))
    assert chosen(result)["dtype"] == "bfloat16"
    assert flag in result.chosen[0].reason


def test_kv_cache_is_capped_and_never_more_than_half_of_what_is_left() -> None:
    tiny = dict(kv_elements_per_token=2 * 1 * 8 * 64, model_max_len=512, weights_bytes=2 * MiB)
    assert (
        chosen(choose_engine_kwargs({}, cpu(**tiny)))["kv_cache_memory_bytes"] == 64 * MiB
    )  # floor
    big = dict(SMOL, model_max_len=32768)  # 4 sequences would be 5.6 GiB: capped at 4 GiB
    assert (
        chosen(choose_engine_kwargs({}, cpu(free=20 * GiB, **big)))["kv_cache_memory_bytes"]
        == 4 * GiB
    )
    squeezed = chosen(choose_engine_kwargs({}, cpu(free=4 * GiB, **SMOL)))
    budget = (4 * GiB - 540 * MiB - GiB) // 2
    assert squeezed["kv_cache_memory_bytes"] <= budget


def test_a_window_too_long_for_memory_is_shortened_when_the_user_did_not_set_it() -> None:
    # Qwen3's 40960 tokens in float32 take 8.75 GiB of KV cache for one sequence.
    result = choose_engine_kwargs({}, cpu(free=8 * GiB, **QWEN))
    picks = chosen(result)
    per_token = QWEN["kv_elements_per_token"] * 4
    assert picks["max_model_len"] % 16 == 0
    assert picks["max_model_len"] * per_token == picks["kv_cache_memory_bytes"]
    weights_f32 = QWEN["weights_bytes"] * 2  # bf16 checkpoint loaded as float32
    assert picks["kv_cache_memory_bytes"] <= (8 * GiB - weights_f32 - GiB) // 2
    assert "40960" in {c.name: c.reason for c in result.chosen}["max_model_len"]
    roomy = chosen(choose_engine_kwargs({}, cpu(free=20 * GiB, **QWEN)))  # the 4 GiB cap holds
    assert roomy["kv_cache_memory_bytes"] <= 4 * GiB < QWEN["kv_elements_per_token"] * 4 * 40960


def test_everything_the_user_sets_wins() -> None:
    user = {
        "dtype": "bfloat16",
        "enforce_eager": False,
        "kv_cache_memory_bytes": GiB,
        "max_model_len": 1024,
    }
    result = choose_engine_kwargs(user, cpu(**SMOL))
    assert result.kwargs == user and result.chosen == ()
    assert "all set by the user" in result.summary()
    # dtype="auto" is the user's choice too; gpu_memory_utilization leaves the KV cache to vLLM.
    result = choose_engine_kwargs({"dtype": "auto", "gpu_memory_utilization": 0.3}, cpu(**SMOL))
    assert chosen(result) == {"enforce_eager": True}
    assert result.kwargs["dtype"] == "auto" and result.kwargs["gpu_memory_utilization"] == 0.3


def test_a_user_max_model_len_is_kept_and_sizes_the_kv_cache() -> None:
    picks = chosen(choose_engine_kwargs({"max_model_len": 2048}, cpu(**SMOL)))
    assert "max_model_len" not in picks
    assert picks["kv_cache_memory_bytes"] == 4 * SMOL["kv_elements_per_token"] * 4 * 2048


@pytest.mark.parametrize(
    ("user", "option"),
    [
        ({"kv_cache_memory_bytes": 64 * GiB}, "kv_cache_memory_bytes"),
        ({"gpu_memory_utilization": 0.92}, "gpu_memory_utilization"),
        ({"max_model_len": 40960}, "max_model_len"),
    ],
)
def test_more_memory_than_is_free_is_a_typed_error_naming_the_option(
    user: dict, option: str
) -> None:
    with pytest.raises(InsufficientMemoryError) as info:
        choose_engine_kwargs(user, cpu(free=6 * GiB, **QWEN))
    err = info.value
    assert isinstance(err, ModelLoadError)
    assert err.option == option and err.free_bytes == 6 * GiB and err.requested_bytes > 0
    assert option in str(err) and "6.00 GiB" in str(err)


def test_unknown_model_size_falls_back_to_a_fixed_kv_cache() -> None:
    result = choose_engine_kwargs({}, cpu())
    assert chosen(result)["kv_cache_memory_bytes"] == GiB
    unknown_memory = MachineFacts(is_cpu=True)
    assert chosen(choose_engine_kwargs({}, unknown_memory))["kv_cache_memory_bytes"] == GiB


def test_choice_is_a_plain_record() -> None:
    c = Choice("dtype", "float32", "why")
    assert (c.name, c.value, c.reason) == ("dtype", "float32", "why")
