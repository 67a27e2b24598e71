"""Holding up like a server (issue 6), on real engines with scripted models.

- a cancellation storm through the engine, ``ChatVLLM`` and LlamaIndex ``VLLM`` (the storm of
  ``benchmarks/stress.py``, scaled down): the engine drains within a second, no thread is left
  behind and the next request answers normally;
- eight threads, each running its own event loops in turn plus synchronous streams, on one engine;
- bad input through both integrations: a typed error naming the parameter and the value, raised
  before work starts, and the engine serving the next request (the engine's own cases are in
  ``test_engine_errors.py``);
- a model whose tokenizer has no chat template and no known family;
- logging: one line per engine start, nothing per token.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import logging
import shutil
import sys
import threading
from pathlib import Path
from typing import Any

import psutil
import pytest
from langchain_core.messages import ChatMessage as LCChatMessage
from langchain_core.messages import HumanMessage
from llama_index.core.base.llms.types import AudioBlock, ChatMessage, MessageRole

from vllm_inline.engine import (
    BadRequestError,
    ChatTemplateError,
    ContextLengthExceededError,
    EngineDeadError,
    ModelLoadError,
    get_engine,
)
from vllm_inline.engine.life.templates import require_template, resolve_chat_template
from vllm_inline.integrations.langchain import ChatVLLM
from vllm_inline.integrations.llama_index import VLLM

pytestmark = pytest.mark.engine

USER = [{"role": "user", "content": "hi"}]
LI_USER = [ChatMessage(role="user", content="hi")]
QUESTION = "hi"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
TOO_LONG = "word " * 2000  # far past max_model_len=512


def _load_stress() -> Any:
    path = Path(__file__).resolve().parent.parent / "benchmarks" / "stress.py"
    spec = importlib.util.spec_from_file_location("vllm_inline_stress", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


stress = _load_stress()


def _first_words(answer: str, n: int) -> str:
    return " ".join(answer.split(" ")[:n])


# -- cancellation storm ----------------------------------------------------------------------


async def test_cancellation_storm_drains_and_the_engine_answers_next(scripted):
    """210 streams, 32 at a time, every path x every way of leaving (10 rounds of 3 x 7)."""
    s = scripted("long")
    engine = s.engine
    paths = stress.make_paths(s.path, s.engine_kwargs)
    for path in paths.values():  # warm: engine up, lazy imports done
        assert path.answer() == s.scenario.answer
    threads_before = {t.ident for t in threading.enumerate()}

    result = await stress.storm(list(paths.values()), 210, 32, timeout=60)

    assert not result.errors, result.errors[:3]
    assert result.by_style == {style: 30 for style in stress.STYLES}
    drained = await stress.adrain(engine, timeout=1.0)
    assert drained is not None, (
        f"{engine.num_unfinished_requests()} requests still running after 1 s"
    )
    leftover = [t for t in threading.enumerate() if t.ident not in threads_before]
    assert not leftover, leftover
    for name, path in paths.items():
        assert path.answer() == s.scenario.answer, name
    text = "".join([d.text async for d in engine.astream(USER, max_tokens=3)])
    assert text == _first_words(s.scenario.answer, 3)


# -- threads and event loops -----------------------------------------------------------------


def test_eight_threads_with_their_own_event_loops_and_sync_streams(scripted):
    """Each thread runs ``asyncio.run`` five times (engine, ChatVLLM and VLLM in turn) and
    streams synchronously through all three, all against one engine at once."""
    s = scripted("chatml")
    engine = s.engine
    chat = ChatVLLM(model=s.path, vllm_kwargs=s.engine_kwargs)
    llm = VLLM(model=s.path, vllm_kwargs=s.engine_kwargs)
    answer = s.scenario.answer

    async def engine_async() -> str:
        return "".join([d.text async for d in engine.astream(USER)])

    async def chat_async() -> str:
        return "".join([str(c.content) async for c in chat.astream(QUESTION)])

    async def llm_async() -> str:
        return (await llm.achat(LI_USER)).message.content or ""

    def sync_calls() -> list[str]:
        return [
            "".join(d.text for d in engine.stream(USER)),
            "".join(str(c.content) for c in chat.stream(QUESTION)),
            "".join(r.delta or "" for r in llm.stream_chat(LI_USER)),
        ]

    coros = (engine_async, chat_async, llm_async)
    start = threading.Barrier(8)
    results: dict[int, list[str]] = {}
    errors: list[BaseException] = []

    def worker(k: int) -> None:
        try:
            start.wait(30)
            out = []
            for i in range(5):
                out.append(asyncio.run(coros[(k + i) % 3]()))
                if i % 2 == 0:
                    out.extend(sync_calls())
            results[k] = out
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,), name=f"loops-{k}") for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(240)
    assert not any(t.is_alive() for t in threads)
    assert not errors, errors[:3]
    assert sorted(results) == list(range(8))
    for k, texts in results.items():
        assert texts == [answer] * 14, (k, texts)
    assert engine.num_unfinished_requests() == 0


# -- bad input through the integrations ------------------------------------------------------
# (call, error type, parameter named by the error or None for errors with no parameter, text the
# message must contain). ``tmp`` is a directory with a model config but no tokenizer.


def _lc(s: Any, **kwargs: Any) -> ChatVLLM:
    return ChatVLLM(model=s.path, vllm_kwargs=s.engine_kwargs, **kwargs)


LANGCHAIN_BAD = [
    ("empty-messages", lambda c, s, tmp: c.invoke([]), BadRequestError, "messages", "empty"),
    (
        "unknown-role",
        lambda c, s, tmp: c.invoke([LCChatMessage(role="wizard", content="hi")]),
        BadRequestError,
        "messages[0].role",
        "wizard",
    ),
    (
        "audio-content",
        lambda c, s, tmp: c.invoke(
            [HumanMessage([{"type": "audio", "base64": "AA", "mime_type": "audio/wav"}])]
        ),
        BadRequestError,
        "messages[0].content[0]",
        "audio",
    ),
    (
        "prompt-longer-than-context",
        lambda c, s, tmp: c.invoke(TOO_LONG),
        ContextLengthExceededError,
        "messages",
        "maximum context length is 512 tokens",
    ),
    (
        "max-tokens-over-context",
        lambda c, s, tmp: c.invoke(QUESTION, max_tokens=100_000),
        BadRequestError,
        "max_tokens",
        "100000",
    ),
    (
        "max-tokens-negative",
        lambda c, s, tmp: list(c.stream(QUESTION, max_tokens=-3)),
        BadRequestError,
        "max_tokens",
        "-3",
    ),
    (
        "top-p-above-one",
        lambda c, s, tmp: c.invoke(QUESTION, top_p=1.5),
        BadRequestError,
        "top_p",
        "1.5",
    ),
    ("n-zero", lambda c, s, tmp: c.invoke(QUESTION, n=0), BadRequestError, "n", "n=0"),
    (
        "stop-not-strings",
        lambda c, s, tmp: c.invoke(QUESTION, stop=[1, 2]),
        BadRequestError,
        "stop",
        "[1, 2]",
    ),
    (
        "malformed-tool",
        lambda c, s, tmp: c.bind(tools=[{"type": "function"}]).invoke(QUESTION),
        BadRequestError,
        "tools[0]",
        "'type': 'function'",
    ),
    (
        "tool-choice-without-tools",
        lambda c, s, tmp: c.invoke(QUESTION, tool_choice="get_weather"),
        BadRequestError,
        "tool_choice",
        "get_weather",
    ),
    (
        "invalid-json-schema",
        lambda c, s, tmp: c.bind(structured_outputs={"json": {"type": "no-such-type"}}).invoke(
            QUESTION
        ),
        BadRequestError,
        "structured_outputs",
        "structured_outputs",
    ),
    (
        "unknown-reasoning-parser",
        lambda c, s, tmp: c.invoke(QUESTION, reasoning_parser="no_such_parser"),
        BadRequestError,
        "reasoning_parser",
        "no_such_parser",
    ),
    (
        "chat-template-not-a-template",
        lambda c, s, tmp: _lc(s, chat_template="no-such-file.jinja").invoke(QUESTION),
        ChatTemplateError,
        "chat_template",
        "no-such-file.jinja",
    ),
    (
        "missing-model-path",
        lambda c, s, tmp: ChatVLLM(model="/no/such/model/dir").invoke(QUESTION),
        ModelLoadError,
        None,
        "/no/such/model/dir",
    ),
    (
        "model-dir-without-tokenizer",
        lambda c, s, tmp: ChatVLLM(model=str(tmp)).invoke(QUESTION),
        ModelLoadError,
        None,
        "no tokenizer",
    ),
    (
        "unknown-vllm-kwargs-key",
        lambda c, s, tmp: ChatVLLM(
            model=s.path, vllm_kwargs={**s.engine_kwargs, "no_such_option": 1}
        ).invoke(QUESTION),
        ModelLoadError,
        None,
        "no_such_option",
    ),
]


def _li(s: Any, **kwargs: Any) -> VLLM:
    return VLLM(model=s.path, vllm_kwargs=s.engine_kwargs, **kwargs)


LLAMA_INDEX_BAD = [
    (
        "unknown-role",
        lambda m, s, tmp: m.chat([ChatMessage(role=MessageRole.FUNCTION, content="hi")]),
        BadRequestError,
        "messages[0].role",
        "function",
    ),
    (
        "audio-block",
        lambda m, s, tmp: m.chat(
            [ChatMessage(role="user", blocks=[AudioBlock(url="http://x/a.wav")])]
        ),
        BadRequestError,
        "messages[0].blocks[0]",
        "audio",
    ),
    (
        "prompt-longer-than-context",
        lambda m, s, tmp: m.complete(TOO_LONG),
        ContextLengthExceededError,
        "messages",
        "maximum context length is 512 tokens",
    ),
    (
        "max-tokens-over-context",
        lambda m, s, tmp: list(m.stream_chat(LI_USER, max_tokens=100_000)),
        BadRequestError,
        "max_tokens",
        "100000",
    ),
    (
        "max-tokens-negative",
        lambda m, s, tmp: m.chat(LI_USER, max_tokens=-1),
        BadRequestError,
        "max_tokens",
        "-1",
    ),
    (
        "temperature-negative",
        lambda m, s, tmp: m.complete("hi", temperature=-0.1),
        BadRequestError,
        "temperature",
        "-0.1",
    ),
    (
        "top-p-above-one",
        lambda m, s, tmp: m.chat(LI_USER, top_p=1.5),
        BadRequestError,
        "top_p",
        "1.5",
    ),
    ("n-zero", lambda m, s, tmp: m.chat(LI_USER, n=0), BadRequestError, "n", "n=0"),
    (
        "stop-not-strings",
        lambda m, s, tmp: m.chat(LI_USER, stop=[1]),
        BadRequestError,
        "stop",
        "[1]",
    ),
    (
        "malformed-tool",
        lambda m, s, tmp: m.chat(LI_USER, tools=[{"type": "function", "function": {"name": ""}}]),
        BadRequestError,
        "tools[0].function.name",
        "''",
    ),
    (
        "tool-choice-unknown-tool",
        lambda m, s, tmp: m.chat(LI_USER, tools=[WEATHER], tool_choice="get_time"),
        BadRequestError,
        "tool_choice",
        "get_time",
    ),
    (
        "invalid-json-schema",
        lambda m, s, tmp: m.chat(LI_USER, structured_outputs={"json": {"type": "no-such-type"}}),
        BadRequestError,
        "structured_outputs",
        "structured_outputs",
    ),
    (
        "unknown-tool-parser",
        lambda m, s, tmp: _li(s, tool_parser="no_such_parser").chat(LI_USER, tools=[WEATHER]),
        BadRequestError,
        "tool_parser",
        "no_such_parser",
    ),
    (
        "unknown-reasoning-parser",
        lambda m, s, tmp: _li(s, reasoning_parser="no_such_parser").chat(LI_USER),
        BadRequestError,
        "reasoning_parser",
        "no_such_parser",
    ),
    (
        "missing-model-path",
        lambda m, s, tmp: VLLM(model="/no/such/model/dir").chat(LI_USER),
        ModelLoadError,
        None,
        "/no/such/model/dir",
    ),
    (
        "model-dir-without-tokenizer",
        lambda m, s, tmp: VLLM(model=str(tmp)).chat(LI_USER),
        ModelLoadError,
        None,
        "no tokenizer",
    ),
    (
        "unknown-vllm-kwargs-key",
        lambda m, s, tmp: VLLM(
            model=s.path, vllm_kwargs={**s.engine_kwargs, "no_such_option": 1}
        ).chat(LI_USER),
        ModelLoadError,
        None,
        "no_such_option",
    ),
]


@pytest.fixture(scope="module")
def no_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("no-tokenizer")
    (path / "config.json").write_text("{}")
    return path


def _check_refused(info: pytest.ExceptionInfo, parameter: str | None, text: str) -> None:
    error = info.value
    assert text in str(error), str(error)
    if parameter is not None:
        assert error.parameter == parameter, (error.parameter, str(error))
        if not isinstance(error, ContextLengthExceededError):  # that one names "your prompt"
            assert parameter.split("[")[0].split(".")[0] in str(error)


@pytest.mark.parametrize(
    ("call", "error", "parameter", "text"),
    [pytest.param(c, e, p, t, id=i) for i, c, e, p, t in LANGCHAIN_BAD],
)
def test_langchain_bad_input_is_refused_and_the_engine_keeps_serving(
    scripted, no_tokenizer_dir, call, error, parameter, text
):
    s = scripted("chatml")
    s.engine.start()  # max_tokens over the context is checked against the running engine
    chat = _lc(s)
    with pytest.raises(error) as info:
        call(chat, s, no_tokenizer_dir)
    _check_refused(info, parameter, text)
    assert s.engine.num_unfinished_requests() == 0
    assert chat.invoke(QUESTION).content == s.scenario.answer


@pytest.mark.parametrize(
    ("call", "error", "parameter", "text"),
    [pytest.param(c, e, p, t, id=i) for i, c, e, p, t in LLAMA_INDEX_BAD],
)
def test_llama_index_bad_input_is_refused_and_the_engine_keeps_serving(
    scripted, no_tokenizer_dir, call, error, parameter, text
):
    s = scripted("chatml")
    s.engine.start()
    llm = _li(s)
    with pytest.raises(error) as info:
        call(llm, s, no_tokenizer_dir)
    _check_refused(info, parameter, text)
    assert s.engine.num_unfinished_requests() == 0
    assert llm.chat(LI_USER).message.content == s.scenario.answer


async def test_bad_input_on_async_paths_is_raised_before_any_chunk(scripted):
    s = scripted("chatml")
    chat, llm = _lc(s), _li(s)
    with pytest.raises(BadRequestError) as info:
        async for _ in chat.astream([LCChatMessage(role="wizard", content="hi")]):
            raise AssertionError("no chunk may come before the error")
    assert info.value.parameter == "messages[0].role"
    with pytest.raises(BadRequestError) as info:
        await llm.astream_chat(LI_USER, stop=[1])  # raised by the call, before the generator
    assert info.value.parameter == "stop"
    assert (await llm.achat(LI_USER)).message.content == s.scenario.answer


# -- a tokenizer with no chat template and no known family -----------------------------------


def test_no_template_and_no_family_is_a_chat_template_error():
    """The engine's template choice is a pure function of the tokenizer."""
    choice = resolve_chat_template(None, vocab={}, override=None)
    assert choice.source == "none"
    with pytest.raises(ChatTemplateError) as info:
        require_template(choice, "some/model")
    assert info.value.parameter == "chat_template"
    assert "chat_template=" in str(info.value) and "some/model" in str(info.value)


