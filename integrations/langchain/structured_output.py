"""Tools and structured output of ``ChatVLLM``: what ``bind_tools`` binds and what
``with_structured_output`` builds.

:func:`tool_binding` converts tools to OpenAI's format and checks ``tool_choice`` against them
(vLLM enforces ``"required"`` and a named tool with its structured outputs).
:func:`structured_output` picks the request (vLLM's JSON-schema or JSON-object constraint, or
the schema as the one tool to call) and the parser, as ``langchain_openai`` does, with
``include_raw`` through ``RunnablePassthrough.assign(...).with_fallbacks(...)``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from operator import itemgetter
from typing import Any, Literal

from langchain_core.language_models import (
    BaseChatModel,
    LanguageModelInput,
    LanguageModelOutput,
)
from langchain_core.output_parsers import JsonOutputParser, PydanticOutputParser
from langchain_core.output_parsers.openai_tools import (
    JsonOutputKeyToolsParser,
    PydanticToolsParser,
)
from langchain_core.runnables import Runnable, RunnableMap, RunnablePassthrough
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_json_schema, convert_to_openai_tool
from langchain_core.utils.pydantic import TypeBaseModel, is_basemodel_subclass
from pydantic import BaseModel
from pydantic.v1 import BaseModel as BaseModelV1

from vllm_inline.engine import BadRequestError
from vllm_inline.engine.request.messages import validate_tool_choice

__all__ = ["StructuredMethod", "ToolLike", "json_schema", "structured_output", "tool_binding"]

ToolLike = dict[str, Any] | type | Callable[..., Any] | BaseTool
"""What ``bind_tools`` takes for one tool, as ``BaseChatModel.bind_tools`` does."""

StructuredMethod = Literal["json_schema", "function_calling", "json_mode"]
"""How ``with_structured_output`` asks for the schema."""


def tool_binding(
    tools: Sequence[ToolLike],
    *,
    tool_choice: dict[str, Any] | str | bool | None,
    strict: bool | None,
    **kwargs: Any,
) -> dict[str, Any]:
    """The values ``bind_tools`` binds: ``tools`` in OpenAI's format (argument schemas closed
    when ``strict``), the other ``kwargs`` and, when given, ``tool_choice`` normalised against
    the tools."""
    formatted = [convert_to_openai_tool(t, strict=strict) for t in tools]
    if tool_choice is not None:
        kwargs["tool_choice"] = validate_tool_choice(tool_choice, formatted)
    return {"tools": formatted, **kwargs}


def structured_output(
    llm: BaseChatModel,
    schema: dict[str, Any] | type,
    *,
    method: StructuredMethod,
    include_raw: bool,
    strict: bool | None,
) -> Runnable[LanguageModelInput, Any]:
    """``llm`` bound to answer as ``schema`` says, piped into the parser of that answer (see
    ``ChatVLLM.with_structured_output``)."""
    pydantic = _pydantic_class(schema)
    trace = {"ls_structured_output_format": {"kwargs": {"method": method}, "schema": schema}}
    parser: Runnable[LanguageModelOutput, Any]
    if method == "function_calling":
        name = convert_to_openai_tool(schema)["function"]["name"]
        bound = llm.bind_tools(
            [schema], tool_choice=name, strict=True if strict is None else strict, **trace
        )
        parser = (
            PydanticToolsParser(tools=[pydantic], first_tool_only=True)
            if pydantic is not None
            else JsonOutputKeyToolsParser(key_name=name, first_tool_only=True)
        )
    elif method in ("json_schema", "json_mode"):
        structured = (
            {"json": json_schema(schema)} if method == "json_schema" else {"json_object": True}
        )
        bound = llm.bind(structured_outputs=structured, **trace)
        parser = (
            PydanticOutputParser(pydantic_object=pydantic)
            if pydantic is not None
            else JsonOutputParser()
        )
    else:
        msg = f"method={method!r} is invalid: use 'json_schema', 'function_calling' or 'json_mode'."
        raise BadRequestError(msg, parameter="method", value=method)
    if not include_raw:
        return bound | parser
    parsed = RunnablePassthrough.assign(
        parsed=itemgetter("raw") | parser, parsing_error=lambda _: None
    )
    unparsed = RunnablePassthrough.assign(parsed=lambda _: None)
    return RunnableMap(raw=bound) | parsed.with_fallbacks([unparsed], exception_key="parsing_error")


def json_schema(schema: dict[str, Any] | type) -> dict[str, Any]:
    """The JSON schema of a Pydantic class, a TypedDict, a function schema or a JSON schema."""
    pydantic = _pydantic_class(schema)
    if pydantic is not None:
        if issubclass(pydantic, BaseModel):
            return pydantic.model_json_schema()
        return pydantic.schema()  # pydantic.v1
    if isinstance(schema, Mapping) and "properties" in schema and "type" in schema:
        return dict(schema)
    return convert_to_json_schema(schema)


def _pydantic_class(schema: dict[str, Any] | type) -> TypeBaseModel | None:
    """``schema`` if it is a Pydantic class (v2 or v1), as LangChain's
    ``is_basemodel_subclass`` tells; ``None`` otherwise."""
    if (
        isinstance(schema, type)
        and is_basemodel_subclass(schema)
        and issubclass(schema, (BaseModel, BaseModelV1))  # what it checks, as a type narrows
    ):
        return schema
    return None
