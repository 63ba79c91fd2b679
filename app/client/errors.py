"""Typed exceptions: one per error kind the service returns, plus two the client raises itself.

Every error body the service sends is
``{"error": {"kind": ..., "message": ..., "field": ..., "details": [...]}}``; `from_response` maps it to the
subclass for its kind. A body that is not in that shape (a proxy's HTML page, an empty 502) maps by status code.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

import httpx

__all__ = [
    "ChitchatError",
    "Conflict",
    "ConnectionFailed",
    "InternalError",
    "MethodNotAllowed",
    "NoCandidate",
    "NotFound",
    "NotReady",
    "Overloaded",
    "PayloadTooLarge",
    "Unauthorized",
    "UnexpectedResponse",
    "ValidationError",
]  # the exceptions, which app.client exports; from_response and retry_after are the clients' own

_MAX_TEXT = 300  # of a non-JSON error body quoted in a message


class ChitchatError(Exception):
    """Base of every error the client raises.

    `kind` is the service's error kind (or the client's own: ``connection_error``, ``unexpected_response``),
    `status_code` the HTTP status (None when no response came), `field` the offending request field
    (``context.0``, ``record 2.reply``, ``authorization``...), `details` one ``{field, message}`` per problem,
    `retry_after` seconds from a Retry-After header, when the response had one, `request_id` the
    X-Request-ID the server logged the request under.
    """

    kind: str = "error"

    def __init__(
        self,
        message: str,
        *,
        status_code: int | None = None,
        field: str | None = None,
        details: list[dict[str, Any]] | None = None,
        retry_after: float | None = None,
        request_id: str | None = None,
        kind: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status_code = status_code
        self.field = field
        self.details = details or []
        self.retry_after = retry_after
        self.request_id = request_id
        if kind is not None:
            # An instance of the base class for a kind this client does not know yet keeps the server's name.
            self.kind = kind

    def __str__(self) -> str:
        where = f" ({self.field})" if self.field and self.field not in self.message else ""
        return f"{self.kind}: {self.message}{where}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}(kind={self.kind!r}, status_code={self.status_code}, message={self.message!r})"


class ValidationError(ChitchatError):
    """422: the request (or an uploaded record) is invalid; `field` and `details` say where."""

    kind = "validation_error"


class PayloadTooLarge(ChitchatError):
    """413: the body is over the size limit, or an upload has too many records."""

    kind = "payload_too_large"


class Unauthorized(ChitchatError):
    """401: an admin call without a valid bearer token, or admin is disabled on the server."""

    kind = "unauthorized"


class NotFound(ChitchatError):
    """404: no such job (or route); also an index with no candidates for a strategy."""

    kind = "not_found"


class NoCandidate(NotFound):
    """404: no candidate may answer this /reply: its filter admits none, or every one is excluded."""

    kind = "no_candidate"


class MethodNotAllowed(ChitchatError):
    kind = "method_not_allowed"


class Conflict(ChitchatError):
    """409: a reindex is already running (on any replica), or there is nothing to roll back to."""

    kind = "conflict"


class Overloaded(ChitchatError):
    """429: too many requests waiting for the encoder; `retry_after` says when to try again."""

    kind = "overloaded"


class NotReady(ChitchatError):
    """503: no model or index loaded yet, or Redis unavailable for an admin call."""

    kind = "not_ready"


class InternalError(ChitchatError):
    kind = "internal_error"


class ConnectionFailed(ChitchatError):
    """No response: connection refused or reset, DNS failure, timeout. `__cause__` is the httpx error."""

    kind = "connection_error"


class UnexpectedResponse(ChitchatError):
    """A success status whose body is not what this client expects (not JSON, or not the documented shape)."""

    kind = "unexpected_response"


_BY_KIND: dict[str, type[ChitchatError]] = {
    cls.kind: cls
    for cls in (
        ValidationError,
        PayloadTooLarge,
        Unauthorized,
        NotFound,
        NoCandidate,
        MethodNotAllowed,
        Conflict,
        Overloaded,
        NotReady,
        InternalError,
    )
}

_BY_STATUS: dict[int, type[ChitchatError]] = {
    400: ValidationError,
    401: Unauthorized,
    403: Unauthorized,
    404: NotFound,
    405: MethodNotAllowed,
    409: Conflict,
    413: PayloadTooLarge,
    422: ValidationError,
    429: Overloaded,
    503: NotReady,
}


def retry_after(response: httpx.Response) -> float | None:
    """The Retry-After header in seconds (it may be a number or an HTTP date), or None."""
    value = response.headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


def _error_object(response: httpx.Response) -> dict[str, Any] | None:
    try:
        body = json.loads(response.content)
    except ValueError:
        return None
    error = body.get("error") if isinstance(body, dict) else None
    return error if isinstance(error, dict) and isinstance(error.get("kind"), str) else None


def from_response(response: httpx.Response) -> ChitchatError:
    """The exception for an error response, by the body's kind when it has one, else by status code."""
    status = response.status_code
    wait = retry_after(response)
    request_id = response.headers.get("x-request-id")
    error = _error_object(response)
    if error is not None:
        kind: str = error["kind"]
        cls = _BY_KIND.get(kind) or _BY_STATUS.get(status) or (InternalError if status >= 500 else ChitchatError)
        details = error.get("details")
        field = error.get("field")
        return cls(
            str(error.get("message") or kind),
            status_code=status,
            field=field if isinstance(field, str) else None,
            details=details if isinstance(details, list) else None,
            retry_after=wait,
            request_id=request_id,
            kind=None if kind in _BY_KIND else kind,
        )
    cls = _BY_STATUS.get(status) or (InternalError if status >= 500 else ChitchatError)
    text = response.text.strip()
    message = f"HTTP {status} {response.reason_phrase}".rstrip()
    if text:
        message += f": {text[:_MAX_TEXT]}" + ("..." if len(text) > _MAX_TEXT else "")
    generic = "http_error" if cls is ChitchatError else None
    return cls(message, status_code=status, retry_after=wait, request_id=request_id, kind=generic)
