"""One closed set of error kinds, one JSON shape:

{"error": {"kind": "validation_error", "message": "...", "field": "context.0",
           "details": [{"field": "context.0", "message": "..."}]}}
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from enum import StrEnum
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from redis.exceptions import RedisError
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.engine.batcher import Closed, Overloaded
from app.engine.kv import RedisBusy
from app.engine.pipeline import NoCandidates, Unsupported
from app.engine.runtime import UnknownEncoder
from app.engine.sets import BadSetName, NoSuchSet, NotReady
from app.reindex.reindexer import Busy
from app.reindex.set_admin import SetLimit
from app.reindex.uploads import UploadError

log = logging.getLogger(__name__)


class ErrorKind(StrEnum):
    validation = "validation_error"
    payload_too_large = "payload_too_large"
    request_timeout = "request_timeout"  # 408: the body did not arrive within its deadline
    unauthorized = "unauthorized"
    not_found = "not_found"
    no_candidate = "no_candidate"  # 404: nothing in the candidate set may answer this request
    method_not_allowed = "method_not_allowed"
    conflict = "conflict"
    overloaded = "overloaded"
    not_ready = "not_ready"
    internal = "internal_error"


STATUS = {
    ErrorKind.validation: 422,
    ErrorKind.payload_too_large: 413,
    ErrorKind.request_timeout: 408,
    ErrorKind.unauthorized: 401,
    ErrorKind.not_found: 404,
    ErrorKind.no_candidate: 404,
    ErrorKind.method_not_allowed: 405,
    ErrorKind.conflict: 409,
    ErrorKind.overloaded: 429,
    ErrorKind.not_ready: 503,
    ErrorKind.internal: 500,
}


class ErrorDetail(BaseModel):
    field: str | None
    message: str


class ErrorInfo(BaseModel):
    kind: ErrorKind
    message: str
    field: str | None = None
    details: list[ErrorDetail] = []


class ErrorBody(BaseModel):
    """The body of every error response."""

    error: ErrorInfo


def responses(*kinds: ErrorKind) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` for these error kinds: the statuses a route can answer, with the one error shape."""
    return {STATUS[k]: {"model": ErrorBody, "description": k.value} for k in kinds}


# What any route can answer: bad input, too big, too busy, not loaded yet, a bug.
COMMON = (
    ErrorKind.validation,
    ErrorKind.payload_too_large,
    ErrorKind.overloaded,
    ErrorKind.not_ready,
    ErrorKind.internal,
)


