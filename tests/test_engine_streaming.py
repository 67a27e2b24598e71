"""The engine on real vLLM with scripted models: streaming, stops, usage, templates, sampling."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from vllm_inline.engine import Delta, get_engine

FAMILIES = ["llama3", "chatml", "gemma"]
USER = [{"role": "user", "content": "What is SFCR?"}]


def _joined(deltas: list[Delta]) -> str:
    return "".join(d.text for d in deltas)


async def _acollect(engine, messages=USER, **kwargs) -> list[Delta]:
    return [d async for d in engine.astream(messages, **kwargs)]


@pytest.mark.parametrize("family", FAMILIES)
def test_sync_stream_stops_at_end_of_turn(scripted, family):
    s = scripted(family)
    deltas = list(s.engine.stream(USER))
    text = _joined(deltas)
    assert len(deltas) > 1
    assert text == s.scenario.answer
    assert s.scenario.hallucinated_tail.strip() not in text
    for token in s.scenario.special_tokens:
        assert token not in text
    last = deltas[-1]
    assert last.finish_reason == "stop"
    assert all(d.finish_reason is None and d.usage is None for d in deltas[:-1])


@pytest.mark.parametrize("family", FAMILIES)
async def test_async_stream_matches_sync_and_counts_real_tokens(scripted, family):
    s = scripted(family)
    engine = s.engine
    deltas = await _acollect(engine)
    sync_text = _joined(list(engine.stream(USER)))
    assert _joined(deltas) == sync_text == s.scenario.answer
    usage = deltas[-1].usage
    tok = engine.tokenizer
    prompt_ids = tok.apply_chat_template(USER, add_generation_prompt=True, tokenize=False)
    assert usage.prompt_tokens == len(tok.encode(prompt_ids, add_special_tokens=False))
    # Every generated id is in some delta, including the stop token that ended the turn.
    generated = [i for d in deltas for i in d.token_ids]
    assert usage.completion_tokens == len(generated)
    assert tok.decode(generated, skip_special_tokens=True) == s.scenario.answer
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def test_no_delta_repeats_earlier_text(scripted):
    s = scripted("long")
    deltas = list(s.engine.stream(USER, max_tokens=40))
    pieces = [d.text for d in deltas]
    assert all(pieces)  # empty-text deltas are dropped
    assert "".join(pieces) == s.scenario.answer[: len("".join(pieces))]


def test_max_tokens_ends_with_length(scripted):
    s = scripted("long")
    deltas = list(s.engine.stream(USER, max_tokens=5))
    assert deltas[-1].finish_reason == "length"
    assert deltas[-1].usage.completion_tokens == 5
    assert s.scenario.answer.startswith(_joined(deltas))


def test_ignore_eos_shows_what_the_stop_policy_prevents(scripted):
    """Without the stop policy the scripted model runs into its invented turn."""
    s = scripted("llama3")
    text = _joined(
        list(s.engine.stream(USER, ignore_eos=True, max_tokens=9, skip_special_tokens=False))
    )
    assert "<|eot_id|>" in text and "User:" in text


def test_stop_policy_has_every_end_of_turn_token(scripted):
    policy = scripted("llama3").engine.stop_policy
    assert {"<|eot_id|>", "<|end_of_text|>"} <= set(policy.stop_tokens)
    assert policy.template_source == "tokenizer"
    assert policy.family == "llama3"
    assert scripted("gemma").engine.stop_policy.family == "gemma"
    assert "<end_of_turn>" in scripted("gemma").engine.stop_policy.stop_tokens


@pytest.mark.parametrize("stop", [" is", [" complete", "zzz"], "answer is"])
def test_user_stop_strings_cut_and_are_never_half_emitted(scripted, stop):
    s = scripted("llama3")
    deltas = list(s.engine.stream(USER, stop=stop))
    text = _joined(deltas)
    first = min(
        (
            s.scenario.answer.find(x)
            for x in ([stop] if isinstance(stop, str) else stop)
            if x in s.scenario.answer
        ),
    )
    assert text == s.scenario.answer[:first]
    assert deltas[-1].finish_reason == "stop"
    assert deltas[-1].stop_reason in ([stop] if isinstance(stop, str) else stop)
    for d in deltas:  # no piece of a stop string leaks, even partially
        assert not any(x in d.text for x in ([stop] if isinstance(stop, str) else stop))


def test_multi_turn_renders_through_the_model_template(scripted):
    s = scripted("chatml")
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello"},
        {"role": "user", "content": [{"type": "text", "text": "Again"}]},
    ]
    deltas = list(s.engine.stream(messages))
    assert _joined(deltas) == s.scenario.answer
    tok = s.engine.tokenizer
    rendered = tok.apply_chat_template(
        [
            {**m, "content": m["content"] if isinstance(m["content"], str) else "Again"}
            for m in messages
        ],
        add_generation_prompt=True,
        tokenize=False,
    )
    assert deltas[-1].usage.prompt_tokens == len(tok.encode(rendered, add_special_tokens=False))


async def test_prompt_token_ids_are_what_a_request_prefills(scripted):
    from vllm_inline.engine import BadRequestError

    s = scripted("chatml")
    engine = s.engine
    messages = [{"role": "system", "content": "Be brief."}, *USER]
    ids = engine.prompt_token_ids(messages)
    tok = engine.tokenizer
    rendered = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert ids == tok.encode(rendered, add_special_tokens=False)
    assert await engine.aprompt_token_ids(messages) == ids
    deltas = list(engine.stream(messages))
    assert deltas[-1].usage.prompt_tokens == len(ids)
    # The same rendering options as a request: an override template, a pre-formatted prompt.
    assert engine.prompt_token_ids(messages, chat_template="{{ messages[-1]['content'] }}") == (
        tok.encode(USER[0]["content"], add_special_tokens=False)
    )
    assert engine.prompt_token_ids(prompt="Hello") == tok.encode("Hello")
    with pytest.raises(BadRequestError) as info:
        engine.prompt_token_ids([])
    assert info.value.parameter == "messages"


def test_chat_prompts_render_alike_on_and_off_the_loop(scripted, monkeypatch):
    """Short chat prompts are rendered on the engine loop, longer ones (and images) in vLLM's
    renderer pool (``render.OFFLOAD_CHARS``): the same tokens either way."""
    import importlib

    seam = importlib.import_module("vllm_inline.engine.seam.vllm_render")
    render = importlib.import_module("vllm_inline.engine.request.render")
    engine = scripted("chatml").engine
    messages = [{"role": "system", "content": "Be brief."}, *USER]
    offloaded = []
    real = seam.render_chat

    async def spy(*args, **kwargs):
        offloaded.append(kwargs["offload"])
        return await real(*args, **kwargs)

    monkeypatch.setattr(seam, "render_chat", spy)
    on_the_loop = engine.prompt_token_ids(messages)
    monkeypatch.setattr(render, "OFFLOAD_CHARS", len("Be brief.") + len(USER[0]["content"]) - 1)
    assert engine.prompt_token_ids(messages) == on_the_loop
    assert offloaded == [False, True]


def test_a_sync_call_on_the_engine_loop_thread_is_refused(scripted):
    engine = scripted("chatml").engine
    ids = engine.prompt_token_ids(USER)

    async def on_the_engine_loop():  # e.g. a callback vLLM runs there
        return engine.prompt_token_ids(USER)

    with pytest.raises(RuntimeError, match=r"await engine\.aprompt_token_ids"):
        engine.runtime.loop.submit(on_the_engine_loop()).result(timeout=60)
    assert engine.prompt_token_ids(USER) == ids  # and it keeps serving


def test_preformatted_prompt_is_sent_as_is(scripted):
    s = scripted("llama3")
    deltas = list(s.engine.stream(prompt=s.scenario.completion_prompt))
    assert _joined(deltas) == s.scenario.completion.answer
    assert deltas[-1].finish_reason == "stop"


def test_sampling_defaults_layer_under_the_call(scripted):
    engine = scripted("llama3").engine
    defaults = engine.default_sampling
    assert defaults["max_tokens"] == 512
    # The scripted Llama 3 ships generation_config temperature 0.6 / top_p 0.9 (as Meta's does);
    # AsyncLLM would ignore them, the engine applies them under vllm-inline's defaults.
    assert defaults["temperature"] == pytest.approx(0.6)
    assert defaults["top_p"] == pytest.approx(0.9)
    assert defaults["repetition_penalty"] == pytest.approx(1.1)


def test_logprobs_and_n(scripted):
    s = scripted("chatml")
    deltas = list(s.engine.stream(USER, logprobs=2, temperature=0))
    assert all(d.logprobs is not None for d in deltas)
    tokens = [lp.token for d in deltas for lp in d.logprobs]
    assert "".join(tokens).startswith(s.scenario.answer[:5])
    many = list(s.engine.stream(USER, n=2, temperature=1.0))
    by_choice: dict[int, str] = {}
    for d in many:
        by_choice[d.index] = by_choice.get(d.index, "") + d.text
    assert by_choice == {0: s.scenario.answer, 1: s.scenario.answer}
    assert sum(1 for d in many if d.usage) == 1


async def test_cancelling_a_stream_aborts_the_request(scripted):
    engine = scripted("long").engine
    # break out of an async stream
    async for _ in engine.astream(USER, max_tokens=200, ignore_eos=True):
        break

    # cancel a task mid-stream
    async def consume():
        async for _ in engine.astream(USER, max_tokens=200, ignore_eos=True):
            await asyncio.sleep(0)

    task = asyncio.create_task(consume())
    await asyncio.sleep(0.3)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # close a sync iterator; drop another one to the garbage collector
    it = engine.stream(USER, max_tokens=200, ignore_eos=True)
    next(it)
    it.close()
    it2 = engine.stream(USER, max_tokens=200, ignore_eos=True)
    next(it2)
    del it2
    for _ in range(50):
        if engine.num_unfinished_requests() == 0:
            break
        await asyncio.sleep(0.05)
    assert engine.num_unfinished_requests() == 0
    # and the engine answers normally afterwards
    assert _joined(await _acollect(engine, max_tokens=3)) == " ".join(
        scripted("long").scenario.answer.split(" ")[:3]
    )


def test_astream_from_several_event_loops_and_threads(scripted):
    s = scripted("gemma")
    engine = s.engine

    def one_loop() -> str:
        return _joined(asyncio.run(_acollect(engine)))

    assert one_loop() == one_loop() == s.scenario.answer  # two loops in turn

    results: list[str] = []
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            results.append(one_loop())
            results.append(_joined(list(engine.stream(USER))))
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors
    assert results == [s.scenario.answer] * 8


async def test_concurrent_streams_share_the_engine(scripted):
    s = scripted("chatml")
    outs = await asyncio.gather(*(_acollect(s.engine) for _ in range(8)))
    assert [_joined(o) for o in outs] == [s.scenario.answer] * 8


def test_same_model_and_options_give_the_same_engine(scripted):
    s = scripted("llama3")
    assert get_engine(s.path, **s.engine_kwargs) is s.engine
    assert get_engine(s.path, **{**s.engine_kwargs, "max_model_len": 256}) is not s.engine


def test_coalesce_joins_a_choices_pending_deltas_only() -> None:
    from vllm_inline.engine.stream.deltas import Delta, Usage, coalesce

    a, b = Delta(text="Hel", token_ids=(1,)), Delta(text="lo", token_ids=(2,))
    end = Delta(text=".", token_ids=(3,), finish_reason="stop", usage=Usage(4, 3))
    other = Delta(text="x", token_ids=(9,), index=1)
    assert coalesce([a, b, end]) == [
        Delta(text="Hello.", token_ids=(1, 2, 3), finish_reason="stop", usage=Usage(4, 3))
    ]
    assert coalesce([a, other, b]) == [a, other, b]  # two choices stay apart
    assert coalesce([end, a]) == [end, a]  # nothing joins after a finished choice


def test_a_consumer_that_falls_behind_gets_the_missed_deltas_joined(scripted) -> None:
    s = scripted("long")
    kw = {"ignore_eos": True, "max_tokens": 200}
    steady = list(s.engine.stream(USER, **kw))
    late = []
    for delta in s.engine.stream(USER, **kw):
        late.append(delta)
        if len(late) == 2:
            time.sleep(1.0)  # the engine keeps going meanwhile
    assert _joined(late) == _joined(steady)
    assert sum(len(d.token_ids) for d in late) == sum(len(d.token_ids) for d in steady) == 200
    assert len(late) < len(steady), "the deltas that piled up arrive as fewer, larger ones"
    assert late[-1].usage == steady[-1].usage or late[-1].usage.completion_tokens == 200


def test_a_consumer_that_falls_behind_still_gets_the_deadline(scripted) -> None:
    """While a consumer lags, its request waits for it on the engine loop; a deadline that
    passes then still ends the stream with RequestTimeoutError and aborts the request."""
    from vllm_inline.engine import RequestTimeoutError

    engine = scripted("long").engine
    late = []
    with pytest.raises(RequestTimeoutError):
        for delta in engine.stream(USER, ignore_eos=True, max_tokens=200, timeout=1.0):
            late.append(delta)
            if len(late) == 1:
                time.sleep(2.0)
    assert sum(len(d.token_ids) for d in late) < 200
    deadline = time.monotonic() + 10
    while engine.num_unfinished_requests() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert engine.num_unfinished_requests() == 0


def test_each_choice_starts_with_the_prompts_ids_and_logprobs_when_asked(scripted):
    """``n=2``: the first delta of each choice carries the prompt's ids (with
    ``return_prompt_token_ids``) and logprobs (with ``prompt_logprobs``), as vLLM's server puts
    them on every choice; a request that asks for neither gets neither, streamed or not."""
    engine = scripted("llama3").engine
    messages = [{"role": "user", "content": "Hello"}]
    prompt = tuple(engine.prompt_token_ids(messages))
    for stream in (True, False):
        deltas = list(
            engine.stream(
                messages,
                n=2,
                max_tokens=3,
                prompt_logprobs=0,
                return_prompt_token_ids=True,
                stream=stream,
            )
        )
        for index in (0, 1):
            first = next(d for d in deltas if d.index == index)
            assert first.prompt_token_ids == prompt
            assert first.prompt_logprobs is not None and len(first.prompt_logprobs) == len(prompt)
            later = [d for d in deltas if d.index == index and d is not first]
            assert all(d.prompt_token_ids is d.prompt_logprobs is None for d in later)
        plain = list(engine.stream(messages, n=2, max_tokens=3, stream=stream))
        assert all(d.prompt_token_ids is d.prompt_logprobs is None for d in plain)
