"""LlamaIndex ``VLLM``: exports, import cost, converters and bad input (no engine needed)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from llama_index.core.base.llms.types import (
    ChatMessage,
    ImageBlock,
    TextBlock,
    ThinkingBlock,
    ToolCallBlock,
)

from vllm_inline.engine import BadRequestError, Delta, ToolCallDelta, Usage
from vllm_inline.integrations import llama_index as li
from vllm_inline.integrations.llama_index import VLLM
from vllm_inline.integrations.llama_index.tools import tool_selections
from vllm_inline.integrations.llama_index.utils import (
    ResponseBuilder,
    aggregate,
    to_engine_messages,
)

NO_MODEL = "/nonexistent/vllm-inline-model"  # never started: every error comes first


@pytest.mark.smoke
def test_all_is_pinned() -> None:
    assert li.__all__ == ["VLLM", "VLLMEmbedding", "VLLMRerank"]


@pytest.mark.smoke
def test_import_loads_neither_torch_nor_vllm() -> None:
    code = (
        "import sys; import vllm_inline.integrations.llama_index as m; m.VLLM; "
        "print(sorted(k for k in ('torch', 'vllm', 'transformers') if k in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_fields_and_class_name() -> None:
    llm = VLLM(model=NO_MODEL, vllm_kwargs={"max_model_len": 256}, temperature=0.2, stop=["X"])
    assert VLLM.class_name() == "VLLMInline"
    assert (llm.temperature, llm.stop, llm.max_tokens) == (0.2, ["X"], None)
    # max_model_len given: metadata needs no engine (and starts none).
    meta = llm.metadata
    assert (meta.context_window, meta.is_chat_model, meta.is_function_calling_model) == (
        256,
        True,
        False,
    )
    assert meta.model_name == NO_MODEL
    assert not llm.engine.started
    assert VLLM(
        model=NO_MODEL, tool_parser="hermes", vllm_kwargs={"max_model_len": 256}
    ).metadata.is_function_calling_model


# -- bad input: typed errors before any work ---------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "parameter"),
    [
        ({"temperature": -0.5}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"max_tokens": 0}, "max_tokens"),
    ],
)
def test_bad_constructor_values(kwargs: dict, parameter: str) -> None:
    with pytest.raises(BadRequestError) as e:
        VLLM(model=NO_MODEL, **kwargs)
    assert e.value.parameter == parameter


_TOOL_NO_ID = [ChatMessage(role="user", content="hi"), ChatMessage(role="tool", content="42")]
_IMAGE = [
    ChatMessage(role="user", blocks=[TextBlock(text="see"), ImageBlock(url="http://x/y.png")])
]


@pytest.mark.parametrize(
    ("messages", "kwargs", "parameter"),
    [
        ([ChatMessage(role="user", content="hi")], {"temperature": -1.0}, "temperature"),
        ([ChatMessage(role="user", content="hi")], {"top_p": 0}, "top_p"),
        ([], {}, "messages"),
        (_TOOL_NO_ID, {}, "messages[1].additional_kwargs['tool_call_id']"),
        (_IMAGE, {}, "messages[0].content[1]"),  # a remote URL: refused up front
        ([ChatMessage(role="user", content="hi")], {"n": 2}, "n"),
    ],
)
@pytest.mark.parametrize("method", ["chat", "stream_chat"])
def test_bad_call_input_fails_before_work(messages, kwargs, parameter, method) -> None:
    llm = VLLM(model=NO_MODEL)
    with pytest.raises(BadRequestError) as e:
        getattr(llm, method)(messages, **kwargs)  # streaming too: raised before the generator
    assert e.value.parameter == parameter
    assert isinstance(e.value, ValueError)
    assert not llm.engine.started


@pytest.mark.parametrize("method", ["achat", "astream_chat"])
async def test_bad_call_input_fails_before_work_async(method) -> None:
    llm = VLLM(model=NO_MODEL)
    with pytest.raises(BadRequestError):
        await getattr(llm, method)([ChatMessage(role="user", content="hi")], temperature=-1)


def test_stop_given_both_ways_is_refused() -> None:
    with pytest.raises(BadRequestError, match="stop"):
        VLLM(model=NO_MODEL, stop=["a"]).chat([ChatMessage(role="user", content="hi")], stop=["b"])


# -- converters ----------------------------------------------------------------------------


def test_messages_to_engine_dicts() -> None:
    call = ToolCallBlock(tool_call_id="c1", tool_name="get_weather", tool_kwargs={"city": "Oslo"})
    messages = [
        ChatMessage(role="system", content="sys"),
        ChatMessage(role="user", blocks=[TextBlock(text="a"), TextBlock(text="b")]),
        ChatMessage(
            role="assistant", blocks=[ThinkingBlock(content="hmm"), TextBlock(text=""), call]
        ),
        ChatMessage(role="tool", content="sunny", additional_kwargs={"tool_call_id": "c1"}),
        ChatMessage(
            role="assistant",
            content="",
            additional_kwargs={
                "tool_calls": [{"id": "c2", "function": {"name": "f", "arguments": "{}"}}]
            },
        ),
    ]
    assert to_engine_messages(messages) == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "a\nb"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
                }
            ],
        },
        {"role": "tool", "content": "sunny", "tool_call_id": "c1"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "c2", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ],
        },
    ]


def test_response_builder_folds_deltas() -> None:
    builder = ResponseBuilder()
    deltas = [
        Delta(reasoning="think"),
        Delta(text="Hi"),
        Delta(tool_calls=(ToolCallDelta(index=0, id="c1", name="get_weather"),)),
        Delta(tool_calls=(ToolCallDelta(index=0, arguments='{"city": '),)),
        Delta(
            tool_calls=(ToolCallDelta(index=0, arguments='"Oslo"}'),),
            finish_reason="tool_calls",
            usage=Usage(5, 4),
        ),
    ]
    responses = [builder.push(d) for d in deltas]
    assert [r.delta for r in responses] == ["", "Hi", "", "", ""]
    assert responses[0].additional_kwargs == {"thinking_delta": "think"}
    # Partial arguments parse as far as they go; the end has the full call.
    assert tool_selections(responses[3].message.blocks)[0].tool_name == "get_weather"
    last = responses[-1]
    assert last.message.content == "Hi"
    assert (
        isinstance(last.message.blocks[0], ThinkingBlock)
        and last.message.blocks[0].content == "think"
    )
    assert last.message.additional_kwargs["reasoning_content"] == "think"
    (selection,) = tool_selections(last.message.blocks)
    assert (selection.tool_id, selection.tool_name, selection.tool_kwargs) == (
        "c1",
        "get_weather",
        {"city": "Oslo"},
    )
    assert last.additional_kwargs == {
        "prompt_tokens": 5,
        "completion_tokens": 4,
        "total_tokens": 9,
        "cached_tokens": 0,
        "finish_reason": "tool_calls",
    }
    assert last.raw["usage"] == {
        "prompt_tokens": 5,
        "completion_tokens": 4,
        "total_tokens": 9,
        "cached_tokens": 0,
    }
    assert aggregate(iter(responses)).delta is None  # the non-streaming answer
