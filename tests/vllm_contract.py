"""Every vLLM module, name, member and keyword vllm-inline uses, and two ways to check them.

:data:`CONTRACT` is the one list. :func:`check_installed` checks it against the vLLM installed
next to the tests (imported); :func:`check_sources` against an unpacked vLLM wheel, parsed with
:mod:`ast` and never imported (how vLLM 0.33, which has no CPU build, is checked: ``make
test-compat``). ``tests/test_vllm_contract.py`` also checks that the list covers every import in
the seam (``engine/_vllm*.py``) and that no other package module imports vLLM.

A :class:`Use` may name several modules: the seam imports the first one that has the name
(vLLM moved it between releases), so one of them must have it.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any


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

    def __str__(self) -> str:
        return f"{'|'.join(self.modules)}:{self.name}"


def _u(module: str, name: str, *, keywords: tuple[str, ...] = (), members: tuple[str, ...] = ()) -> Use:
    return Use(tuple(module.split("|")), name, keywords, members)


CONTRACT: tuple[Use, ...] = (
    # engine/_vllm.py: start, render, sampling, errors; engine/_vllm_lora.py: LoRARequest
    _u("vllm", "AsyncEngineArgs", keywords=(
        "model", "dtype", "max_model_len", "enforce_eager", "gpu_memory_utilization",
        "kv_cache_memory_bytes", "disable_log_stats", "structured_outputs_config", "enable_lora",
        "max_loras", "max_cpu_loras", "max_lora_rank", "tensor_parallel_size",
        "pipeline_parallel_size", "data_parallel_size", "runner", "allowed_local_media_path",
        "allowed_media_domains", "limit_mm_per_prompt", "seed",
    ), members=("create_model_config",)),
    _u("vllm", "SamplingParams", keywords=(
        "max_tokens", "temperature", "top_p", "top_k", "min_p", "repetition_penalty",
        "presence_penalty", "frequency_penalty", "stop", "stop_token_ids", "ignore_eos",
        "skip_special_tokens", "logprobs", "n", "seed", "min_tokens",
        "include_stop_str_in_output", "structured_outputs", "output_kind",
    )),
    _u("vllm", "envs"),
    _u("vllm", "PoolingParams", keywords=("task", "use_activation")),
    _u("vllm.config", "StructuredOutputsConfig", keywords=("backend", "disable_any_whitespace")),
    _u("vllm.config", "ParallelConfig"),
    _u("vllm.envs", "disable_envs_cache"),
    _u("vllm.envs", "enable_envs_cache"),
    _u("vllm.envs", "VLLM_ENGINE_READY_TIMEOUT_S"),
    # engine/_vllm_quiet.py names these as strings (it must not import vLLM): the variables it
    # sets or reads for the engine's processes
    _u("vllm.envs", "VLLM_LOGGING_LEVEL"),
    _u("vllm.envs", "VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS"),
    # engine/_vllm_boot.py names these as strings too: the shared-memory queues whose names the
    # engine's processes unlink once every reader has attached
    _u("vllm.distributed.device_communicators.shm_broadcast", "MessageQueue", members=(
        "wait_until_ready", "buffer",
    )),
    _u("vllm.distributed.device_communicators.shm_broadcast", "ShmRingBuffer", members=(
        "is_creator", "shared_memory",
    )),
    # ... and the variable a CPU engine core forks its workers through, and the manager whose
    # OpenMP variables (OMP_PLACES, KMP_AFFINITY, GOMP_CPU_AFFINITY) a forked worker applies
    _u("vllm.envs", "VLLM_WORKER_MULTIPROC_METHOD"),
    # engine/_vllm_processes.py: the name vLLM's CoreEngineProcManager takes its context from
    _u("vllm.v1.engine.utils", "get_mp_context"),
    _u("vllm.utils.ompmultiprocessing", "OMPProcessManager", members=("configure_omp_envs",)),
    _u("vllm.exceptions", "VLLMValidationError", members=("parameter", "value")),
    _u("vllm.lora.request", "LoRARequest"),
    _u("vllm.platforms", "current_platform"),
    _u("vllm.renderers.inputs.preprocess", "parse_model_prompt"),
    _u("vllm.renderers.params", "ChatParams", keywords=("chat_template", "chat_template_kwargs")),
    _u("vllm.sampling_params", "RequestOutputKind", members=("DELTA", "FINAL_ONLY")),
    _u("vllm.sampling_params", "StructuredOutputsParams", keywords=(
        "json", "regex", "choice", "grammar", "json_object", "structural_tag",
    )),
    _u("vllm.utils.gc_utils", "freeze_gc_heap"),
    _u("vllm.v1.engine.async_llm", "AsyncLLM", members=(
        "from_engine_args", "generate", "encode", "abort", "shutdown", "add_lora",
        "get_tokenizer", "get_supported_tasks", "renderer", "model_config", "vllm_config",
        "errored",
    )),
    _u("vllm.v1.engine.async_llm", "AsyncLLM.from_engine_args", keywords=("stat_loggers",)),
    _u("vllm.v1.engine.async_llm", "AsyncLLM.generate", keywords=(
        "prompt", "sampling_params", "request_id", "lora_request", "priority",
    )),
    _u("vllm.v1.engine.exceptions", "EngineDeadError"),
    _u("vllm.v1.engine.exceptions", "EngineGenerateError"),
    _u("vllm.renderers.base", "BaseRenderer", members=(
        "render_chat", "render_chat_async", "render_cmpl_async", "default_chat_tok_params",
        "default_cmpl_tok_params",
    )),
    _u("vllm.config.model", "ModelConfig", members=(
        "get_diff_sampling_param", "runner_type", "multimodal_config", "is_multimodal_model",
        "allowed_local_media_path", "allowed_media_domains", "hf_config", "get_pooling_task",
        "max_model_len",
    )),
    # engine/_vllm_platform.py: the machine's facts
    _u("vllm.utils.cpu_resource_utils", "get_memory_node_info"),
    _u("vllm.utils.cpu_resource_utils", "get_visible_memory_node"),
    _u("vllm.utils.import_utils", "import_pynvml"),
    # engine/_vllm_stats.py: stat loggers
    _u("vllm.v1.metrics.loggers", "PrometheusStatLogger", members=(
        "_gauge_cls", "_counter_cls", "_histogram_cls",
    )),
    _u("vllm.v1.metrics.loggers", "StatLoggerBase", members=("record", "log_engine_initialized")),
    # engine/_vllm_pooling.py: embeddings and scoring
    _u("vllm.entrypoints.pooling.scoring.io_processor", "CrossEncoderIOProcessor", keywords=(
        "vllm_config", "renderer", "chat_template_config",
    ), members=("render_async",)),
    _u("vllm.entrypoints.pooling.typing", "ScoringRenderParams", keywords=(
        "data_1", "data_2", "chat_template", "max_tokens_per_query", "max_tokens_per_doc",
        "tok_params", "prompt_extras", "skip_mm_cache", "params", "lora_requests", "priorities",
    )),
    _u("vllm.entrypoints.pooling.utils", "enable_scoring_api"),
    _u("vllm.outputs", "ScoringRequestOutput", members=("from_base",)),
    _u("vllm.renderers.chat_utils|vllm.entrypoints.chat_utils", "ChatTemplateConfig"),
    _u("vllm.tasks", "SCORE_TYPE_MAP"),
    # engine/_vllm_parsing.py: vLLM's tool and reasoning parsers
    _u("vllm.parser", "ParserManager", members=("get_parser",)),
    _u("vllm.parser", "ParserManager.get_parser", keywords=(
        "tool_parser_name", "reasoning_parser_name", "enable_auto_tools", "model_name",
    )),
    _u("vllm.parser.abstract_parser", "Parser", members=(
        "parse", "parse_delta", "adjust_request",
    )),
    _u("vllm.parser.abstract_parser", "Parser.parse", keywords=(
        "request", "enable_auto_tools", "model_output_token_ids",
    )),
    _u("vllm.parser.abstract_parser", "Parser.parse_delta", keywords=("finished",)),
    _u("vllm.tool_parsers", "ToolParserManager"),
    _u("vllm.reasoning", "ReasoningParserManager"),
    _u("vllm.renderers.chat_utils|vllm.entrypoints.chat_utils", "make_tool_call_id"),
    _u("vllm.entrypoints.openai.chat_completion.protocol", "ChatCompletionRequest", keywords=(
        "model", "messages", "tools", "tool_choice", "chat_template_kwargs",
        "include_reasoning", "stream",
    ), members=("skip_special_tokens", "structured_outputs", "include_reasoning", "tools")),
)
"""Every vLLM name the package uses (engine/_vllm*.py), with what it passes and reads."""


# -- against the installed vLLM (imported) ------------------------------------------------------


def _resolve_installed(use: Use) -> tuple[Any, str]:
    errors = []
    for module_name in use.modules:
        try:
            obj: Any = importlib.import_module(module_name)
        except ImportError as e:
            errors.append(f"no module {module_name} ({e})")
            continue
        try:
            for part in use.name.split("."):
                obj = getattr(obj, part) if not isinstance(obj, type) else inspect.getattr_static(obj, part)
        except AttributeError:
            errors.append(f"{module_name} has no {use.name}")
            continue
        return obj, module_name
    raise LookupError("; ".join(errors))


def _accepted_installed(obj: Any) -> tuple[set[str], bool]:
    """Keywords ``obj`` accepts, and whether it takes any (``**kwargs``)."""
    if isinstance(obj, (classmethod, staticmethod)):
        obj = obj.__func__
    names: set[str] = set()
    if isinstance(obj, type):
        if dataclasses.is_dataclass(obj):
            names |= {f.name for f in dataclasses.fields(obj)}
        names |= set(getattr(obj, "__struct_fields__", ()))  # msgspec
        names |= set(getattr(obj, "model_fields", {}))  # pydantic
        if names:
            return names, False
    try:
        params = inspect.signature(obj).parameters.values()
    except (TypeError, ValueError):
        return names, True
    any_kw = any(p.kind is p.VAR_KEYWORD for p in params)
    return names | {p.name for p in params}, any_kw


def check_installed(use: Use) -> list[str]:
    """What of ``use`` the installed vLLM lacks (empty when it has everything)."""
    try:
        obj, _ = _resolve_installed(use)
    except LookupError as e:
        return [str(e)]
    problems = []
    if use.keywords:
        accepted, any_kw = _accepted_installed(obj)
        if not any_kw:
            problems += [f"{use}: no keyword {k!r}" for k in use.keywords if k not in accepted]
    for member in use.members:
        if not _has_member_installed(obj, member):
            problems.append(f"{use}: no member {member!r}")
    return problems


def _has_member_installed(cls: Any, member: str) -> bool:
    if hasattr(cls, member):
        return True
    if isinstance(cls, type):
        # Instance attributes set in __init__ (or declared as dataclass/struct/model fields).
        for klass in cls.__mro__:
            if member in getattr(klass, "__annotations__", {}):
                return True
            try:
                source = inspect.getsource(klass)
            except (OSError, TypeError):
                continue
            if f"self.{member} =" in source or f"self.{member}:" in source:
                return True
    return False


# -- against vLLM's sources (parsed, not imported) ---------------------------------------------


class Sources:
    """An unpacked vLLM wheel: the directory that holds the ``vllm`` package."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._trees: dict[str, ast.Module | None] = {}
        self._packages: set[str] = set()

    def module(self, name: str) -> ast.Module | None:
        if name not in self._trees:
            base = self.root.joinpath(*name.split("."))
            for path in (base.with_suffix(".py"), base / "__init__.py"):
                if path.is_file():
                    self._trees[name] = ast.parse(path.read_text(encoding="utf-8"))
                    if path.name == "__init__.py":
                        self._packages.add(name)
                    break
            else:
                self._trees[name] = None
        return self._trees[name]

    def find(self, module: str, name: str, depth: int = 0) -> tuple[str, ast.AST] | None:
        """The definition of ``module.name``: ``(defining module, node)``, following imports."""
        tree = self.module(module)
        if tree is None or depth > 8:
            return None
        for node in tree.body:
            found = _defines(node, name)
            if found is not None:
                return module, found
        for node in ast.walk(tree):  # re-exports, also inside ``if TYPE_CHECKING`` / try
            if isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    if (alias.asname or alias.name) == name:
                        source = _absolute(module, node, module in self._packages)
                        hit = self.find(source, alias.name, depth + 1)
                        if hit is None and self.module(f"{source}.{alias.name}") is not None:
                            return f"{source}.{alias.name}", self.module(f"{source}.{alias.name}")
                        if hit is not None:
                            return hit
        if self.module(f"{module}.{name}") is not None:  # a submodule (``from vllm import envs``)
            return f"{module}.{name}", self.module(f"{module}.{name}")
        # vLLM's lazy top-level exports: MODULE_ATTRS = {"Name": ".module:Name", ...}
        for node in ast.walk(tree):
            if isinstance(node, ast.Dict):
                for key, value in zip(node.keys, node.values):
                    if (isinstance(key, ast.Constant) and key.value == name
                            and isinstance(value, ast.Constant) and isinstance(value.value, str)):
                        target, _, attr = value.value.partition(":")
                        target = module + target if target.startswith(".") else target
                        return self.find(target, attr or name, depth + 1)
        if module.endswith(".envs") or module == "vllm.envs":
            # vllm.envs declares its variables in ``environment_variables = {"NAME": ...}``.
            for node in ast.walk(tree):
                if isinstance(node, ast.Constant) and node.value == name:
                    return module, node
        return None

    def method(
        self, module: str, cls: ast.ClassDef, name: str, depth: int = 0
    ) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
        """The method ``name`` of ``cls`` or of the first base (found) that defines it."""
        for node in cls.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
                return node
        if depth < 8:
            for base in cls.bases:
                base_name = base.id if isinstance(base, ast.Name) else getattr(base, "attr", None)
                hit = self.find(module, base_name) if base_name else None
                if hit is not None and isinstance(hit[1], ast.ClassDef):
                    found = self.method(hit[0], hit[1], name, depth + 1)
                    if found is not None:
                        return found
        return None

    def class_members(self, module: str, cls: ast.ClassDef, depth: int = 0) -> set[str]:
        """Names a class defines or sets on ``self``, with those of the bases found."""
        names: set[str] = set()
        for node in ast.walk(cls):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                names.add(node.name)
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names.add(node.target.id)
            elif isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        names.add(target.id)
            if isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    if (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
                            and target.value.id == "self"):
                        names.add(target.attr)
        if depth < 8:
            for base in cls.bases:
                base_name = base.id if isinstance(base, ast.Name) else getattr(base, "attr", None)
                if base_name is None:
                    continue
                hit = self.find(module, base_name)
                if hit is not None and isinstance(hit[1], ast.ClassDef):
                    names |= self.class_members(hit[0], hit[1], depth + 1)
        return names


