"""What a request's output must match: a JSON schema, or tool calls to named functions.

Plain data (no grammar library here), built from the OpenAI request by `constraint_of`
and carried in SamplingParams; grammar.py compiles it. Each schema keeps the
request field it came from, so an error names that field (`param`), and its JSON text as
the client wrote it: the property order of the schema is the order of the output.
"""

import json
from dataclasses import dataclass
from typing import Any, Protocol

# OpenAI's JSON mode: any object (the prompt says what to put in it)
JSON_OBJECT_SCHEMA = '{"type": "object"}'
# A function declared without parameters takes any arguments object
ANY_ARGUMENTS = '{"type": "object"}'
# The tags a tool call is written between (Qwen2.5's, Hermes'): a forced call's grammar
# writes them and the parser (engine/entrypoints/openai/tool_calls.py) reads them. Here,
# so the core does not import its OpenAI layer.
OPEN, CLOSE = "<tool_call>", "</tool_call>"


@dataclass(frozen=True)
class SchemaSource:
    schema: str  # the JSON text of a JSON schema
    param: str  # the request field holding it, e.g. "response_format.json_schema.schema"


@dataclass(frozen=True)
class JsonConstraint:
    """The output is one JSON value matching the schema (`response_format`)."""

    source: SchemaSource


@dataclass(frozen=True)
class ToolCallConstraint:
    """The output is tool calls, each to one of these functions with arguments matching its
    parameters schema (`tool_choice` required or named): one call, or several in a row."""

    functions: tuple[tuple[str, SchemaSource], ...]  # (name, parameters schema)
    parallel: bool


Constraint = JsonConstraint | ToolCallConstraint


class _ChatFields(Protocol):
    """The request fields a constraint comes from (a ChatCompletionRequest)."""

    tools: Any
    tool_choice: Any
    response_format: Any


def _schema_text(schema: dict[str, Any]) -> str:
    return json.dumps(schema, ensure_ascii=False)


def _tool_constraint(body: _ChatFields) -> ToolCallConstraint | None:
    choice = body.tool_choice
    if not body.tools or choice in (None, "auto", "none"):
        return None
    named = None if isinstance(choice, str) else choice.function.name  # NamedToolChoice
    functions = []
    for i, tool in enumerate(body.tools):
        fn = tool.function
        if named is not None and fn.name != named:
            continue
        params = _schema_text(fn.parameters) if fn.parameters is not None else ANY_ARGUMENTS
        functions.append((fn.name, SchemaSource(params, f"tools[{i}].function.parameters")))
    # A named choice asks for that call: one, as vLLM writes it and as the clients that name
    # a tool (structured output through a tool) read it, unless parallel calls are asked
    # for outright. `required` may make several; the model may stop after each.
    asked = getattr(body, "parallel_tool_calls", None)
    parallel = asked is True or (asked is None and named is None)
    return ToolCallConstraint(tuple(functions), parallel)


def constraint_of(body: _ChatFields) -> Constraint | None:
    """The constraint a validated chat request asks for; None when it asks for none.
    A forced tool call wins over `response_format` (the answer is then the calls)."""
    if (tools := _tool_constraint(body)) is not None:
        return tools
    fmt = body.response_format
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return JsonConstraint(SchemaSource(JSON_OBJECT_SCHEMA, "response_format"))
    schema = fmt.json_schema.schema_ or {}  # OpenAI: no schema means any JSON value
    return JsonConstraint(SchemaSource(_schema_text(schema), "response_format.json_schema.schema"))
