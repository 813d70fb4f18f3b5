"""OpenAI's `logprobs` objects, chat and text-completion flavours, from the engine's
per-token logprobs. Import-light (pydantic only), like engine/entrypoints/openai/protocol.py."""

from pydantic import BaseModel

from engine.outputs import Logprob, TokenLogprobs


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: list[ChatTokenLogprob] | None = None
    refusal: list[ChatTokenLogprob] | None = None


class CompletionLogprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int]


def _top(lp: Logprob) -> TopLogprob:
    return TopLogprob(token=lp.token, logprob=lp.logprob, bytes=list(lp.token_bytes))


def chat_logprobs(entries: list[TokenLogprobs]) -> ChatLogprobs:
    content = [
        ChatTokenLogprob(**_top(e.chosen).model_dump(), top_logprobs=[_top(t) for t in e.top])
        for e in entries
    ]
    return ChatLogprobs(content=content)


def completion_logprobs(entries: list[TokenLogprobs], text_offset: int = 0) -> CompletionLogprobs:
    """`text_offset`: where the first entry's token starts in the completion's text (a
    stream's later chunks start after the text already sent)."""
    offsets = []
    for e in entries:
        offsets.append(text_offset)
        text_offset += len(e.chosen.token)
    return CompletionLogprobs(
        tokens=[e.chosen.token for e in entries],
        token_logprobs=[e.chosen.logprob for e in entries],
        # a dict per token, as OpenAI's legacy API: two tokens with one text keep the likelier
        top_logprobs=[{t.token: t.logprob for t in reversed(e.top)} for e in entries],
        text_offset=offsets,
    )