def _absolute(module: str, node: ast.ImportFrom, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    parts = module.split(".")
    # In a package's __init__, level 1 is the package itself; in a module, its parent.
    base = parts[: len(parts) - node.level + (1 if is_package else 0)]
    return ".".join([*base, node.module] if node.module else base)


def _defines(node: ast.AST, name: str) -> ast.AST | None:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
        return node
    if isinstance(node, ast.Assign):
        for target in node.targets:
            if isinstance(target, ast.Name) and target.id == name:
                return node
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name:
        return node
    if isinstance(node, (ast.If, ast.Try)):
        for child in [*node.body, *getattr(node, "orelse", []), *getattr(node, "finalbody", [])]:
            found = _defines(child, name)
            if found is not None:
                return found
    return None


def _function_keywords(node: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[set[str], bool]:
    args = node.args
    names = {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]}
    return names, args.kwarg is not None


def check_sources(use: Use, sources: Sources) -> list[str]:
    """What of ``use`` the vLLM at ``sources`` lacks, read from its parsed sources."""
    head, _, member = use.name.partition(".")
    hit = None
    for module in use.modules:
        hit = sources.find(module, head)
        if hit is not None:
            break
    if hit is None:
        return [f"{use}: not found in {sources.root}"]
    module, node = hit
    if member:
        if not isinstance(node, ast.ClassDef):
            return [f"{use}: {head} is not a class"]
        method = sources.method(module, node, member)
        if method is None:
            return [f"{use}: no member {member!r}"]
        node = method
    problems = []
    if use.keywords:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            accepted, any_kw = _function_keywords(node)
        elif isinstance(node, ast.ClassDef):
            accepted, any_kw = sources.class_members(module, node), False
            init = sources.method(module, node, "__init__")
            if init is not None:
                init_names, any_kw = _function_keywords(init)
                accepted |= init_names
        else:
            accepted, any_kw = set(), True
        if not any_kw:
            problems += [f"{use}: no keyword {k!r}" for k in use.keywords if k not in accepted]
    if use.members and not isinstance(node, ast.ClassDef):
        problems.append(f"{use}: not a class, so it has no members {use.members}")
    elif use.members:
        members = sources.class_members(module, node)
        problems += [f"{use}: no member {m!r}" for m in use.members if m not in members]
    return problems


def seam_imports(paths: list[Path]) -> Iterator[tuple[Path, str, str]]:
    """``(file, module, name)`` for every ``from vllm... import name`` in ``paths``."""
    for path in paths:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and not node.level and node.module and (
                node.module == "vllm" or node.module.startswith("vllm.")
            ):
                for alias in node.names:
                    yield path, node.module, alias.name
