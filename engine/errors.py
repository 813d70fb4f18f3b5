"""Errors the engine raises to its callers (the servers map them to HTTP statuses)."""


class EngineError(Exception):
    """Base class for errors a caller should turn into a client-facing error."""


class PromptTooLongError(EngineError, ValueError):
    """The prompt (plus at least one new token) does not fit the model's context: HTTP 400."""


class CompletionTooLongError(PromptTooLongError):
    """`max_tokens` asks for more than the context leaves after the prompt: HTTP 400."""

    param = "max_tokens"


class QueueFullError(EngineError):
    """The waiting queue is at its bound: HTTP 429 with Retry-After."""


class TenantQueueFullError(QueueFullError):
    """This tenant's share of the waiting queue is full (others may still queue): HTTP 429."""


class EngineDeadError(EngineError):
    """The step loop has stopped (crashed or shut down): HTTP 503."""


class RequestFailedError(EngineError):
    """This request failed inside the step loop (the others go on): HTTP 500."""


class InvalidParamError(ValueError):
    """A request field the engine refuses (e.g. a token id outside the vocabulary): HTTP 400."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param
