"""The admin token check: one function, for the route dependency and for the gate that runs before
any admin body is read (`app.limits.AdminGate`)."""

from __future__ import annotations

import hmac

from pydantic import SecretStr

from app.errors import ApiError, ErrorKind


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
