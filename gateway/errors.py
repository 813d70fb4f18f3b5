"""Every error leaves the gateway as an OpenAI error body with a meaningful status."""

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from engine.protocol import error_response_body, validation_error_message


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        type: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.type = type
        self.headers = headers or {}


def error_response(exc: ApiError) -> JSONResponse:
    body = error_response_body(exc.status, exc.message, exc.type, exc.param, exc.code)
    return JSONResponse(body, status_code=exc.status, headers=exc.headers)


async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
    return error_response(exc)


async def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
    # Unknown paths and wrong methods: Starlette's {"detail": ...} is not what clients parse.
    return error_response(ApiError(exc.status_code, str(exc.detail), headers=exc.headers))


async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    # FastAPI answers 422 by default; OpenAI clients expect 400 for a bad body.
    message, param = validation_error_message(exc.errors())
    return error_response(ApiError(400, message, param=param))


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
