"""Bad input: a typed error that names the parameter and the value, raised before any work,
and the engine keeps serving the next request."""

from __future__ import annotations

import pytest

from vllm_inline.engine import (
    BadRequestError,
    ChatTemplateError,
    ContextLengthExceededError,
    ModelLoadError,
    get_engine,
)

USER = [{"role": "user", "content": "hi"}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}

BAD_REQUESTS = [
    # (id, messages, kwargs, parameter named in the error)
    ("empty-messages", [], {}, "messages"),
    ("messages-not-a-list", "hello", {}, "messages"),
    ("message-without-role", [{"content": "hi"}], {}, "messages[0].role"),
    ("unknown-role", [{"role": "wizard", "content": "hi"}], {}, "messages[0].role"),
    (
        "image-content",
        [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
        {},
        "messages[0].content[0]",
    ),
    ("none-content", [{"role": "user", "content": None}], {}, "messages[0].content"),
    (
        "tool-without-id",
        [*USER, {"role": "tool", "content": "sunny"}],
        {},
        "messages[1].tool_call_id",
    ),
    ("max-tokens-zero", USER, {"max_tokens": 0}, "max_tokens"),
    ("max-tokens-negative", USER, {"max_tokens": -5}, "max_tokens"),
    ("max-tokens-over-context", USER, {"max_tokens": 100_000}, "max_tokens"),
    ("temperature-negative", USER, {"temperature": -0.5}, "temperature"),
    ("temperature-not-a-number", USER, {"temperature": "hot"}, "temperature"),
    ("top-p-zero", USER, {"top_p": 0}, "top_p"),
    ("top-p-above-one", USER, {"top_p": 1.5}, "top_p"),
    ("n-zero", USER, {"n": 0}, "n"),
    ("stop-not-strings", USER, {"stop": [1, 2]}, "stop"),
    ("stop-empty-string", USER, {"stop": ""}, "stop"),
    ("unknown-sampling-key", USER, {"temprature": 0.3}, "temprature"),
    ("malformed-tool", USER, {"tools": [{"type": "function"}]}, "tools[0]"),
    (
        "tool-params-not-object",
        USER,
        {
            "tools": [
                {"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}
            ]
        },
        "tools[0].function.parameters",
    ),
    (
        "tool-choice-unknown-tool",
        USER,
        {"tools": [WEATHER], "tool_choice": "get_time"},
        "tool_choice",
    ),
    ("tool-choice-without-tools", USER, {"tool_choice": "required"}, "tool_choice"),
    ("unknown-tool-parser", USER, {"tools": [WEATHER], "tool_parser": "nope"}, "tool_parser"),
    ("unknown-reasoning-parser", USER, {"reasoning_parser": "nope"}, "reasoning_parser"),
    (
        "invalid-json-schema",
        USER,
        {"structured_outputs": {"json": {"type": "no-such-type"}}},
        "structured_outputs",
    ),
    (
        "structured-outputs-not-a-mapping",
        USER,
        {"structured_outputs": "json"},
        "structured_outputs",
    ),
    ("parallel-tool-calls-not-a-bool", USER, {"parallel_tool_calls": "no"}, "parallel_tool_calls"),
    (
        "return-prompt-token-ids-not-a-bool",
        USER,
        {"return_prompt_token_ids": "yes"},
        "return_prompt_token_ids",
    ),
    (
        "two-structured-kinds",
        USER,
        {"structured_outputs": {"json": {"type": "object"}, "regex": "a+"}},
        "structured_outputs",
    ),
]


@pytest.mark.parametrize(
    ("messages", "kwargs", "parameter"),
    [pytest.param(m, k, p, id=i) for i, m, k, p in BAD_REQUESTS],
)
def test_bad_request_is_typed_and_engine_keeps_serving(scripted, messages, kwargs, parameter):
    s = scripted("chatml")
    engine = s.engine
    with pytest.raises(BadRequestError) as info:
        list(engine.stream(messages, **kwargs))
    assert info.value.parameter == parameter
    assert parameter.split("[")[0].split(".")[0] in str(info.value) or parameter in str(info.value)
    assert engine.num_unfinished_requests() == 0
    assert "".join(d.text for d in engine.stream(USER)) == s.scenario.answer


async def test_bad_request_async_is_raised_before_work(scripted):
    engine = scripted("chatml").engine
    with pytest.raises(BadRequestError) as info:
        async for _ in engine.astream(USER, top_p=2.0):
            pass
    assert info.value.parameter == "top_p" and info.value.value == 2.0


def test_prompt_longer_than_context(scripted):
    s = scripted("chatml")
    long = [{"role": "user", "content": "word " * 2000}]
    with pytest.raises(ContextLengthExceededError) as info:
        list(s.engine.stream(long))
    assert "context" in str(info.value)
    assert "".join(d.text for d in s.engine.stream(USER)) == s.scenario.answer


def test_template_that_refuses_the_messages(scripted):
    s = scripted("gemma")
    with pytest.raises(ChatTemplateError):
        list(s.engine.stream(USER, chat_template="{{ raise_exception('no chats here') }}"))


def test_chat_template_override_that_is_not_a_template(scripted):
    with pytest.raises(ChatTemplateError) as info:
        list(scripted("gemma").engine.stream(USER, chat_template="no-such-file.jinja"))
    assert info.value.parameter == "chat_template"


def test_missing_model_path():
    with pytest.raises(ModelLoadError, match="does not exist"):
        list(get_engine("/no/such/model/dir").stream(USER))


def test_model_directory_without_tokenizer(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ModelLoadError, match="no tokenizer"):
        get_engine(str(tmp_path)).start()


def test_unknown_engine_option(scripted):
    s = scripted("chatml")
    with pytest.raises(ModelLoadError, match="no_such_option"):
        get_engine(s.path, no_such_option=1).start()


@pytest.mark.parametrize("seed", [-1, 2**32, "7", True])
def test_engine_seed_out_of_range_is_refused_before_any_start(scripted, seed):
    # vLLM 0.34's ModelConfig refuses it; 0.30-0.33 fail later in the worker's numpy seeding
    s = scripted("chatml")
    with pytest.raises(ModelLoadError, match=r"seed=.*0 to 2\*\*32 - 1"):
        get_engine(s.path, seed=seed).start()


def test_invalid_model_argument():
    with pytest.raises(ModelLoadError):
        get_engine("")
