"""The body of POST /v1/messages (Anthropic's Messages API) and its chat completions twin.

`to_chat` turns the system prompt, the messages' content blocks (text; an assistant's
tool_use blocks become its tool_calls; a user's tool_result blocks become tool messages),
the tools' input_schema, tool_choice and output_config.format (a JSON schema: structured
output) into a ChatCompletionRequest. Blocks the chat API
has no twin for (images, documents, thinking) are a 400 naming the block.
"""

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from engine.entrypoints.openai.errors import OpenAIError
from engine.entrypoints.openai.protocol import ChatCompletionRequest
from gateway.api.translated import renamed_error

_INT32_MAX = 2**31 - 1
_CHAT_NAMES = {"stop": "stop_sequences", "response_format": "output_config.format"}


class AnthropicTool(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str
    description: str | None = None
    input_schema: dict[str, Any]
    type: Literal["custom"] | None = None  # server tools (web search, bash...) are not served


class AnthropicToolChoice(BaseModel):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class OutputFormat(BaseModel):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(BaseModel):
    model_config = ConfigDict(extra="allow")  # e.g. `effort`: nothing here to tune

    format: OutputFormat | None = None


class AnthropicMessage(BaseModel):
    role: Literal["user", "assistant"]
    content: str | list[dict[str, Any]]


class MessagesRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str
    max_tokens: int = Field(ge=1, le=_INT32_MAX)
    messages: list[AnthropicMessage] = Field(min_length=1)
    system: str | list[dict[str, Any]] | None = None
    tools: list[AnthropicTool] | None = None
    tool_choice: AnthropicToolChoice | None = None
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(default=None, ge=0, le=1)
    top_p: float | None = None
    top_k: int | None = None
    stream: bool = False
    metadata: dict[str, Any] | None = None
    output_config: OutputConfig | None = None  # structured output: `format` a JSON schema


def _bad(message: str, param: str) -> OpenAIError:
    return OpenAIError(400, message, param=param)


def _block_kind(block: Any, param: str) -> str:
    kind = block.get("type") if isinstance(block, dict) else None
    if not isinstance(kind, str):
        raise _bad("each content block must be an object with a type", param)
    return kind


def _text(block: dict[str, Any], param: str) -> str:
    if not isinstance(block.get("text"), str):
        raise _bad("a text block needs its text", param)
    return block["text"]


def text_of(content: Any, param: str) -> str:
    """Text blocks (or a string) as one string; any other block is a 400."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _bad("content must be a string or a list of blocks", param)
    texts = []
    for i, block in enumerate(content):
        kind = _block_kind(block, f"{param}[{i}]")
        if kind != "text":
            raise _bad(f"content block type {kind!r} is not supported here", f"{param}[{i}]")
        texts.append(_text(block, f"{param}[{i}]"))
    return "".join(texts)


def _tool_call(block: dict[str, Any], param: str) -> dict[str, Any]:
    if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str):
        raise _bad("a tool_use block needs its id and name", param)
    arguments = json.dumps(block.get("input") or {}, ensure_ascii=False)
    return {
        "id": block["id"],
        "type": "function",
        "function": {"name": block["name"], "arguments": arguments},
    }


def _tool_result(block: dict[str, Any], param: str) -> dict[str, Any]:
    if not isinstance(block.get("tool_use_id"), str):
        raise _bad("a tool_result block needs its tool_use_id", param)
    text = text_of(block.get("content") or "", f"{param}.content")
    if block.get("is_error"):
        text = f"Error: {text}"
    return {"role": "tool", "tool_call_id": block["tool_use_id"], "content": text}


def _chat_messages(message: AnthropicMessage, param: str) -> list[dict[str, Any]]:
    """One Anthropic message as chat messages: tool results come first, as the chat API
    expects them straight after the assistant's calls."""
    if isinstance(message.content, str):
        return [{"role": message.role, "content": message.content}]
    texts, calls, results = [], [], []
    for i, block in enumerate(message.content):
        where = f"{param}.content[{i}]"
        kind = _block_kind(block, where)
        if kind == "text":
            texts.append(_text(block, where))
        elif kind == "tool_use" and message.role == "assistant":
            calls.append(_tool_call(block, where))
        elif kind == "tool_result" and message.role == "user":
            results.append(_tool_result(block, where))
        else:
            raise _bad(f"content block type {kind!r} is not supported here", where)
    out = results
    if texts or calls:
        out.append({"role": message.role, "content": "".join(texts) or None})
        if calls:
            out[-1]["tool_calls"] = calls
    return out


def _tool_choice(choice: AnthropicToolChoice | None) -> tuple[Any, bool | None]:
    """The chat API's tool_choice and parallel_tool_calls."""
    if choice is None:
        return None, None
    parallel = (
        None if choice.disable_parallel_tool_use is None else not choice.disable_parallel_tool_use
    )
    if choice.type == "tool":
        if choice.name is None:
            raise _bad("tool_choice of type tool needs the tool's name", "tool_choice.name")
        return {"type": "function", "function": {"name": choice.name}}, parallel
    return {"auto": "auto", "any": "required", "none": "none"}[choice.type], parallel


def system_text(body: MessagesRequest) -> str | None:
    return None if body.system is None else text_of(body.system, "system")


def to_chat(body: MessagesRequest) -> ChatCompletionRequest:
    system = system_text(body)
    messages = [{"role": "system", "content": system}] if system else []
    for i, message in enumerate(body.messages):
        messages += _chat_messages(message, f"messages[{i}]")
    tools = [
        {
            "type": "function",
            "function": {
                "name": t.name,
                "description": t.description,
                "parameters": t.input_schema,
            },
        }
        for t in body.tools or []
    ]
    choice, parallel = _tool_choice(body.tool_choice)
    form = body.output_config.format if body.output_config is not None else None
    schema = {"name": "output", "schema": form.schema_} if form is not None else None
    chat = {
        "model": body.model,
        "messages": messages,
        "max_tokens": body.max_tokens,
        "tools": tools or None,
        "tool_choice": choice,
        "parallel_tool_calls": parallel,
        "stop": body.stop_sequences,
        "response_format": {"type": "json_schema", "json_schema": schema} if schema else None,
        "temperature": body.temperature,
        "top_p": body.top_p,
        "top_k": body.top_k,
        "stream": body.stream,
        "stream_options": {"include_usage": True} if body.stream else None,
    }
    try:
        return ChatCompletionRequest.model_validate(chat)
    except ValidationError as exc:
        raise renamed_error(exc, _CHAT_NAMES) from None