class ApiError(Exception):
    def __init__(
        self, kind: ErrorKind, message: str, field: str | None = None, details: list[dict[str, Any]] | None = None
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.field = field
        self.details = details or ([{"field": field, "message": message}] if field else [])


def error_body(error: ApiError) -> dict[str, Any]:
    return {
        "error": {"kind": error.kind.value, "message": error.message, "field": error.field, "details": error.details}
    }


def error_response(error: ApiError, headers: Mapping[str, str] | None = None) -> JSONResponse:
    """`headers`: what the error already carries, e.g. a 405's Allow."""
    headers = dict(headers or {})
    if error.kind is ErrorKind.unauthorized:
        headers["WWW-Authenticate"] = "Bearer"
    if error.kind is ErrorKind.overloaded:
        headers["Retry-After"] = "1"
    return JSONResponse(error_body(error), status_code=STATUS[error.kind], headers=headers or None)


def _field(loc: tuple[int | str, ...]) -> str:
    # ("body", "context", 3) -> "context.3"; a body that is not JSON at all -> "body"
    parts = [str(p) for p in loc if p not in ("body", "query", "path")]
    return ".".join(parts) or "body"


def from_validation(exc: RequestValidationError) -> ApiError:
    details = [
        # A JSON syntax error's loc ends in a character offset, not a field.
        {"field": "body" if e["type"] == "json_invalid" else _field(tuple(e["loc"])), "message": e["msg"]}
        for e in exc.errors()
    ]
    first = details[0] if details else {"field": "body", "message": "invalid request"}
    return ApiError(ErrorKind.validation, f"{first['field']}: {first['message']}", first["field"], details)


_HTTP_KINDS = {
    401: ErrorKind.unauthorized,
    404: ErrorKind.not_found,
    405: ErrorKind.method_not_allowed,
    413: ErrorKind.payload_too_large,
}


# The engine and the admin side know nothing of HTTP; their failures map to kinds here, once: for
# the routes (`install`) and for what refuses an upload before its body is read.
ENGINE_KINDS: dict[type[Exception], ErrorKind] = {
    NotReady: ErrorKind.not_ready,
    Closed: ErrorKind.not_ready,  # shutting down: another replica can answer
    Overloaded: ErrorKind.overloaded,
    RedisBusy: ErrorKind.overloaded,  # no pooled Redis connection came free: a session turn is refused, not lost
    NoCandidates: ErrorKind.no_candidate,
    Busy: ErrorKind.conflict,
    NoSuchSet: ErrorKind.not_found,
    BadSetName: ErrorKind.validation,
    UnknownEncoder: ErrorKind.not_found,
}


def from_engine(error: Exception) -> ApiError:
    """The answer to one of ENGINE_KINDS' exceptions, naming the field it names, if any."""
    return ApiError(ENGINE_KINDS[type(error)], str(error), getattr(error, "field", None))


def _allowed(app: FastAPI, path: str, given: str) -> list[str]:
    """The methods of every route whose template matches `path`, and those already `given`."""
    methods = {m.strip() for m in given.split(",") if m.strip()}
    for template, item in app.openapi().get("paths", {}).items():
        if re.fullmatch(re.sub(r"\\\{[^/]+?\\\}", "[^/]+", re.escape(template)), path):
            methods |= {m.upper() for m in item if m.upper() in _HTTP_METHODS}
    return sorted(methods)


_HTTP_METHODS = {"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"}


def install(app: FastAPI) -> None:
    async def api_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ApiError)
        return error_response(exc)

    async def validation_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return error_response(from_validation(exc))

    async def http_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        if exc.status_code == 400:
            # FastAPI's only 400: a body it could not parse at all (invalid UTF-8,
            # JSON nested too deeply). Like any other bad body, the field is "body".
            return error_response(ApiError(ErrorKind.validation, f"body: {exc.detail}", "body"))
        kind = _HTTP_KINDS.get(exc.status_code, ErrorKind.validation if exc.status_code < 500 else ErrorKind.internal)
        headers = dict(exc.headers or {})
        if exc.status_code == 405 and "Allow" in headers:
            # Allow lists what the path takes (RFC 9110 15.5.6); Starlette names only the first
            # route that matched it, and POST and PUT on one path are two routes.
            headers["Allow"] = ", ".join(_allowed(request.app, request.url.path, headers["Allow"]))
        return error_response(ApiError(kind, str(exc.detail)), headers)

    async def engine_error(_: Request, exc: Exception) -> JSONResponse:
        return error_response(from_engine(exc))

    async def unsupported(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, Unsupported)
        return error_response(ApiError(ErrorKind.validation, str(exc), exc.field))

    async def set_limit(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, SetLimit)
        kind = ErrorKind.payload_too_large if exc.too_large else ErrorKind.conflict
        return error_response(ApiError(kind, str(exc), exc.field))

    async def upload_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, UploadError)
        kind = ErrorKind.payload_too_large if exc.too_large else ErrorKind.validation
        return error_response(ApiError(kind, exc.message, exc.field, exc.details or None))

    async def redis_error(_: Request, exc: Exception) -> JSONResponse:
        # Only admin routes reach Redis without the serving path's guard.
        return error_response(ApiError(ErrorKind.not_ready, f"redis unavailable: {exc}"))

    async def storage_error(_: Request, exc: Exception) -> JSONResponse:
        # The artifacts volume refused a write or a read (full, read-only, gone): a fault of the
        # machine, not of the request. The writes that reach here (a rollback's pointer) change
        # nothing when they fail, so the client may try again once the volume is back.
        assert isinstance(exc, OSError)
        log.error("storage: %s", exc)
        return error_response(ApiError(ErrorKind.not_ready, f"storage unavailable: {exc.strerror or exc}"))

    async def unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error", exc_info=exc)
        return error_response(ApiError(ErrorKind.internal, "internal error"))

    app.add_exception_handler(ApiError, api_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
    for engine_exception in ENGINE_KINDS:
        app.add_exception_handler(engine_exception, engine_error)
    app.add_exception_handler(Unsupported, unsupported)
    app.add_exception_handler(UploadError, upload_error)
    app.add_exception_handler(SetLimit, set_limit)
    app.add_exception_handler(RedisError, redis_error)
    app.add_exception_handler(OSError, storage_error)
    app.add_exception_handler(Exception, unexpected)
