"""``vllm_inline.testing``: the public kit, and the example tests ``docs/testing.md`` shows.

The first part checks the kit itself (exports, lazy imports, shipped templates, the build cache,
``python -m vllm_inline.testing``). The second part is the docs' example, run on real engines:
the functions between the ``docs example`` markers appear verbatim in ``docs/testing.md``
(:func:`test_the_docs_show_these_tests_verbatim`), so the page cannot drift from working code.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from langchain.agents import create_agent
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.tools import tool
from llama_index.core import Document, VectorStoreIndex

import vllm_inline.testing as kit
from vllm_inline.integrations.langchain import ChatVLLM
from vllm_inline.integrations.llama_index import VLLM, VLLMEmbedding
from vllm_inline.testing import CPU_TEST_ENGINE_KWARGS, SCENARIOS, build_scripted_model
from vllm_inline.testing.cache import kit_digest
from vllm_inline.testing.families import TEMPLATE_NAMES, chat_template

DOCS_PAGE = Path(__file__).resolve().parent.parent / "docs" / "testing.md"


# -- the kit ----------------------------------------------------------------------------------


@pytest.mark.smoke
def test_exports_are_pinned() -> None:
    assert kit.__all__ == [
        "CPU_TEST_ENGINE_KWARGS",
        "EMBEDDING_HIDDEN_SIZE",
        "IDEFICS3_CHAT_TEMPLATE",
        "SCENARIOS",
        "VISION_ENGINE_KWARGS",
        "Chain",
        "Scenario",
        "ScriptedModel",
        "build_embedding_model",
        "build_reranker_model",
        "build_scripted_model",
        "build_vision_model",
        "default_root",
        "expected_answer",
        "scripted_model",
    ]
    assert all(hasattr(kit, name) for name in kit.__all__)


def test_importing_the_kit_loads_nothing_heavy() -> None:
    heavy = ("torch", "vllm", "numpy", "tokenizers", "safetensors", "transformers")
    code = (
        "import sys, vllm_inline.testing; "
        f"print(','.join(m for m in {heavy!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_cpu_engine_settings(tmp_path: Path) -> None:
    assert CPU_TEST_ENGINE_KWARGS == {
        "dtype": "float32",
        "max_model_len": 512,
        "enforce_eager": True,
        "kv_cache_memory_bytes": 128 * 2**20,
    }
    lora = kit.scripted_model("llama3", root=tmp_path, enable_lora=True)
    assert lora.engine_kwargs == {**CPU_TEST_ENGINE_KWARGS, "enable_lora": True}
    assert "enable_lora" not in CPU_TEST_ENGINE_KWARGS  # a copy, not the shared dict


@pytest.mark.smoke
def test_every_template_ships_as_a_jinja_file(tmp_path: Path) -> None:
    shipped = {name: chat_template(name) for name in TEMPLATE_NAMES}
    used = {sc.chat_template for sc in SCENARIOS.values()}
    assert used == set(shipped.values())  # each scenario's template is one file, each file used
    model = build_scripted_model("chatml_reasoning", root=tmp_path)
    config = json.loads((model / "tokenizer_config.json").read_text())
    assert config["chat_template"] == shipped["qwen3"]  # what the model gets, byte for byte
    with pytest.raises(ValueError, match="unknown chat template 'qwen9'"):
        chat_template("qwen9")


@pytest.mark.smoke
def test_a_build_is_reused_and_complete(tmp_path: Path) -> None:
    first = build_scripted_model("llama3", root=tmp_path)
    assert build_scripted_model("llama3", root=tmp_path) == first
    assert [p.name for p in tmp_path.iterdir()] == [first.name]  # no temporary leftovers
    names = {p.name for p in first.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "scenario.json"} <= names
    assert kit.build_embedding_model(tmp_path) == kit.build_embedding_model(tmp_path)
    assert kit.expected_answer("llama3") == SCENARIOS["llama3"].answer == "The answer is complete."


def test_an_edited_kit_builds_new_models(tmp_path: Path) -> None:
    """The cache key covers the kit's code and templates: a changed template is a new model."""
    copy = tmp_path / "kit"
    shutil.copytree(Path(kit.__file__).parent, copy, ignore=shutil.ignore_patterns("__pycache__"))

    def digest() -> str:
        spec = importlib.util.spec_from_file_location("kit_cache_copy", copy / "cache.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module.kit_digest()

    before = digest()
    assert before == kit_digest()  # the copy hashes like the original
    template = copy / "templates" / "gemma3.jinja"
    template.write_text(template.read_text() + " ")
    assert digest() != before


def test_command_line_builds_and_prints_paths(tmp_path: Path) -> None:
    env = {**os.environ, "VLLMINLINE_CACHE": str(tmp_path)}
    run = [sys.executable, "-m", "vllm_inline.testing"]
    out = subprocess.run(
        [*run, "gemma", "embedder"], env=env, check=False, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    lines = [line.split(" ", 1) for line in out.stdout.splitlines()]
    assert [name for name, _ in lines] == ["gemma", "embedder"]
    assert all(Path(path).parent == tmp_path / "scripted" for _, path in lines)
    assert (Path(lines[0][1]) / "scenario.json").is_file()
    bad = subprocess.run([*run, "nope"], env=env, check=False, capture_output=True, text=True)
    assert bad.returncode == 2 and "unknown model nope: use one of llama3" in bad.stderr


# -- the docs' example, on real engines -------------------------------------------------------
# In the docs these fixtures build under the default cache (``scripted_model("llama3")``); here
# they hand out the suite's shared models, so no second engine starts for the same model.


@pytest.fixture(scope="module")
def llama3(scripted):
    return scripted("llama3")


@pytest.fixture(scope="module")
def chatml_tools(scripted):
    return scripted("chatml_tools")


@pytest.fixture(scope="module")
def embedder(scripted_root: Path) -> str:
    return str(kit.build_embedding_model(scripted_root))


# docs example: begin
def build_chain(llm):
    prompt = ChatPromptTemplate.from_messages(
        [("system", "Answer in one sentence."), ("human", "{question}")]
    )
    return prompt | llm | StrOutputParser()


@pytest.mark.engine
def test_my_chain_returns_the_answer_and_nothing_more(llama3):
    llm = ChatVLLM(model=llama3.path, vllm_kwargs=llama3.engine_kwargs, max_tokens=64)
    chain = build_chain(llm)

    answer = chain.invoke({"question": "What does vllm-inline do?"})

    # The model's script: "The answer is complete.", <|eot_id|>, then an invented next turn.
    assert answer == llama3.scenario.answer == "The answer is complete."
    assert not any(token in answer for token in llama3.scenario.special_tokens)
    assert "hallucinated" not in answer  # the chain stopped at the end of the turn
    pieces = list(chain.stream({"question": "What does vllm-inline do?"}))
    assert len(pieces) > 1 and "".join(pieces) == answer  # streamed token by token


@pytest.mark.engine
def test_my_query_engine_retrieves_and_answers(llama3, embedder):
    documents = ["The weather in Oslo is cold and snowy in winter.", "Bananas are yellow fruit."]
    index = VectorStoreIndex.from_documents(
        [Document(text=text) for text in documents],
        embed_model=VLLMEmbedding(model=embedder, vllm_kwargs=CPU_TEST_ENGINE_KWARGS),
    )
    query_engine = index.as_query_engine(
        llm=VLLM(model=llama3.path, vllm_kwargs=llama3.engine_kwargs),
        similarity_top_k=1,
        response_mode="simple_summarize",  # one prompt: the test models have 512 tokens
    )

    response = query_engine.query("How is the weather in Oslo today?")

    assert response.source_nodes[0].node.get_content() == documents[0]
    assert str(response) == llama3.scenario.answer


@tool
def get_weather(city: str) -> str:
    """Get the current weather in a city."""
    return f"It is sunny in {city}."


@pytest.mark.engine
def test_my_agent_calls_the_tool_and_answers(chatml_tools):
    llm = ChatVLLM(model=chatml_tools.path, vllm_kwargs=chatml_tools.engine_kwargs)
    agent = create_agent(llm, tools=[get_weather])

    result = agent.invoke({"messages": [("human", "What is the weather in Oslo?")]})

    _question, call, tool_result, final = result["messages"]
    assert call.tool_calls[0]["name"] == "get_weather"
    assert call.tool_calls[0]["args"] == {"city": "Oslo"}
    assert tool_result.content == "It is sunny in Oslo."  # the agent ran your tool
    # The model says this only when the tool result really is in its prompt.
    assert final.content == chatml_tools.scenario.after_tool.answer


# docs example: end


def test_the_docs_show_these_tests_verbatim() -> None:
    """``docs/testing.md`` shows the example as a user writes it: without the suite's marker."""
    page = DOCS_PAGE.read_text()
    for function in (
        build_chain,
        test_my_chain_returns_the_answer_and_nothing_more,
        test_my_query_engine_retrieves_and_answers,
        get_weather.func,
        test_my_agent_calls_the_tool_and_answers,
    ):
        source = inspect.getsource(function).replace("@pytest.mark.engine\n", "")
        assert source in page, f"docs/testing.md lost (or changed) {function.__name__}"
