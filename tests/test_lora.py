"""LoRA adapters per request, on a real engine, through the engine and both integrations.

The adapters are written here directly (``adapter_config.json`` + ``adapter_model.safetensors``,
no ``peft``): a LoRA on ``lm_head`` of the scripted ``llama3`` model whose rank-k delta adds a
second bigram chain, 20 per step against the base model's 10, so greedy decoding follows another
script. Row i of A picks the previous token (the residual carries it as a one-hot), column i of B
writes the next one. The base model and two adapters then answer three different known texts.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from vllm_inline.testing import CPU_TEST_ENGINE_KWARGS

pytestmark = pytest.mark.engine

BASE = "The answer is complete."
PARIS = "The capital of France is Paris."
HELLO = "Hello there!"
# The stop token ends each adapter script, as it ends the base one.
_SCRIPTS = {
    "paris": ("The", " capital", " of", " France", " is", " Paris", ".", "<|eot_id|>"),
    "hello": ("Hello", " there", "!", "<|eot_id|>"),
}
LORA_KWARGS = {**CPU_TEST_ENGINE_KWARGS, "enable_lora": True, "max_loras": 2, "max_lora_rank": 8}
MESSAGES = [{"role": "user", "content": "Hi"}]


def write_lm_head_adapter(
    model: Path,
    out: Path,
    script: tuple[str, ...],
    *,
    rank: int | None = None,
    target: str = "lm_head",
) -> str:
    """A PEFT LoRA adapter on ``target`` that makes ``model`` answer ``script`` after its
    generation prompt. ``rank`` above ``len(script)`` pads with zero rows (for a too-big rank)."""
    import numpy as np
    from safetensors.numpy import save_file
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model / "tokenizer.json"))
    config = json.loads((model / "config.json").read_text())
    start = json.loads((model / "scenario.json").read_text())["start_token_ids"]["chat"]
    ids = []
    for piece in script:
        encoded = tok.encode(piece, add_special_tokens=False).ids
        assert len(encoded) == 1, (piece, encoded)
        ids.append(encoded[0])
    steps = list(zip([start, *ids[:-1]], ids))
    r = rank or len(steps)
    a = np.zeros((r, config["hidden_size"]), np.float32)
    b = np.zeros((config["vocab_size"], r), np.float32)
    for i, (prev, nxt) in enumerate(steps):
        a[i, prev] = 1.0
        b[nxt, i] = 20.0  # the base chain's step is 10: the adapter's wins
    out.mkdir(parents=True, exist_ok=True)
    prefix = f"base_model.model.{target}"
    save_file(
        {f"{prefix}.lora_A.weight": a, f"{prefix}.lora_B.weight": b},
        str(out / "adapter_model.safetensors"),
    )
    adapter_config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": r,
        "lora_alpha": r,
        "target_modules": [target],
        "bias": "none",
        "base_model_name_or_path": str(model),
    }
    (out / "adapter_config.json").write_text(json.dumps(adapter_config))
    return str(out)


@pytest.fixture(scope="module")
def lora_setup(scripted, tmp_path_factory):
    """(model path, {"paris": dir, "hello": dir}, engine with LoRA enabled)."""
    from vllm_inline.engine import get_engine

    model = Path(scripted("llama3").path)
    root = tmp_path_factory.mktemp("adapters")
    adapters = {k: write_lm_head_adapter(model, root / k, s) for k, s in _SCRIPTS.items()}
    engine = get_engine(str(model), **LORA_KWARGS)
    yield str(model), adapters, engine
    engine.shutdown()


async def _collect(engine, **kwargs):
    chunks = [d.text async for d in engine.astream(MESSAGES, temperature=0, **kwargs)]
    return chunks


# -- engine ----------------------------------------------------------------------------------


async def test_base_and_two_adapters_stream_concurrently(lora_setup):
    _, adapters, engine = lora_setup
    runs = await asyncio.gather(
        _collect(engine),
        _collect(engine, lora=adapters["paris"]),
        _collect(engine, lora=("hello", adapters["hello"])),
        _collect(engine),
        _collect(engine, lora=adapters["paris"]),
    )
    texts = ["".join(c) for c in runs]
    assert texts == [BASE, PARIS, HELLO, BASE, PARIS]
    assert all(len([c for c in chunks if c]) > 1 for chunks in runs)


def test_sync_stream_names_and_ids(lora_setup):
    _, adapters, engine = lora_setup
    reg = engine.adapters
    paris = reg.resolve(adapters["paris"])
    # The same directory, however written, is the same adapter; another one never collides.
    relative = os.path.relpath(adapters["paris"])
    assert reg.resolve(relative) == paris
    assert reg.resolve(("paris", adapters["paris"])).id == paris.id
    assert reg.resolve({"name": "p", "path": adapters["paris"] + "/"}).id == paris.id
    hello = reg.resolve(adapters["hello"])
    assert hello.id != paris.id and hello.name != paris.name and min(hello.id, paris.id) >= 1
    # A name given once works alone afterwards.
    assert "".join(d.text for d in engine.stream(MESSAGES, lora="p", temperature=0)) == PARIS
    assert "".join(d.text for d in engine.stream(MESSAGES, temperature=0)) == BASE


async def test_bad_adapters_are_typed_errors_and_engine_keeps_serving(lora_setup, tmp_path):
    from vllm_inline.engine import BadRequestError

    model, adapters, engine = lora_setup
    missing = str(tmp_path / "nope")
    with pytest.raises(BadRequestError) as missing_err:
        list(engine.stream(MESSAGES, lora=missing))  # refused before rendering or generating
    assert missing_err.value.parameter == "lora" and missing_err.value.value == missing
    assert missing in str(missing_err.value)
    with pytest.raises(BadRequestError, match="unknown-name"):
        list(engine.stream(MESSAGES, lora="unknown-name"))

    too_big = write_lm_head_adapter(Path(model), tmp_path / "big", ("Hello", "<|eot_id|>"), rank=16)
    wrong = write_lm_head_adapter(
        Path(model), tmp_path / "wrong", ("Hello", "<|eot_id|>"), target="model.layers.0.mlp.nope"
    )
    for path, words in ((too_big, "max_lora_rank"), (wrong, "target modules")):
        with pytest.raises(BadRequestError) as err:
            await _collect(engine, lora=path)
        assert err.value.parameter == "lora" and err.value.value == path
        assert path in str(err.value) and words in str(err.value)
    # Still serving, base and adapters, together.
    texts = await asyncio.gather(_collect(engine), _collect(engine, lora=adapters["hello"]))
    assert ["".join(t) for t in texts] == [BASE, HELLO]


async def test_engine_without_lora_names_the_path(scripted, tmp_path):
    """An engine started without LoRA support refuses an adapter before loading it."""
    from vllm_inline.engine import BadRequestError
    from vllm_inline.engine.request.lora import LoRARegistry

    adapter = tmp_path / "a"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")

    engine = scripted("llama3").engine  # started without enable_lora
    with pytest.raises(BadRequestError, match="enable_lora") as err:
        await _collect(engine, lora=str(adapter))
    assert err.value.value == str(adapter)
    assert "".join(d.text for d in engine.stream(MESSAGES)) == scripted("llama3").scenario.answer

    reg = LoRARegistry()
    with pytest.raises(BadRequestError, match="adapter_config.json"):
        reg.resolve(str(tmp_path))
    with pytest.raises(BadRequestError):
        reg.resolve(("x", 3))
    assert reg.resolve(("a", str(adapter))).id == 1  # its directory name, given explicitly
    other = tmp_path / "b"
    other.mkdir()
    (other / "adapter_config.json").write_text("{}")
    with pytest.raises(BadRequestError, match="already refers"):
        reg.resolve(("a", str(other)))
    assert reg.resolve(str(other)).id == 2


# -- LangChain -------------------------------------------------------------------------------


def test_chatvllm_field_call_and_bind(lora_setup):
    from langchain_core.output_parsers import StrOutputParser
    from langchain_core.prompts import ChatPromptTemplate

    from vllm_inline.integrations.langchain import ChatVLLM

    model, adapters, _ = lora_setup
    base = ChatVLLM(model=model, vllm_kwargs=LORA_KWARGS, temperature=0)
    paris = ChatVLLM(model=model, vllm_kwargs=LORA_KWARGS, temperature=0, lora=adapters["paris"])
    assert base.invoke("Hi").content == BASE
    assert paris.invoke("Hi").content == PARIS
    assert paris.invoke("Hi", lora=adapters["hello"]).content == HELLO
    assert paris.invoke("Hi", lora=None).content == BASE  # a call's None: the base model
    assert paris.bind(lora=None).invoke("Hi").content == BASE
    chunks = [c.content for c in paris.stream("Hi")]
    assert "".join(chunks) == PARIS and len([c for c in chunks if c]) > 1
    chain = (
        ChatPromptTemplate.from_messages([("user", "{q}")])
        | base.bind(lora=adapters["hello"])
        | StrOutputParser()
    )
    assert chain.invoke({"q": "Hi"}) == HELLO
    assert "".join(chain.stream({"q": "Hi"})) == HELLO


async def test_chatvllm_concurrent_astream(lora_setup):
    from vllm_inline.integrations.langchain import ChatVLLM

    model, adapters, _ = lora_setup
    llm = ChatVLLM(model=model, vllm_kwargs=LORA_KWARGS, temperature=0)

    async def run(**kwargs):
        return "".join([c.content async for c in llm.astream("Hi", **kwargs)])

    texts = await asyncio.gather(
        run(), run(lora=adapters["paris"]), run(lora=adapters["hello"]), llm.ainvoke("Hi")
    )
    assert texts[:3] == [BASE, PARIS, HELLO] and texts[3].content == BASE


# -- LlamaIndex ------------------------------------------------------------------------------


def test_llama_index_field_and_call(lora_setup):
    from llama_index.core.llms import ChatMessage

    from vllm_inline.integrations.llama_index import VLLM

    model, adapters, _ = lora_setup
    msgs = [ChatMessage(role="user", content="Hi")]
    base = VLLM(model=model, vllm_kwargs=LORA_KWARGS, temperature=0)
    paris = VLLM(model=model, vllm_kwargs=LORA_KWARGS, temperature=0, lora=adapters["paris"])
    assert base.chat(msgs).message.content == BASE
    assert paris.chat(msgs).message.content == PARIS
    assert paris.complete("Hi").text == PARIS
    assert paris.chat(msgs, lora=None).message.content == BASE  # a call's None: the base model
    assert paris.complete("Hi", lora=None).text == BASE
    assert base.chat(msgs, lora=adapters["hello"]).message.content == HELLO
    deltas = [r.delta for r in base.stream_chat(msgs, lora=adapters["hello"])]
    assert "".join(d or "" for d in deltas) == HELLO and len([d for d in deltas if d]) > 1


async def test_llama_index_concurrent(lora_setup):
    from llama_index.core.llms import ChatMessage

    from vllm_inline.integrations.llama_index import VLLM

    model, adapters, _ = lora_setup
    msgs = [ChatMessage(role="user", content="Hi")]
    llm = VLLM(model=model, vllm_kwargs=LORA_KWARGS, temperature=0)

    async def streamed(**kwargs):
        gen = await llm.astream_chat(msgs, **kwargs)
        return "".join([r.delta or "" async for r in gen])

    results = await asyncio.gather(
        streamed(),
        streamed(lora=adapters["paris"]),
        llm.achat(msgs, lora=adapters["hello"]),
        llm.achat(msgs),
    )
    assert results[:2] == [BASE, PARIS]
    assert [r.message.content for r in results[2:]] == [HELLO, BASE]
