"""Logs as JSON lines, and one access line per request with the request id.

Every response carries `X-Request-ID` (the caller's, if it sent a sane one,
else a fresh one), and the access line holds it with the method, path,
status, duration, and what served the request: the strategy, the index
version and a digest of the session id. The conversation's text is never
logged unless `CHITCHAT_LOG_TEXT` asks for it (debugging only).
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import re
import sys
import time
from collections.abc import Callable
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

ACCESS = logging.getLogger("chitchat.access")
REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        line.update(getattr(record, "fields", {}))
        if record.exc_info:
            line["error"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False, default=str)


class _JsonHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Ours, so that configuring twice (tests create many apps) replaces it rather than doubling it."""


def configure(level: str) -> None:
    """JSON lines on stderr for every logger, ours and uvicorn's. Handlers others
    installed (a test's log capture) stay."""
    handler = _JsonHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [h for h in root.handlers if not isinstance(h, _JsonHandler)] + [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True


def session_digest(session_id: str) -> str:
    """Enough to follow one session through the logs without writing its id down."""
    return hashlib.blake2b(session_id.encode(), digest_size=6).hexdigest()


def note(scope: Scope, **fields: Any) -> None:
    """What a route wants in its request's access line (strategy, index version...)."""
    scope.setdefault("state", {}).setdefault("log", {}).update(fields)


class RequestLog:
    """Pure ASGI, outermost: it sees every response, 413s and 500s included."""

    def __init__(
        self,
        app: ASGIApp,
        enabled: bool = True,
        observe: Callable[[str, str, int, float], None] | None = None,
        static_routes: frozenset[str] = frozenset(),
    ) -> None:
        """observe(route template, method, status, seconds), for metrics. `static_routes`: paths
        that are their own route template, counted as such when refused before routing (429)."""
        self.app = app
        self.enabled = enabled
        self.observe = observe
        self.static_routes = static_routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = dict(scope["headers"]).get(b"x-request-id", b"").decode("latin-1")
        # 32 hex digits as uuid4 wrote them, at a tenth of its cost: an id names a request, it guards
        # nothing, and under a flood every refusal pays for one (the chaos flood of the in-flight limit).
        request_id = given if REQUEST_ID.match(given) else f"{random.getrandbits(128):032x}"
        scope.setdefault("state", {})["request_id"] = request_id
        started = time.perf_counter()
        status = 500  # if the app dies before answering, that is what the client saw

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", []), (b"x-request-id", request_id.encode())]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            seconds = time.perf_counter() - started
            if self.observe is not None:
                # The route's template, not the path: /admin/jobs/{job_id} is one series, and unmatched
                # paths (404s, scanners) all fall into one.
                route = getattr(scope.get("route"), "path", None)
                if route is None:
                    route = scope["path"] if scope["path"] in self.static_routes else "unmatched"
                self.observe(route, scope["method"], status, seconds)
            if self.enabled and ACCESS.isEnabledFor(logging.INFO):
                fields = {
                    "request_id": request_id,
                    "method": scope["method"],
                    "path": scope["path"],
                    "status": status,
                    "duration_ms": round(seconds * 1000, 2),
                    "client": (scope.get("client") or ("-",))[0],
                    **scope["state"].get("log", {}),
                }
                ACCESS.info("request", extra={"fields": fields})
