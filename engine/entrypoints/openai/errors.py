"""OpenAI errors for both HTTP servers (the engine's and the gateway's): the exception a
route raises, the status each engine error means, and the handlers that turn every error,
FastAPI's body validation included, into `{"error": {...}}` (never a 422)."""

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from engine.entrypoints.openai.error_bodies import error_response_body, validation_error_message
from engine.errors import (
    EngineDeadError,
    EngineError,
    PromptTooLongError,
    QueueFullError,
    RequestFailedError,
)

RETRY_AFTER_SECONDS = 1


class OpenAIError(Exception):
    """An error the client should see as `{"error": {...}}` with this HTTP status.

    `type` defaults from the status (see `error_response_body`)."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        type: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.type = type
        self.headers = headers or {}

    def body(self) -> dict:
        return error_response_body(self.status, self.message, self.type, self.param, self.code)

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


# The status and OpenAI code of each engine error; the first matching class wins.
ENGINE_ERROR_STATUS: dict[type[EngineError], tuple[int, str]] = {
    PromptTooLongError: (400, "context_length_exceeded"),
    QueueFullError: (429, "queue_full"),
    EngineDeadError: (503, "engine_dead"),
    RequestFailedError: (500, "request_failed"),
}


def engine_error_status(exc: EngineError) -> tuple[int, str] | None:
    """`(status, code)` for an engine error; None for one this table does not know."""
    for kind, status in ENGINE_ERROR_STATUS.items():
        if isinstance(exc, kind):
            return status
    return None


def engine_error(exc: EngineError | ValueError, prompt_param: str = "messages") -> OpenAIError:
    """The HTTP error a client of the engine server should see for an engine exception.

    A plain ValueError is the request's fault (empty prompt, bad token ids, a chat template
    that refuses the messages); `InvalidParamError` names its field, else the prompt's.
    """
    known = engine_error_status(exc) if isinstance(exc, EngineError) else None
    if known is None:
        if isinstance(exc, ValueError):
            return OpenAIError(400, str(exc), param=getattr(exc, "param", prompt_param))
        return OpenAIError(500, f"Engine error: {exc}")
    status, code = known
    if status == 400:  # the prompt, or max_tokens (CompletionTooLongError), does not fit
        param = getattr(exc, "param", prompt_param)
        return OpenAIError(status, str(exc), param=param, code=code)
    if status == 429:
        headers = {"Retry-After": str(RETRY_AFTER_SECONDS)}
        message = str(exc) or "The engine's waiting queue is full; retry shortly."
        return OpenAIError(status, message, code=code, headers=headers)
    if status == 503:
        return OpenAIError(status, str(exc) or "The engine is not running.", code=code)
    # The cause is in the server log; a client sees no internals.
    return OpenAIError(status, "The engine failed this request.", code=code)


def install_error_handlers(app: FastAPI) -> None:
    async def on_openai_error(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, OpenAIError)
        return exc.response()

    async def on_validation_error(_: Request, exc: Exception) -> Response:
        # OpenAI answers a bad body with 400, not FastAPI's 422.
        assert isinstance(exc, RequestValidationError)
        message, param = validation_error_message(exc.errors())
        return OpenAIError(400, message, param=param).response()

    async def on_http_error(_: Request, exc: Exception) -> Response:
        # Unknown paths and wrong methods: Starlette's {"detail": ...} is not what clients parse.
        assert isinstance(exc, StarletteHTTPException)
        headers = dict(exc.headers or {})
        return OpenAIError(exc.status_code, str(exc.detail), headers=headers).response()

    async def on_unexpected(_: Request, exc: Exception) -> Response:
        # Starlette logs the exception after this; the client gets OpenAI's shape without
        # the exception's text, which may name internals.
        return OpenAIError(500, "Internal server error.").response()

    app.add_exception_handler(OpenAIError, on_openai_error)
    app.add_exception_handler(Exception, on_unexpected)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
