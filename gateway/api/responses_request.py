"""The body of POST /v1/responses (OpenAI's Responses API) and its chat completions twin.

The gateway answers a Responses request through the chat pipeline: `to_chat` turns the
instructions, the input items (messages, function calls and their outputs, the stored
conversation of `previous_response_id` first), the tools and `text.format` into a
ChatCompletionRequest. What the chat API has no twin for (built-in tools, images, files,
background runs, a `conversation` object) is a 400 naming the field, never silently dropped.
"""

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from engine.entrypoints.openai.errors import OpenAIError
from engine.entrypoints.openai.protocol import ChatCompletionRequest
from gateway.api.translated import renamed_error

_INT32_MAX = 2**31 - 1
_TEXT_PARTS = ("input_text", "output_text", "text")
_CHAT_NAMES = {
    "max_tokens": "max_output_tokens",
    "response_format": "text.format",
    "messages": "input",
}


class FunctionTool(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: Literal["function"]
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class TextFormat(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)

    type: Literal["text", "json_object", "json_schema"] = "text"
    name: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    description: str | None = None
    strict: bool | None = None


class TextOptions(BaseModel):
    model_config = ConfigDict(extra="allow")

    format: TextFormat | None = None


class NamedFunction(BaseModel):
    type: Literal["function"]
    name: str


class ResponsesRequest(BaseModel):
    model_config = ConfigDict(extra="allow")  # clients send fields nothing here needs

    model: str
    input: str | list[dict[str, Any]] = Field(default_factory=list)
    instructions: str | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedFunction | None = None
    parallel_tool_calls: bool | None = None
    text: TextOptions | None = None
    max_output_tokens: int | None = Field(default=None, ge=1, le=_INT32_MAX)
    temperature: float | None = None
    top_p: float | None = None
    stream: bool = False
    store: bool = True
    previous_response_id: str | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    background: Literal[False] | None = None  # runs that outlive their request: not served
    # A Conversations API object holds earlier turns this gateway cannot read: accepted and
    # dropped, its follow-ups ("continue") would be answered, and cached, without them.
    conversation: Any = None


def _bad(message: str, param: str) -> OpenAIError:
    return OpenAIError(400, message, param=param)


def _text_of(content: Any, param: str) -> str:
    """A message's content as text: a string, or text parts (input_text, output_text)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _bad("content must be a string or a list of content parts", param)
    texts = []
    for i, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in _TEXT_PARTS or not isinstance(part.get("text"), str):
            shown = kind if isinstance(kind, str) else "this part"
            raise _bad(f"content part type {shown!r} is not supported (text only)", f"{param}[{i}]")
        texts.append(part["text"])
    return "".join(texts)


def _calls_message(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The assistant message that function_call items join (the chat API's shape)."""
    if messages and messages[-1]["role"] == "assistant" and "tool_calls" in messages[-1]:
        return messages[-1]
    messages.append({"role": "assistant", "content": None, "tool_calls": []})
    return messages[-1]


def _add_item(messages: list[dict[str, Any]], item: Any, param: str) -> None:
    if not isinstance(item, dict):
        raise _bad("each input item must be an object", param)
    kind = item.get("type", "message")
    if kind == "message":
        role = item.get("role")
        if role not in ("user", "assistant", "system", "developer"):
            raise _bad(f"role {role!r} is not one of user, assistant, system, developer", param)
        content = _text_of(item.get("content"), f"{param}.content")
        messages.append({"role": role, "content": content})
    elif kind == "function_call":
        call = {"id": item.get("call_id"), "type": "function"}
        arguments = item.get("arguments", "")
        call["function"] = {"name": item.get("name"), "arguments": arguments}
        if not all(isinstance(v, str) for v in (call["id"], item.get("name"), arguments)):
            raise _bad("a function_call item needs call_id, name and arguments (a string)", param)
        _calls_message(messages)["tool_calls"].append(call)
    elif kind == "function_call_output":
        output = item.get("output")
        text = output if isinstance(output, str) else _text_of(output, f"{param}.output")
        if not isinstance(item.get("call_id"), str):
            raise _bad("a function_call_output item needs call_id", param)
        messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": text})
    elif kind != "reasoning":  # a reasoning model's notes: nothing here reads them back
        raise _bad(f"input item type {kind!r} is not supported", f"{param}.type")


def input_messages(body: ResponsesRequest) -> list[dict[str, Any]]:
    """The request's own input as chat messages (without instructions or history)."""
    if isinstance(body.input, str):
        return [{"role": "user", "content": body.input}]
    messages: list[dict[str, Any]] = []
    for i, item in enumerate(body.input):
        _add_item(messages, item, f"input[{i}]")
    return messages


def _response_format(text: TextOptions | None) -> dict[str, Any] | None:
    form = text.format if text is not None else None
    if form is None or form.type == "text":
        return None
    if form.type == "json_object":
        return {"type": "json_object"}
    if form.name is None:
        raise _bad("text.format.name is required for json_schema", "text.format.name")
    schema = {"name": form.name, "schema": form.schema_, "strict": form.strict}
    return {"type": "json_schema", "json_schema": schema}


def _tool_choice(choice: Any) -> Any:
    if isinstance(choice, NamedFunction):
        return {"type": "function", "function": {"name": choice.name}}
    return choice


def to_chat(body: ResponsesRequest, history: list[dict[str, Any]]) -> ChatCompletionRequest:
    """The chat completions request that answers `body`; `history`: the stored
    conversation `previous_response_id` names (its messages, then its answer)."""
    if body.conversation is not None:
        message = (
            "conversation is not supported: this gateway keeps no conversation objects; "
            "continue with previous_response_id, or send the earlier turns in input"
        )
        raise _bad(message, "conversation")
    messages = [{"role": "system", "content": body.instructions}] if body.instructions else []
    messages += history + input_messages(body)
    if not messages:
        raise _bad("input must not be empty", "input")
    dump = {"exclude": {"type", "strict"}, "exclude_none": True}
    tools = [{"type": "function", "function": t.model_dump(**dump)} for t in body.tools or []]
    chat: dict[str, Any] = {
        "model": body.model,
        "messages": messages,
        "tools": tools or None,
        "tool_choice": _tool_choice(body.tool_choice),
        "parallel_tool_calls": body.parallel_tool_calls,
        "response_format": _response_format(body.text),
        "max_tokens": body.max_output_tokens,
        "temperature": body.temperature,
        "top_p": body.top_p,
        "user": body.user,
        "stream": body.stream,
        "stream_options": {"include_usage": True} if body.stream else None,
    }
    try:
        return ChatCompletionRequest.model_validate(chat)
    except ValidationError as exc:  # e.g. a temperature out of range
        raise renamed_error(exc, _CHAT_NAMES) from None
