"""Greedy parity with transformers on Gemma 3 270M, through every public surface.

The engine, ``ChatVLLM`` (``invoke``, ``stream``, ``batch``) and LlamaIndex ``VLLM`` (``chat``,
``stream_chat``, ``complete``) must generate the same token ids as transformers' ``generate``
on the same prompt ids, at repetition penalty 1.0 and 1.1 (:data:`vllm_inline.checks.parity.PENALTIES`),
on two engines: the engine's own CPU defaults (no ``vllm_kwargs``, the README snippet: bfloat16
where the CPU has bf16 instructions, float32 elsewhere) and float32. The reference runs in the
engine's dtype (:class:`vllm_inline.checks.parity.ReferenceModel`, what ``python -m vllm_inline check``
uses). Both sides decode a fixed number of tokens with end-of-sequence ignored, as the check does.

In float32 every surface must give exactly the reference's ids. In bfloat16 exact parity is not
a property of the engine: measured here (2026-12-01), Gemma 3's next-token logits after "Write
one sentence about the sea.\n" are 1.32 and 1.30 for its two best tokens in float32, 0.83 and
0.81 in transformers' bfloat16, and vLLM's bfloat16 kernels rank them the other way round (at
repetition penalty 1.1, raw ``vllm.LLM`` too), and other near-ties follow. So in bfloat16 the
engine must agree with the reference on at least :data:`MIN_BF16_PREFIX` tokens (the check fails
only a different first token), and every integration surface must give exactly the engine's own
greedy ids.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import pytest

from vllm_inline.checks.parity import ONE_TURN, PENALTIES, ReferenceModel, compare, engine_greedy
from vllm_inline.engine import Engine, get_engine

MAX_TOKENS = 32
MIN_BF16_PREFIX = 1
"""Tokens the bfloat16 engine and reference must share: the check's rule (only a different first
token fails). Measured here: 32 and 9 of 32 on SEA at penalty 1.0 and 1.1, 32 and 4 on LONG."""
SEA = ONE_TURN
RAINBOW = [{"role": "user", "content": "Name the colours of the rainbow."}]
# Longer than Gemma 3's 512-token sliding window, so its local-attention layers see a window
# that does not cover the whole prompt (a scripted model has no sliding window at all).
LONG = [
    {
        "role": "user",
        "content": " ".join(
            f"Item {i}: the {i}th lighthouse stands on rock number {i}." for i in range(36)
        )
        + " Which lighthouse stands on rock number 24?",
    }
]

GEMMA_OPTIONS: dict[str, dict[str, Any]] = {
    "cpu-defaults": {},
    # The CPU defaults would size this engine's KV cache for four sequences of Gemma's
    # 32k-token window (about 4 GiB in float32, slow to allocate); these prompts need ~800 tokens.
    "float32": {"dtype": "float32", "max_model_len": 1024},
}
"""The two engines of Gemma the tests compare (``vllm_kwargs``)."""


@pytest.fixture(scope="module", params=list(GEMMA_OPTIONS))
def setup(request: pytest.FixtureRequest, gemma: str) -> tuple[dict[str, Any], Engine]:
    """``(vllm_kwargs, engine)`` of one of the two Gemma engines, started."""
    options = GEMMA_OPTIONS[request.param]
    return options, get_engine(gemma, **options).start()


def _exact(engine: Engine) -> bool:
    return str(engine.platform_defaults.kwargs["dtype"]) in ("float32", "float")


@pytest.fixture(scope="module")
def reference(
    gemma: str,
) -> Iterator[Callable[[Engine, Sequence[Mapping[str, Any]], float], list[int]]]:
    """``reference(engine, messages, penalty)``: transformers' greedy ids in the engine's dtype
    on the engine's own prompt ids (one model per dtype, each answer computed once)."""
    models: dict[str, ReferenceModel] = {}
    answers: dict[tuple[str, str, float], list[int]] = {}

    def greedy(engine: Engine, messages: Sequence[Mapping[str, Any]], penalty: float) -> list[int]:
        dtype = str(engine.platform_defaults.kwargs["dtype"])
        key = (dtype, repr(messages), penalty)
        if key not in answers:
            if dtype not in models:
                models[dtype] = ReferenceModel(gemma, dtype)
            prompt_ids = engine.prompt_token_ids(list(messages))
            answers[key] = models[dtype].greedy(
                prompt_ids, max_tokens=MAX_TOKENS, repetition_penalty=penalty
            )
        return answers[key]

    yield greedy
    models.clear()  # 1.6 GB of reference weights: not kept for the modules after this one


@pytest.fixture(scope="module")
def expected(reference) -> Callable[[Engine, Sequence[Mapping[str, Any]], float], list[int]]:
    """``expected(engine, messages, penalty)``: the ids every surface must give: the
    reference's in float32; in bfloat16 the engine's own greedy ids, once they are checked
    against the reference (see the module's docstring)."""
    own: dict[tuple[int, str, float], list[int]] = {}

    def ids(engine: Engine, messages: Sequence[Mapping[str, Any]], penalty: float) -> list[int]:
        ref = reference(engine, messages, penalty)
        if _exact(engine):
            return ref
        key = (id(engine), repr(messages), penalty)
        if key not in own:
            mine = engine_greedy(
                engine, messages, max_tokens=MAX_TOKENS, repetition_penalty=penalty
            )
            p = compare(mine, ref)
            assert p.common_prefix >= MIN_BF16_PREFIX, (
                f"bfloat16: common prefix {p.common_prefix} of {MAX_TOKENS}: engine {mine} != "
                f"transformers {ref}"
            )
            own[key] = mine
        return own[key]

    return ids


