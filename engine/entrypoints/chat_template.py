"""A chat request's prompt: its messages and tools through the model's chat template, for
both servers (the engine's and the gateway's local tiers)."""

from typing import Protocol

from engine.errors import InvalidParamError, PromptTooLongError
from engine.protocol import ChatCompletionRequest


class Templating(Protocol):
    async def apply_chat_template(self, messages: list[dict], tools: list[dict] | None) -> str: ...


async def render_chat(engine: Templating, body: ChatCompletionRequest) -> str:
    """The prompt text; `PromptTooLongError` as the engine raises it, and a template that
    fails as `InvalidParamError` on `messages` (the template runs over client data and may
    `raise_exception` on bad role orders: whatever fails there is the request's fault)."""
    messages = [message.template_dict() for message in body.messages]
    tools = [tool.model_dump(exclude_none=True) for tool in body.tools] if body.tools else None
    try:
        return await engine.apply_chat_template(messages, tools)
    except PromptTooLongError:
        raise
    except Exception as exc:
        message = f"Could not apply the chat template: {exc}"
        raise InvalidParamError("messages", message) from exc
