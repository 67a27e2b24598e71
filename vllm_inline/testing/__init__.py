"""Test kit: tiny real models whose answer is known, for end-to-end tests on a CPU.

A *scripted* model is a real ``LlamaForCausalLM`` checkpoint, built on your machine in under a
second with no download, whose greedy output is a fixed script: an answer, the family's
end-of-turn token, then an invented next turn. On a real vLLM engine it shows what a mock cannot:
that your chain stops where the model's chat format says, that no special token or invented turn
leaks into the output, that tool calls and reasoning are parsed. :data:`SCENARIOS` lists the
models (Llama 3, Qwen ChatML, Gemma formats; reasoning; tool calls); :func:`build_embedding_model`
and :func:`build_reranker_model` build a small embedding model and a small cross-encoder for
retrieval and reranking tests; :func:`build_vision_model` a tiny random-weight Idefics3 for
image-input tests. See ``docs/testing.md``.

Test your own chain (pytest; the engine starts once per session, ~20 s on a CPU)::

    import pytest
    from langchain_core.output_parsers import StrOutputParser
    from langchain_core.prompts import ChatPromptTemplate

    from vllm_inline.engine import shutdown_all
    from vllm_inline.integrations.langchain import ChatVLLM
    from vllm_inline.testing import scripted_model

    @pytest.fixture(scope="session")
    def llama3(tmp_path_factory):
        yield scripted_model("llama3", root=tmp_path_factory.mktemp("models"))
        shutdown_all()

    def test_my_chain(llama3):
        llm = ChatVLLM(model=llama3.path, vllm_kwargs=llama3.engine_kwargs, max_tokens=32)
        chain = ChatPromptTemplate.from_messages([("human", "{q}")]) | llm | StrOutputParser()
        assert chain.invoke({"q": "Hi"}) == llama3.scenario.answer  # "The answer is complete."

Importing this package loads no heavy dependency: ``numpy``, ``tokenizers`` and ``safetensors``
load when a model is built, vLLM when an engine starts.
"""

from __future__ import annotations

from .builder import build_scripted_model
from .cache import default_root
from .embedding import EMBEDDING_HIDDEN_SIZE, build_embedding_model
from .harness import CPU_TEST_ENGINE_KWARGS, ScriptedModel, scripted_model
from .reranker import build_reranker_model
from .scenarios import SCENARIOS, Chain, Scenario, expected_answer
from .vision import IDEFICS3_CHAT_TEMPLATE, VISION_ENGINE_KWARGS, build_vision_model

__all__ = [
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
