"""langchain-tests standard suites for ``ChatVLLM``: unit (no engine) and integration (real engine).

The integration suite runs on the scripted ``chatml_tools`` model (Qwen2.5 template, hermes tool
calls): it answers a plain turn with a ``get_weather`` call written as text and, after a tool
result, with "The weather in Oslo is sunny.". The engines are the session's shared ones
(``scripted`` fixture in ``conftest.py``). Every xfail names what such a model cannot know.
"""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.exceptions import OutputParserException
from langchain_tests.integration_tests import ChatModelIntegrationTests
from langchain_tests.unit_tests import ChatModelUnitTests
from pydantic import ValidationError

from vllm_inline.integrations.langchain import ChatVLLM

# In-process generation has no API key, no network timeout and nothing to retry: the standard
# suites' client parameters are dropped (ChatVLLM refuses unknown fields).
_CLIENT_PARAMS = ("api_key", "timeout", "max_retries")


def _without_client_params(params: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in params.items() if k not in _CLIENT_PARAMS}


class TestChatVLLMUnit(ChatModelUnitTests):
    """Construction, binding and tracing parameters: no engine starts."""

    @property
    def chat_model_class(self) -> type[ChatVLLM]:
        return ChatVLLM

    @property
    def chat_model_params(self) -> dict[str, Any]:
        return {"model": "Qwen/Qwen2.5-0.5B-Instruct", "vllm_kwargs": {"dtype": "float32"}}

    @property
    def standard_chat_model_params(self) -> dict[str, Any]:
        return _without_client_params(super().standard_chat_model_params)

    @property
    def supports_model_override(self) -> bool:
        return True

    @pytest.mark.xfail(
        reason="langchain-core's load(allowed_objects='all') admits only the classes in its own "
        "mapping of partner packages; ChatVLLM round-trips with allowed_objects=[ChatVLLM] "
        "(tests/test_langchain_unit.py)",
        raises=ValueError,
        strict=True,
    )
    def test_serdes(self, model: Any, snapshot: Any) -> None:
        super().test_serdes(model, snapshot)


# Why some standard tests cannot pass on a scripted model. Its only wish is its script (a
# get_weather(city="Oslo") call, then "The weather in Oslo is sunny."); everything else is a tie
# that greedy decoding breaks by the lowest token id, so under a forced tool choice or JSON mode
# it fills the schema with arbitrary keys, strings and never-ending numbers. The mechanics (forced choice, parsing, streaming) are proven in test_langchain_chat.py.
# Each xfail names the exception a wrong answer raises, so an engine error is never masked.
_CANNOT_KNOW_ARGUMENTS = (
    "a scripted model cannot know which arguments the question asks for (it only knows "
    "get_weather(city='Oslo')); forced into another tool's schema it fills it with tie-broken "
    "tokens (invented keys, numbers that never end)"
)
_CANNOT_KNOW_KEYS = (
    "a scripted model cannot know which JSON keys the prompt asks for; JSON mode only forces "
    "some JSON object"
)
_CANNOT_KNOW_PARAMETER_NAME = (
    "a scripted model cannot know the tool's parameter name: its script calls "
    "get_weather(city=...), the test's tool takes location"
)


@pytest.mark.engine
class TestChatVLLMIntegration(ChatModelIntegrationTests):
    """The standard integration suite on a real engine (scripted ``chatml_tools`` model)."""

    @pytest.fixture(autouse=True)
    def _scripted_model(self, scripted: Any) -> None:
        type(self)._scripted = scripted("chatml_tools")
        type(self)._other = scripted("chatml")

    @property
    def chat_model_class(self) -> type[ChatVLLM]:
        return ChatVLLM

    @property
    def chat_model_params(self) -> dict[str, Any]:
        s = self._scripted
        return {"model": s.path, "vllm_kwargs": s.engine_kwargs}

    @property
    def standard_chat_model_params(self) -> dict[str, Any]:
        return _without_client_params(super().standard_chat_model_params)

    @property
    def has_tool_calling(self) -> bool:
        return True

    @property
    def has_tool_choice(self) -> bool:
        return True

    @property
    def has_structured_output(self) -> bool:
        return True

    @property
    def supports_json_mode(self) -> bool:
        return True

    @property
    def returns_usage_metadata(self) -> bool:
        return True

    @property
    def supports_model_override(self) -> bool:
        return True

    @property
    def model_override_value(self) -> str:
        return self._other.path

    # -- what a scripted model cannot know (see the reasons above) -------------------------

    @pytest.mark.xfail(reason=_CANNOT_KNOW_ARGUMENTS, raises=AssertionError)
    @pytest.mark.parametrize("model", [{}, {"output_version": "v1"}], indirect=True)
    def test_tool_calling(self, model: Any) -> None:
        super().test_tool_calling(model)

    @pytest.mark.xfail(reason=_CANNOT_KNOW_ARGUMENTS, raises=AssertionError)
    async def test_tool_calling_async(self, model: Any) -> None:
        await super().test_tool_calling_async(model)

    @pytest.mark.xfail(reason=_CANNOT_KNOW_ARGUMENTS, raises=AssertionError)
    def test_unicode_tool_call_integration(
        self, model: Any, *, tool_choice: str | None = None, force_tool_call: bool = True
    ) -> None:
        super().test_unicode_tool_call_integration(
            model, tool_choice=tool_choice, force_tool_call=force_tool_call
        )

    @pytest.mark.xfail(reason=_CANNOT_KNOW_KEYS, raises=OutputParserException)
    def test_json_mode(self, model: Any) -> None:
        super().test_json_mode(model)

    @pytest.mark.xfail(reason=_CANNOT_KNOW_PARAMETER_NAME, raises=ValidationError)
    @pytest.mark.parametrize("model", [{}, {"output_version": "v1"}], indirect=True)
    def test_agent_loop(self, model: Any) -> None:
        super().test_agent_loop(model)
