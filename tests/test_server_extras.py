"""``vllm_inline/server/extras.py``, the pure converters of vLLM's extra response fields, on
hand-made deltas (no engine; tests/test_server_requests.py and tests/test_server_parity.py check
them on real engines, against ``vllm serve``)."""

from __future__ import annotations

from vllm_inline.engine import Delta
from vllm_inline.engine.stream.deltas import RankedLogprob, TokenLogprob, ToolCallDelta
from vllm_inline.engine.stream.openai_format import (
    chunk_from_delta,
    completion_from_deltas,
    text_completion_from_deltas,
)
from vllm_inline.server.extras import (
    chat_extras,
    chat_stream_extras,
    echo_text,
    prompt_logprobs_json,
    text_choice_extras,
    text_logprobs,
)

META = {"id": "chatcmpl-1", "model": "m", "created": 0}
CALLS = (
    ToolCallDelta(0, "call_0", "get_weather", '{"city": "Oslo"}'),
    ToolCallDelta(1, "call_1", "get_time", "{}"),
)


def decode(ids: object) -> str:
    return "<decoded>"


def test_parallel_tool_calls_false_keeps_the_first_call() -> None:
    deltas = [Delta(tool_calls=CALLS, finish_reason="tool_calls", token_ids=(5, 6))]
    whole = completion_from_deltas(deltas, **META)
    kept = chat_extras(whole, deltas, {"parallel_tool_calls": False}, decode)
    assert [c["function"]["name"] for c in kept["choices"][0]["message"]["tool_calls"]] == [
        "get_weather"
    ]
    both = chat_extras(completion_from_deltas(deltas, **META), deltas, {}, decode)
    assert len(both["choices"][0]["message"]["tool_calls"]) == 2
    chunk = chat_stream_extras(
        chunk_from_delta(deltas[0], **META), deltas[0], {"parallel_tool_calls": False}, decode
    )
    assert [c["index"] for c in chunk["choices"][0]["delta"]["tool_calls"]] == [0]


def test_echo_takes_the_last_message_of_the_answers_role() -> None:
    prefilled = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "The"}]
    assert echo_text({"messages": prefilled, "echo": True}) == "The"
    assert echo_text({"messages": prefilled[:1], "echo": True}) == ""  # a user's turn: no echo
    no_prompt = {"messages": prefilled[:1], "echo": True, "add_generation_prompt": False}
    assert echo_text(no_prompt) == "Hi"  # the answer continues the last message's role
    parts = [{"role": "assistant", "content": [{"type": "text", "text": "a"}, {"text": "b"}]}]
    assert echo_text({"messages": parts, "echo": True}) == "a\nb"
    assert echo_text({"messages": prefilled}) == ""


def test_prompt_logprobs_and_token_ids() -> None:
    step = (RankedLogprob(7, float("-inf"), 3, "x"), RankedLogprob(8, -0.5, 1, "y"))
    first = Delta(text="ok", token_ids=(9,), prompt_token_ids=(1, 7), prompt_logprobs=(None, step))
    assert prompt_logprobs_json(first.prompt_logprobs) == [
        None,
        {
            "7": {"logprob": -9999.0, "rank": 3, "decoded_token": "x"},
            "8": {"logprob": -0.5, "rank": 1, "decoded_token": "y"},
        },
    ]
    last = Delta(text="!", token_ids=(10,), finish_reason="stop")
    whole = completion_from_deltas([first, last], **META)
    body = {"return_token_ids": True, "return_prompt_text": True}
    out = chat_extras(whole, [first, last], body, decode)
    assert out["prompt_token_ids"] == [1, 7] and out["choices"][0]["token_ids"] == [9, 10]
    assert out["prompt_text"] == "<decoded>"


def test_legacy_completion_logprobs() -> None:
    steps = [
        2,  # the prompt's first token: no logprob
        TokenLogprob("He", 5, -0.1, (("She", -2.0), ("It", -3.0)), (6, 7)),
        TokenLogprob("llo", 8, -0.2, (("llo", -0.2),), (8,)),
    ]
    out = text_logprobs(steps, 1, False, lambda ids: "<s>")
    assert out == {
        "text_offset": [0, 3, 5],
        "token_logprobs": [None, -0.1, -0.2],
        "tokens": ["<s>", "He", "llo"],
        "top_logprobs": [None, {"He": -0.1, "She": -2.0}, {"llo": -0.2}],
    }
    as_ids = text_logprobs(steps[1:], 0, True, decode)
    assert as_ids["tokens"] == ["token_id:5", "token_id:8"]
    assert as_ids["top_logprobs"] == [{"token_id:5": -0.1}, {"token_id:8": -0.2}]


def test_echo_of_messages_that_are_no_list_is_nothing() -> None:
    """The engine refuses such messages with a 400 first; the echo must not fail before it."""
    assert echo_text({"messages": {"a": 1}, "echo": True}) == ""
    assert echo_text({"messages": "Hi", "echo": True}) == ""
    assert echo_text({"messages": [], "echo": True}) == ""


def _text_choice(delta: Delta) -> dict[str, object]:
    return text_completion_from_deltas([[delta]], **META)["choices"][0]


def test_echo_without_generation_shows_the_prompt_alone() -> None:
    step = (RankedLogprob(7, -0.5, 1, "x"),)
    one = TokenLogprob("!", 9, -0.1, (("?", -2.0),), (10,))
    delta = Delta(
        text="!",
        token_ids=(9,),
        logprobs=(one,),
        finish_reason="length",
        prompt_token_ids=(1, 7),
        prompt_logprobs=(None, step),
    )
    body = {"echo": True, "max_tokens": 0, "logprobs": 1}
    choice = text_choice_extras(_text_choice(delta), [delta], body, "<s>x", decode)
    assert choice["text"] == "<s>x"  # the prompt, not the token generated for it
    assert choice["logprobs"]["tokens"] == ["<decoded>", "x"]
    assert choice["logprobs"]["token_logprobs"] == [None, -0.5]
    as_ids = {**body, "return_token_ids": True}
    choice = text_choice_extras(_text_choice(delta), [delta], as_ids, "<s>x", decode)
    assert choice["text"] == "" and choice["token_ids"] == [9]  # vLLM's way with the ids
    assert choice["prompt_token_ids"] == [1, 7]
    generated = text_choice_extras(_text_choice(delta), [delta], {"echo": True}, "<s>x", decode)
    assert generated["text"] == "<s>x!"


def test_logprob_token_ids_list_every_alternative() -> None:
    """As vLLM's ``return_all``: the asked tokens' logprobs are all listed, whatever ``logprobs``
    (0 would keep only the sampled token)."""
    one = TokenLogprob("a", 1, -0.1, (("b", -2.0), ("c", -3.0)), (2, 3))
    delta = Delta(text="a", token_ids=(1,), logprobs=(one,), finish_reason="length")
    body = {"logprobs": 0, "logprob_token_ids": [2, 3]}
    choice = text_choice_extras(_text_choice(delta), [delta], body, "", decode)
    assert choice["logprobs"]["top_logprobs"] == [{"a": -0.1, "b": -2.0, "c": -3.0}]
    cut = text_choice_extras(_text_choice(delta), [delta], {"logprobs": 0}, "", decode)
    assert cut["logprobs"]["top_logprobs"] == [{"a": -0.1}]