def _strip_chat_format(src: Path, dst: Path) -> None:
    """Copy a scripted ChatML model; drop its chat template and rename the ChatML markers
    (same ids, so the weights still follow the script)."""
    shutil.copytree(src, dst)
    renames = {"<|im_start|>": "<|turn_begin|>", "<|im_end|>": "<|turn_end|>"}
    text = (dst / "tokenizer.json").read_text()
    for old, new in renames.items():
        text = text.replace(json.dumps(old)[1:-1], json.dumps(new)[1:-1])
    (dst / "tokenizer.json").write_text(text)
    config = json.loads((dst / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    for key in ("eos_token", "bos_token", "pad_token", "unk_token"):
        config[key] = renames.get(config.get(key), config.get(key))
    (dst / "tokenizer_config.json").write_text(json.dumps(config))
    for jinja in dst.glob("*.jinja"):
        jinja.unlink()


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


class _capture_vllm_inline_log:
    """Every record of the ``vllm_inline`` logger (and its children), DEBUG and up."""

    def __enter__(self) -> list[logging.LogRecord]:
        self.logger = logging.getLogger("vllm_inline")
        self.level = self.logger.level
        self.handler = _Records()
        self.logger.setLevel(logging.DEBUG)
        self.logger.addHandler(self.handler)
        return self.handler.records

    def __exit__(self, *exc: object) -> None:
        self.logger.removeHandler(self.handler)
        self.logger.setLevel(self.level)


@pytest.fixture(scope="module")
def templateless(scripted, tmp_path_factory):
    """A private engine on a model with no chat template and no family markers, with the log
    records of its start."""
    s = scripted("chatml")
    path = tmp_path_factory.mktemp("templateless") / "model"
    _strip_chat_format(Path(s.path), path)
    engine = get_engine(str(path), **{**s.engine_kwargs, "seed": 60601})
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with _capture_vllm_inline_log() as records:
        engine.start()
    engine.processes = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
    yield s, engine, records
    engine.shutdown()


def test_templateless_model_refuses_chats_but_takes_prompts(templateless):
    s, engine, _ = templateless
    assert engine.stop_policy.template_source == "none" and engine.stop_policy.family is None
    with pytest.raises(ChatTemplateError) as info:
        list(engine.stream(USER))
    assert info.value.parameter == "chat_template"
    assert "no chat template" in str(info.value) and "chat_template=" in str(info.value)
    assert engine.num_unfinished_requests() == 0
    # A pre-formatted prompt needs no template: the completion script, stopped at its EOS.
    deltas = list(engine.stream(prompt=s.scenario.completion_prompt))
    assert "".join(d.text for d in deltas) == s.scenario.completion.answer
    assert deltas[-1].finish_reason == "stop"
    # And the remedy the error names works.
    deltas = list(
        engine.stream(
            USER, chat_template="{% for m in messages %}{{ m.content }}{% endfor %}", max_tokens=3
        )
    )
    assert deltas[-1].finish_reason is not None


def test_one_log_line_per_engine_start(templateless):
    _, engine, records = templateless
    infos = [r for r in records if r.levelno == logging.INFO]
    assert len(infos) == 1, [r.getMessage() for r in records]
    line = infos[0].getMessage()
    assert engine.model in line
    assert "template=none" in line
    assert str(list(engine.stop_policy.stop_token_ids)) in line
    assert "\n" not in line


def test_no_logging_per_token(scripted):
    engine = scripted("long").engine
    engine.start()
    with _capture_vllm_inline_log() as records:
        deltas = list(engine.stream(USER, max_tokens=100, ignore_eos=True))
    assert len(deltas) > 50
    assert records == []


async def test_engine_death_ends_integration_streams_with_the_engine_error(templateless):
    """Runs last on the private engine: its engine-core dies under a ChatVLLM stream and a
    VLLM stream; both end with EngineDeadError (no hang) and the next calls say what happened.
    (Restarting is proven in tests/parallel/test_own_engines.py.)"""
    s, engine, _ = templateless
    assert engine.processes  # engine core (and its worker), started by the fixture
    kwargs = {**s.engine_kwargs, "seed": 60601}
    chat = ChatVLLM(
        model=engine.model,
        vllm_kwargs=kwargs,
        max_tokens=400,
        extra_sampling={"ignore_eos": True},
        chat_template="{% for m in messages %}{{ m.content }}{% endfor %}",
    )
    llm = VLLM(
        model=engine.model,
        vllm_kwargs=kwargs,
        max_tokens=400,
        additional_kwargs={"ignore_eos": True},
    )
    sync_stream = chat.stream(QUESTION)
    next(sync_stream)
    async_stream = await llm.astream_complete(s.scenario.completion_prompt, formatted=True)
    await async_stream.__anext__()
    for p in engine.processes:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass

    async def drain_async() -> None:
        async for _ in async_stream:
            pass

    with pytest.raises(EngineDeadError):
        await asyncio.wait_for(drain_async(), 60)
    with pytest.raises(EngineDeadError):
        await asyncio.wait_for(asyncio.to_thread(lambda: [c for c in sync_stream]), 60)
    with pytest.raises(EngineDeadError, match="restart"):
        await chat.ainvoke(QUESTION)
    with pytest.raises(EngineDeadError, match="restart"):
        llm.complete(s.scenario.completion_prompt, formatted=True)
    engine.shutdown()  # a dead engine lets go; used again, it would start afresh
    assert engine.num_unfinished_requests() == 0
