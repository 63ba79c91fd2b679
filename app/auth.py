"""The admin token check: one function, asked once a request. The gate that runs before any admin body
is read (`app.limits.AdminGate`) asks it of every admin request with a body and marks the ones it lets
through (`let_through`); the route dependency asks it of the others."""

from __future__ import annotations

import hmac

from pydantic import SecretStr
from starlette.types import Scope

from app.errors import ApiError, ErrorKind

_PASSED = "admin_token_passed"  # a key of the request's scope state


def admin_refusal(token: SecretStr | None, authorization: str | None) -> ApiError | None:
    """None if `authorization` ("Bearer <token>", any case of the scheme) carries the admin token;
    else the 401 to answer. With no token configured, admin is disabled."""
    expected = token.get_secret_value() if token else ""
    if not expected:
        return ApiError(ErrorKind.unauthorized, "admin is disabled: set CHITCHAT_ADMIN_TOKEN", "authorization")
    scheme, _, given = (authorization or "").strip().partition(" ")
    if scheme.lower() != "bearer":
        given = ""
    if not hmac.compare_digest(given.strip().encode(), expected.encode()):  # constant time: no length or prefix leaks
        return ApiError(ErrorKind.unauthorized, "a valid bearer token is required", "authorization")
    return None


def let_through(scope: Scope) -> None:
    """Marks a request whose token the gate has checked, for `passed`."""
    scope.setdefault("state", {})[_PASSED] = True


def passed(scope: Scope) -> bool:
    """Whether the gate has already let this request's token through."""
    return bool(scope.get("state", {}).get(_PASSED))
