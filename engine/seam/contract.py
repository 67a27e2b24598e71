"""The vLLM contract: every vLLM module, name, member and keyword vllm-inline uses.

:data:`CONTRACT` is the one list, kept beside the code that uses the names. The tests check it
(``tests/vllm_contract.py``): against the vLLM installed next to them (imported), and against
an unpacked vLLM wheel, parsed with :mod:`ast` and never imported (how vLLM 0.33, which has no
CPU build, is checked: ``make test-compat``). They also check that the list covers every import
of this folder and that no other module of the package imports vLLM.

A :class:`Use` may name several modules: the seam imports the first one that has the name
(vLLM moved it between releases), so one of them must have it. Nothing here imports vLLM.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["CONTRACT", "Use"]


@dataclass(frozen=True)
class Use:
    """One vLLM name the package uses."""

    modules: tuple[str, ...]
    """Where it lives; the first that has it wins (alternatives for names vLLM moved)."""
    name: str
    """The name in the module; ``Class.member`` for a method, property or attribute."""
    keywords: tuple[str, ...] = ()
    """Keywords passed to it (a callable) or fields set on it (a dataclass, struct, model)."""
    members: tuple[str, ...] = ()
    """Methods or attributes read on it (a class) or on its instances."""
    since: str | None = None
    """The first vLLM release that has it, when an older supported one does not: the seam looks
    it up (``getattr``) and does without it there; the checks of an older release skip it (and
    check that it is indeed missing there)."""

    def __str__(self) -> str:
        return f"{'|'.join(self.modules)}:{self.name}"


def _u(module: str, name: str, **fields: Any) -> Use:
    """A :class:`Use` of ``module`` (``a|b``: alternatives) with :class:`Use`'s other fields."""
    return Use(tuple(module.split("|")), name, **fields)


