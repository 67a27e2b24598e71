"""``vllm_inline/server/requests.py``'s checks that need no engine: the request shapes that
``vllm serve``'s request models refuse are refused here too, naming the field, before any work
(tests/test_server_requests.py sends the fields that reach the engine)."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from vllm_inline.engine import BadRequestError
from vllm_inline.server.fields import fields_of, refused_fields, to_engine
from vllm_inline.server.limits import Limits
from vllm_inline.server.requests import (
    chat_kwargs,
    check_unknown,
    completion_kwargs,
    echo_without_generation,
)

HELLO = [{"role": "user", "content": "Hello"}]
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {}}}
LOGGER = "vllm_inline.server"


@pytest.mark.parametrize("choice", ["auto", "required", {"type": "function", "function": {}}])
def test_a_tool_choice_without_tools_is_refused(choice: Any) -> None:
    with pytest.raises(BadRequestError, match="`tools` must be set") as raised:
        chat_kwargs({"messages": HELLO, "tool_choice": choice})
    assert raised.value.parameter == "tool_choice"


@pytest.mark.parametrize("tools", [[], [TOOL]])
def test_a_tool_choice_with_tools_or_none_is_taken(tools: list[Any]) -> None:
    kwargs = chat_kwargs({"messages": HELLO, "tools": tools, "tool_choice": "auto"})
    assert kwargs.get("tool_choice") == ("auto" if tools else None)
    assert "tool_choice" not in chat_kwargs({"messages": HELLO, "tool_choice": "none"})


@pytest.mark.parametrize("kwargs_of", [chat_kwargs, completion_kwargs])
def test_stream_options_without_stream_are_refused(kwargs_of: Any) -> None:
    body = {"messages": HELLO, "prompt": "Hi", "stream_options": {"include_usage": True}}
    with pytest.raises(BadRequestError, match="stream=True") as raised:
        kwargs_of(body)
    assert raised.value.parameter == "stream_options"
    kwargs_of({**body, "stream": True})  # taken with stream


# -- logprobs, echo (issue-57 review) ------------------------------------------------------------


def test_logprob_token_ids_ask_for_no_count() -> None:
    """As vLLM's to_sampling_params: with ``logprob_token_ids`` the engine gets ``logprobs=None``
    (SamplingParams refuses a count other than the ids'), and the ids."""
    chat = chat_kwargs(
        {"messages": HELLO, "logprobs": True, "top_logprobs": 1, "logprob_token_ids": [3, 5]}
    )
    assert "logprobs" not in chat and chat["logprob_token_ids"] == [3, 5]
    text = completion_kwargs({"prompt": "Hi", "logprobs": 0, "logprob_token_ids": [3, 5]})
    assert "logprobs" not in text and text["logprob_token_ids"] == [3, 5]
    assert chat_kwargs({"messages": HELLO, "logprobs": True, "top_logprobs": 2})["logprobs"] == 2


def test_echo_without_generation_asks_for_one_token() -> None:
    """lm-evaluation-harness' loglikelihood request: the prompt's logprobs, no answer."""
    body = {"prompt": "Hi", "echo": True, "max_tokens": 0, "logprobs": 1}
    assert echo_without_generation(body)
    kwargs = completion_kwargs(body)
    assert kwargs["max_tokens"] == 1 and kwargs["prompt_logprobs"] == 1
    assert not echo_without_generation({**body, "echo": False})
    assert not echo_without_generation({**body, "max_tokens": False})
    with pytest.raises(BadRequestError) as raised:
        completion_kwargs({**body, "logprob_token_ids": [3]})
    assert raised.value.parameter == "logprob_token_ids"


# -- bad shapes: a 400 naming the field, not a 500 ------------------------------------------------

BAD_BODIES = {
    "chat_template_kwargs": ({"chat_template_kwargs": "x"}, "body.chat_template_kwargs"),
    "json_schema not a mapping": (
        {"response_format": {"type": "json_schema", "json_schema": "x"}},
        "body.response_format.json_schema",
    ),
    "json_schema missing": ({"response_format": {"type": "json_schema"}}, "response_format"),
    "schema missing": (
        {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
        "body.response_format.json_schema.schema",
    ),
    "stream_options": ({"stream": True, "stream_options": "x"}, "body.stream_options"),
    "stream_options list": ({"stream": True, "stream_options": [1]}, "body.stream_options"),
    "structured_outputs with response_format": (
        {"structured_outputs": "x", "response_format": {"type": "json_object"}},
        "body.structured_outputs",
    ),
    "request_id": ({"request_id": 5}, "body.request_id"),
}


@pytest.mark.parametrize("kwargs_of", [chat_kwargs, completion_kwargs])
@pytest.mark.parametrize("case", list(BAD_BODIES))
def test_a_bad_shape_is_a_400_naming_the_field(kwargs_of: Any, case: str) -> None:
    body, param = BAD_BODIES[case]
    with pytest.raises(BadRequestError) as raised:
        kwargs_of({"messages": HELLO, "prompt": "Hi", **body})
    assert raised.value.parameter == param


def test_a_json_schema_keeps_its_schema() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    kwargs = chat_kwargs({"messages": HELLO, "response_format": fmt})
    assert kwargs["structured_outputs"] == {"json": schema}


# -- unknown fields ---------------------------------------------------------------------------------


def test_unknown_fields_are_warned_about_once_per_set(caplog: pytest.LogCaptureFixture) -> None:
    def logged() -> list[tuple[int, str]]:
        return [(r.levelno, r.getMessage()) for r in caplog.records if r.name == LOGGER]

    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        for _ in range(3):
            check_unknown({"model": "m", "frobnicate_once": 1}, ("model",), Limits())
        check_unknown({"frobnicate_once": 1, "zap_once": 2}, (), Limits())
        check_unknown({"model": "m"}, ("model",), Limits())  # nothing unknown: no line
    line = "The following fields were present in the request but ignored: %s"
    assert logged() == [
        (logging.WARNING, line % {"frobnicate_once"}),
        (logging.DEBUG, line % {"frobnicate_once"}),
        (logging.DEBUG, line % {"frobnicate_once"}),
        (logging.WARNING, line % {"frobnicate_once", "zap_once"}),
    ]
    with pytest.raises(BadRequestError) as raised:
        check_unknown({"frobnicate_once": 1}, (), Limits(strict_fields=True))
    assert raised.value.parameter == "frobnicate_once"


def test_the_tables_are_worked_out_once() -> None:
    """Read on every request: the same objects each time, not rebuilt."""
    assert fields_of("chat") is fields_of("chat") and "messages" in fields_of("chat")
    assert to_engine("completion") is to_engine("completion")
    assert [name for name, _ in refused_fields("completion")] == [
        "use_beam_search",
        "prompt_embeds",
        "kv_transfer_params",
        "ec_transfer_params",
    ]


def test_models_of_any_kind_for_the_tokenizer_routes() -> None:
    """``/tokenize`` serves every model (vllm serve's tokenizer routes): ``find(None, ...)``."""
    from vllm_inline.engine import Engine
    from vllm_inline.server.models import ModelNotFoundError, ServedModel, ServedModels

    embed, chat = ServedModel("e", Engine("e"), "embedding"), ServedModel("c", Engine("c"), "chat")
    models = ServedModels([embed, chat])
    assert models.find(None, None) is chat and models.find(None, "e") is embed
    assert ServedModels([embed]).find(None, None) is embed
    with pytest.raises(ModelNotFoundError):
        models.find(None, "x")
    with pytest.raises(ModelNotFoundError, match="does not serve this route"):
        models.find("chat", "e")
