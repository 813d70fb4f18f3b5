"""A request's prompt: a chat's messages and tools through the model's chat template, then
its token ids checked against the context, for both servers (the engine's and the
gateway's local tiers)."""

from typing import Protocol

from engine.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest
from engine.errors import InvalidParamError, PromptTooLongError

OpenAIRequest = ChatCompletionRequest | CompletionRequest


class Templating(Protocol):
    async def apply_chat_template(
        self, messages: list[dict], tools: list[dict] | None, add_generation_prompt: bool = True
    ) -> str: ...


class Prompting(Templating, Protocol):
    carries_tools: bool

    async def encode(self, text: str) -> list[int]: ...

    def check_room(self, num_prompt_tokens: int, max_tokens: int | None = None) -> None: ...


async def render_chat(engine: Templating, body: ChatCompletionRequest) -> str:
    """The prompt text; `PromptTooLongError` as the engine raises it, and a template that
    fails as `InvalidParamError` on `messages` (the template runs over client data and may
    `raise_exception` on bad role orders: whatever fails there is the request's fault)."""
    check_continuation(body)
    messages = [message.template_dict() for message in body.messages]
    tools = [tool.model_dump(exclude_none=True) for tool in body.tools] if body.tools else None
    try:
        if body.add_generation_prompt:  # doubles that predate the flag take two arguments
            return await engine.apply_chat_template(messages, tools)
        text = await engine.apply_chat_template(messages, tools, add_generation_prompt=False)
    except PromptTooLongError:
        raise
    except Exception as exc:
        message = f"Could not apply the chat template: {exc}"
        raise InvalidParamError("messages", message) from exc
    return continued(text, messages[-1]["content"]) if body.continue_final_message else text


def check_continuation(body: ChatCompletionRequest) -> None:
    """vLLM's rule: `continue_final_message` goes on with an assistant message, so no new
    turn may be opened for the model (`add_generation_prompt: false`)."""
    if not body.continue_final_message:
        return
    if body.add_generation_prompt or body.messages[-1].role != "assistant":
        message = "needs add_generation_prompt: false and an assistant message last"
        raise InvalidParamError("continue_final_message", message)


def continued(rendered: str, final: str) -> str:
    """The rendered chat cut right after the final message's content, so the model goes on
    with it (Hugging Face's `continue_final_message`: the template's end-of-turn dropped).
    A template that trims the content is matched on the trimmed text."""
    for content in (final, final.strip()):
        end = rendered.rfind(content) if content else -1
        if end >= 0:
            return rendered[: end + len(content)]
    message = "continue_final_message: the chat template does not show the final message"
    raise InvalidParamError("messages", message)


def requested_max_tokens(body: OpenAIRequest) -> int | None:
    return getattr(body, "max_completion_tokens", None) or body.max_tokens


def offers_tools(body: OpenAIRequest) -> bool:
    """Tools the model must read to choose from. A forced call (`tool_choice` required or
    named) is not among them: its grammar spells out the names and parameters."""
    if not isinstance(body, ChatCompletionRequest) or not body.tools:
        return False
    return body.tool_choice in (None, "auto")


def check_tools(engine: Prompting, body: OpenAIRequest) -> None:
    """A template that drops `tools` would answer as if none were given: refuse instead."""
    if offers_tools(body) and not getattr(engine, "carries_tools", True):  # doubles: can't tell
        message = "this model's chat template cannot show it `tools`; use a model that can"
        raise InvalidParamError("tools", message)


async def prompt_ids(engine: Prompting, body: OpenAIRequest) -> list[int]:
    """The prompt's token ids, refused up front (PromptTooLongError, CompletionTooLongError,
    InvalidParamError) when the model cannot take the request as asked."""
    check_tools(engine, body)
    is_chat = isinstance(body, ChatCompletionRequest)
    prompt = await render_chat(engine, body) if is_chat else body.prompt
    ids = await engine.encode(prompt) if isinstance(prompt, str) else list(prompt)
    engine.check_room(len(ids), requested_max_tokens(body))
    return ids