CONTRACT: tuple[Use, ...] = (
    # engine/seam/vllm_engine.py: start, render, sampling, errors; engine/seam/vllm_lora.py:
    # LoRARequest
    _u(
        "vllm",
        "AsyncEngineArgs",
        keywords=(
            "model",
            "dtype",
            "max_model_len",
            "enforce_eager",
            "gpu_memory_utilization",
            "kv_cache_memory_bytes",
            "disable_log_stats",
            "structured_outputs_config",
            "enable_lora",
            "max_loras",
            "max_cpu_loras",
            "max_lora_rank",
            "tensor_parallel_size",
            "pipeline_parallel_size",
            "data_parallel_size",
            "runner",
            "allowed_local_media_path",
            "allowed_media_domains",
            "limit_mm_per_prompt",
            "seed",
        ),
        members=("create_model_config",),
    ),
    _u(
        "vllm",
        "SamplingParams",
        keywords=(
            "max_tokens",
            "temperature",
            "top_p",
            "top_k",
            "min_p",
            "repetition_penalty",
            "presence_penalty",
            "frequency_penalty",
            "stop",
            "stop_token_ids",
            "ignore_eos",
            "skip_special_tokens",
            "logprobs",
            "n",
            "seed",
            "min_tokens",
            "include_stop_str_in_output",
            "structured_outputs",
            "output_kind",
            # vllm_inline/server/fields.py: vLLM's request fields handed on under their names
            "bad_words",
            "allowed_token_ids",
            "spaces_between_special_tokens",
            "prompt_logprobs",
            "logprob_token_ids",
            "thinking_token_budget",
            "watermarking",
            "stream_interval",
            "repetition_detection",
            "extra_args",
            "logit_bias",
        ),
    ),
    _u(
        "vllm.sampling_params",
        "RepetitionDetectionParams",
        keywords=("max_pattern_size", "min_pattern_size", "min_count"),
    ),
    _u("vllm", "envs"),
    _u("vllm", "PoolingParams", keywords=("task", "use_activation", "dimensions")),
    _u("vllm.config", "StructuredOutputsConfig", keywords=("backend", "disable_any_whitespace")),
    _u("vllm.config", "ParallelConfig"),
    # engine/seam/vllm_platform.py: the KV block size a chosen max_model_len is a multiple of
    _u("vllm.config", "CacheConfig", members=("DEFAULT_BLOCK_SIZE",)),
    _u("vllm.envs", "disable_envs_cache"),
    _u("vllm.envs", "enable_envs_cache"),
    _u("vllm.envs", "VLLM_ENGINE_READY_TIMEOUT_S"),
    # engine/seam/vllm_quiet.py names these as strings (it must not import vLLM): the variables it
    # sets or reads for the engine's processes
    _u("vllm.envs", "VLLM_LOGGING_LEVEL"),
    _u("vllm.envs", "VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS"),
    # engine/seam/vllm_boot.py names these as strings too: the shared-memory queues whose names the
    # engine's processes unlink once every reader has attached
    _u(
        "vllm.distributed.device_communicators.shm_broadcast",
        "MessageQueue",
        members=("wait_until_ready", "buffer"),
    ),
    _u(
        "vllm.distributed.device_communicators.shm_broadcast",
        "ShmRingBuffer",
        members=("is_creator", "shared_memory"),
    ),
    # engine/seam/ipc_directory.py and vllm_boot.py name these as strings: the directory of vLLM's
    # IPC sockets (the owner directory, for every engine process) and the rendezvous file put there
    _u("vllm.envs", "VLLM_RPC_BASE_PATH"),
    _u("vllm.utils.network_utils", "get_open_zmq_ipc_path"),
    _u("vllm.utils.network_utils", "get_file_store_init_method"),
    # engine/seam/vllm_names.py: the CPU communicator's segments, unlinked once every rank joined
    _u(
        "vllm.distributed.device_communicators.cpu_communicator",
        "_CPUSHMDistributed",
        members=("_init_cpu_shm", "make_group_name"),
    ),
    _u("vllm.v1.worker.cpu_worker", "CPUWorker", members=("init_device",)),  # VLLM_DIST_IDENT
    # ... and the variable a CPU engine core forks its workers through, and the manager whose
    # OpenMP variables (OMP_PLACES, KMP_AFFINITY, GOMP_CPU_AFFINITY) a forked worker applies
    _u("vllm.envs", "VLLM_WORKER_MULTIPROC_METHOD"),
    # engine/seam/vllm_processes.py: the name vLLM's CoreEngineProcManager takes its context from
    _u("vllm.v1.engine.utils", "get_mp_context"),
    _u("vllm.utils.ompmultiprocessing", "OMPProcessManager", members=("configure_omp_envs",)),
    _u("vllm.exceptions", "VLLMValidationError", members=("parameter", "value")),
    _u("vllm.lora.request", "LoRARequest"),
    _u("vllm.platforms", "current_platform"),
    _u("vllm.renderers.inputs.preprocess", "parse_model_prompt"),
    _u(
        "vllm.renderers.params",
        "ChatParams",
        keywords=(
            "chat_template",
            "chat_template_kwargs",
            "media_io_kwargs",
            "mm_processor_kwargs",
        ),
    ),
    # engine/seam/vllm_render.py: a request's tokenization options (vLLM's build_tok_params)
    _u(
        "vllm.renderers.params",
        "TokenizeParams",
        keywords=("add_special_tokens", "truncate_prompt_tokens", "truncation_side"),
        members=("with_kwargs",),
    ),
    _u("vllm.sampling_params", "RequestOutputKind", members=("DELTA", "FINAL_ONLY")),
    _u(
        "vllm.sampling_params",
        "StructuredOutputsParams",
        keywords=(
            "json",
            "regex",
            "choice",
            "grammar",
            "json_object",
            "structural_tag",
        ),
    ),
    _u("vllm.utils.gc_utils", "freeze_gc_heap"),
    _u(
        "vllm.v1.engine.async_llm",
        "AsyncLLM",
        members=(
            "from_engine_args",
            "generate",
            "encode",
            "abort",
            "shutdown",
            "add_lora",
            "get_tokenizer",
            "get_supported_tasks",
            "renderer",
            "model_config",
            "vllm_config",
            "errored",
            "output_handler",
        ),
    ),
    _u("vllm.v1.engine.async_llm", "AsyncLLM.from_engine_args", keywords=("stat_loggers",)),
    # engine/stream/generate.py: a request's vLLM options (issue 57: vLLM's session_id)
    _u(
        "vllm.v1.engine.async_llm",
        "AsyncLLM.generate",
        keywords=("lora_request", "priority", "session_id"),
    ),
    # engine/seam/vllm_group.py and vllm_engine.start_engine(client=...): engine cores for several
    # front ends, as run_multi_api_server in vllm/entrypoints/cli/serve.py
    _u(
        "vllm.v1.engine.async_llm",
        "AsyncLLM.from_vllm_config",
        keywords=(
            "stat_loggers",
            "enable_log_requests",
            "disable_log_stats",
            "client_addresses",
            "client_count",
            "client_index",
        ),
    ),
    _u("vllm.engine.arg_utils", "EngineArgs", members=("_api_process_count", "_api_process_rank")),
    _u("vllm.engine.arg_utils", "EngineArgs.create_engine_config"),
    _u("vllm.v1.engine.utils", "EngineZmqAddresses", keywords=("inputs", "outputs")),
    _u("vllm.v1.engine.utils", "launch_core_engines"),
    _u("vllm.v1.engine.utils", "CoreEngineLaunch", members=("engine_manager",)),
    _u("vllm.v1.engine.utils", "CoreEngineProcManager", members=("shutdown", "processes")),
    _u("vllm.v1.executor", "Executor", members=("get_class",)),
    _u(
        "vllm.v1.engine.async_llm",
        "AsyncLLM.generate",
        keywords=(
            "prompt",
            "sampling_params",
            "request_id",
            "lora_request",
            "priority",
        ),
    ),
    _u("vllm.v1.engine.exceptions", "EngineDeadError"),
    _u("vllm.v1.engine.exceptions", "EngineGenerateError"),
    _u(
        "vllm.renderers.base",
        "BaseRenderer",
        members=(
            "render_chat",
            "render_chat_async",
            "render_cmpl_async",
            "default_chat_tok_params",
            "default_cmpl_tok_params",
        ),
    ),
    # engine/seam/vllm_render.py: fill-in-the-middle (the completions' suffix), not in 0.30
    _u(
        "vllm.renderers.base",
        "BaseRenderer",
        members=("render_completion_suffix",),
        since="0.31.0",
    ),
    _u(
        "vllm.config.model",
        "ModelConfig",
        members=(
            "get_diff_sampling_param",
            "runner_type",
            "multimodal_config",
            "is_multimodal_model",
            "allowed_local_media_path",
            "allowed_media_domains",
            "hf_config",
            "get_pooling_task",
            "max_model_len",
        ),
    ),
    # engine/seam/vllm_platform.py: the machine's facts
    _u("vllm.utils.cpu_resource_utils", "get_memory_node_info"),
    _u("vllm.utils.cpu_resource_utils", "get_visible_memory_node"),
    _u("vllm.utils.import_utils", "import_pynvml"),
    # engine/seam/vllm_stats.py: stat loggers
    _u(
        "vllm.v1.metrics.loggers",
        "PrometheusStatLogger",
        members=("_gauge_cls", "_counter_cls", "_histogram_cls"),
    ),
    _u("vllm.v1.metrics.loggers", "StatLoggerBase", members=("record", "log_engine_initialized")),
    # engine/seam/vllm_pooling.py: embeddings and scoring
    _u(
        "vllm.entrypoints.pooling.scoring.io_processor",
        "CrossEncoderIOProcessor",
        keywords=(
            "vllm_config",
            "renderer",
            "chat_template_config",
        ),
        members=("render_async",),
    ),
    _u(
        "vllm.entrypoints.pooling.typing",
        "ScoringRenderParams",
        keywords=(
            "data_1",
            "data_2",
            "chat_template",
            "max_tokens_per_query",
            "max_tokens_per_doc",
            "tok_params",
            "prompt_extras",
            "skip_mm_cache",
            "params",
            "lora_requests",
            "priorities",
        ),
    ),
    _u("vllm.entrypoints.pooling.utils", "enable_scoring_api"),
    _u("vllm.outputs", "ScoringRequestOutput", members=("from_base",)),
    _u("vllm.renderers.chat_utils|vllm.entrypoints.chat_utils", "ChatTemplateConfig"),
    _u("vllm.tasks", "SCORE_TYPE_MAP"),
    # engine/seam/vllm_parsing.py: vLLM's tool and reasoning parsers
    _u("vllm.parser", "ParserManager", members=("get_parser",)),
    _u(
        "vllm.parser",
        "ParserManager.get_parser",
        keywords=(
            "tool_parser_name",
            "reasoning_parser_name",
            "enable_auto_tools",
            "model_name",
        ),
    ),
    _u(
        "vllm.parser.abstract_parser",
        "Parser",
        members=("parse", "parse_delta", "adjust_request"),
    ),
    _u(
        "vllm.parser.abstract_parser",
        "Parser.parse",
        keywords=(
            "request",
            "enable_auto_tools",
            "model_output_token_ids",
        ),
    ),
    _u("vllm.parser.abstract_parser", "Parser.parse_delta", keywords=("finished",)),
    # engine/seam/vllm_parsing.py: the prompt before a whole-output parse, not in 0.30 and 0.31
    _u("vllm.parser.abstract_parser", "Parser", members=("set_prompt_token_ids",), since="0.32.0"),
    _u("vllm.tool_parsers", "ToolParserManager", members=("import_tool_parser",)),
    _u("vllm.reasoning", "ReasoningParserManager"),
    _u("vllm.renderers.chat_utils|vllm.entrypoints.chat_utils", "make_tool_call_id"),
    _u(
        "vllm.entrypoints.openai.chat_completion.protocol",
        "ChatCompletionRequest",
        keywords=(
            "model",
            "messages",
            "tools",
            "tool_choice",
            "chat_template_kwargs",
            "include_reasoning",
            "stream",
            "parallel_tool_calls",
        ),
        members=("skip_special_tokens", "structured_outputs", "include_reasoning", "tools"),
    ),
    # engine/seam/vllm_cli.py: vllm serve's command line, read by its own parser
    _u("vllm.entrypoints.common.cli_args|vllm.entrypoints.launchers.cli_args", "make_arg_parser"),
    _u("vllm.utils.argparse_utils", "FlexibleArgumentParser"),
    # engine/seam/vllm_types.py: the types the package's annotations name (type checking only)
    _u("vllm.config", "ModelConfig"),
    _u("vllm.tokenizers", "TokenizerLike"),
    _u("vllm.v1.engine.async_llm", "AsyncLLM"),
    _u(
        "vllm.v1.metrics.stats",
        "SchedulerStats",
        members=("num_running_reqs", "num_waiting_reqs", "kv_cache_usage", "prefix_cache_stats"),
    ),
    _u(
        "vllm.v1.metrics.stats",
        "IterationStats",
        members=("num_prompt_tokens", "num_generation_tokens", "finished_requests"),
    ),
)
"""Every vLLM name the package uses (engine/seam/), with what it passes and reads."""