def _greedy(gemma: str, options: dict[str, Any], penalty: float) -> dict[str, Any]:
    """The fields both integrations take for a fixed-length greedy answer on an engine."""
    return {
        "model": gemma,
        "vllm_kwargs": options,
        "temperature": 0.0,
        "max_tokens": MAX_TOKENS,
        "repetition_penalty": penalty,
    }


def _chat_vllm(gemma: str, options: dict[str, Any], penalty: float) -> Any:
    from vllm_inline.integrations.langchain import ChatVLLM

    return ChatVLLM(
        **_greedy(gemma, options, penalty),
        logprobs=True,  # the only place a LangChain message carries the generated token ids
        extra_sampling={"ignore_eos": True},
    )


def _llm(gemma: str, options: dict[str, Any], penalty: float) -> Any:
    from vllm_inline.integrations.llama_index import VLLM

    return VLLM(**_greedy(gemma, options, penalty), additional_kwargs={"ignore_eos": True})


def _lc_ids(message: Any) -> list[int]:
    return [t["token_id"] for t in message.response_metadata["logprobs"]["content"]]


def _li_messages(messages: Sequence[Mapping[str, Any]]) -> list[Any]:
    from llama_index.core.llms import ChatMessage

    return [ChatMessage(role=m["role"], content=m["content"]) for m in messages]


def _stream_ids(responses: Any) -> list[int]:
    ids: list[int] = []
    for r in responses:
        ids.extend(r.raw["token_ids"])
    return ids


def _check(got: list[int], want: list[int]) -> None:
    p = compare(got, want)
    assert p.identical, (
        f"common prefix {p.common_prefix} of {MAX_TOKENS}: got {got} != expected {want}"
    )
    assert len(got) == MAX_TOKENS


@pytest.mark.parametrize("penalty", PENALTIES)
def test_engine(setup, expected, penalty: float) -> None:
    _, engine = setup
    for messages in (SEA, LONG):
        mine = engine_greedy(engine, messages, max_tokens=MAX_TOKENS, repetition_penalty=penalty)
        _check(mine, expected(engine, messages, penalty))
    assert len(engine.prompt_token_ids(LONG)) > 512  # past the sliding window


@pytest.mark.parametrize("penalty", PENALTIES)
def test_chat_vllm_invoke(setup, expected, gemma: str, penalty: float) -> None:
    options, engine = setup
    llm = _chat_vllm(gemma, options, penalty)
    assert llm.engine is engine
    _check(_lc_ids(llm.invoke(SEA)), expected(engine, SEA, penalty))


@pytest.mark.parametrize("penalty", PENALTIES)
def test_chat_vllm_stream(setup, expected, gemma: str, penalty: float) -> None:
    options, engine = setup
    chunks = list(_chat_vllm(gemma, options, penalty).stream(SEA))
    assert len(chunks) > 1
    _check(
        [i for c in chunks if "logprobs" in c.response_metadata for i in _lc_ids(c)],
        expected(engine, SEA, penalty),
    )


@pytest.mark.parametrize("penalty", PENALTIES)
def test_chat_vllm_batch(setup, expected, reference, gemma: str, penalty: float) -> None:
    """Two prompts in one batch. In float32 each answer is exactly the reference's. In bfloat16
    vLLM's CPU kernels are not batch-invariant on every CPU: on a 2-vCPU AMD EPYC with
    avx512_bf16 (2026-12-04) SEA's greedy ids batched with RAINBOW left its ids alone at token
    10 of 32 at penalty 1.0, with the engine's processes spawned and forked alike (on the Xeon
    hosts before, with AMX, they were equal). So batched bfloat16 answers are held to the
    check's rule against the reference, as the engine itself is."""
    options, engine = setup
    sea, rainbow = _chat_vllm(gemma, options, penalty).batch([SEA, RAINBOW])
    for got, messages in ((sea, SEA), (rainbow, RAINBOW)):
        if _exact(engine):
            _check(_lc_ids(got), expected(engine, messages, penalty))
            continue
        ids, want = _lc_ids(got), reference(engine, messages, penalty)
        assert len(ids) == MAX_TOKENS
        assert compare(ids, want).common_prefix >= MIN_BF16_PREFIX, (ids, want)


@pytest.mark.parametrize("penalty", PENALTIES)
def test_llama_index_chat(setup, expected, gemma: str, penalty: float) -> None:
    options, engine = setup
    response = _llm(gemma, options, penalty).chat(_li_messages(SEA))
    _check(response.raw["token_ids"], expected(engine, SEA, penalty))


@pytest.mark.parametrize("penalty", PENALTIES)
def test_llama_index_stream_chat(setup, expected, gemma: str, penalty: float) -> None:
    options, engine = setup
    responses = list(_llm(gemma, options, penalty).stream_chat(_li_messages(SEA)))
    assert len(responses) > 1
    _check(_stream_ids(responses), expected(engine, SEA, penalty))


@pytest.mark.parametrize("penalty", PENALTIES)
def test_llama_index_complete(setup, expected, gemma: str, penalty: float) -> None:
    options, engine = setup
    # A completion is sent as one user turn through the chat template: the SEA prompt.
    response = _llm(gemma, options, penalty).complete(SEA[0]["content"])
    _check(response.raw["token_ids"], expected(engine, SEA, penalty))
