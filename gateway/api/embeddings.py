"""POST /v1/embeddings, served by the embedder the semantic cache uses (all-MiniLM-L6-v2).

OpenAI's shape: `input` a string or a list of strings, `encoding_format` float or base64
(little-endian float32, what the openai client asks for by default and decodes),
`dimensions` only as the model's own 384. Authenticated, limited and counted per tenant
like the completion routes; the vectors are L2-normalised, as OpenAI's are.
"""

import asyncio
import base64
from typing import Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, field_validator

from engine.entrypoints.openai.errors import OpenAIError
from engine.entrypoints.openai.protocol import ModelCard
from gateway.api.deps import State, admit, authenticate, check_model_allowed, parse_body
from gateway.embedding.embedder import MODEL_NAME, Embedder, EmbedderNotInstalled
from gateway.state import GatewayState

router = APIRouter()

DIMENSIONS = 384  # all-MiniLM-L6-v2's; the model cannot shorten its vectors
MAX_INPUTS = 2048  # OpenAI's bound per request
MODEL_NAMES = frozenset({MODEL_NAME, f"sentence-transformers/{MODEL_NAME}"})


class EmbeddingRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str
    input: str | list[str] = Field(max_length=MAX_INPUTS)
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: str | None = None

    @field_validator("input", mode="before")
    @classmethod
    def _texts_only(cls, value: Any) -> Any:
        if isinstance(value, list) and value and not isinstance(value[0], str):
            raise ValueError("token arrays are not supported; send strings")
        if value == [] or value == "" or (isinstance(value, list) and "" in value):
            raise ValueError("inputs must be non-empty strings")
        return value

    @field_validator("dimensions")
    @classmethod
    def _native_only(cls, dimensions: int | None) -> int | None:
        if dimensions is not None and dimensions != DIMENSIONS:
            raise ValueError(f"{MODEL_NAME} makes {DIMENSIONS}-dimensional vectors only")
        return dimensions

    def texts(self) -> list[str]:
        return [self.input] if isinstance(self.input, str) else list(self.input)


def embedding_model_cards() -> list[ModelCard]:
    """What GET /v1/models lists for this route."""
    return [ModelCard(id=MODEL_NAME, owned_by="tiergate-embedder")]


async def get_embedder(state: GatewayState) -> Embedder:
    """The gateway's one embedder (the cache's and the router's), loaded on first use."""
    try:
        return await state.embedder.get(state.runtime.policy.embedder)
    except EmbedderNotInstalled as exc:
        raise OpenAIError(503, str(exc), code="embedder_unavailable") from exc


def _encode(vector: Any, encoding: str) -> list[float] | str:
    if encoding == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode()
    return vector.tolist()


@router.post("/v1/embeddings")
async def create_embeddings(request: Request, state: State) -> JSONResponse:
    runtime = state.runtime
    tenant = await authenticate(request, runtime)
    body = await parse_body(request, EmbeddingRequest)
    if body.model not in MODEL_NAMES:
        raise OpenAIError(
            404,
            f"The embedding model `{body.model}` does not exist; this gateway serves "
            f"`{MODEL_NAME}`.",
            param="model",
            code="model_not_found",
        )
    check_model_allowed(request, body.model)
    request.state.model = MODEL_NAME
    texts = body.texts()
    estimate = sum(len(t) for t in texts) // 4 + len(texts)
    admission = await admit(request, runtime, tenant, estimate)
    tokens = None
    try:
        embedder = await get_embedder(state)
        # Bulk work: micro-batches under the token budget, the request path's go first.
        vectors, tokens = await asyncio.to_thread(embedder.embed_counted, texts)
    finally:
        await admission.finish(tokens)
        state.stats.embeddings(tenant, len(texts), tokens or 0, ok=tokens is not None)
    data = [
        {"object": "embedding", "index": i, "embedding": _encode(v, body.encoding_format)}
        for i, v in enumerate(vectors)
    ]
    usage = {"prompt_tokens": tokens, "total_tokens": tokens}
    return JSONResponse({"object": "list", "data": data, "model": MODEL_NAME, "usage": usage})
