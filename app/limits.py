"""Limits enforced before a request's body is parsed: its size, the time it
may take to arrive and how many are being read at once, how many requests are
in flight, and, on admin routes, the token and how many admin bodies are being
read at once.

Pure ASGI, so they cost a refused request almost nothing, and the size limit
sees chunked uploads too: a missing or false Content-Length cannot smuggle a
larger body past it.

In order, outermost first (app/main.py): the admin gate, admission's refusal
while every slot is taken, the body reader (size, deadline, readers at once),
then admission's count. A request counts against the in-flight limit only once
its body is in: counted before, 48 sockets that sent one byte of their bodies
held all 32 slots, with no deadline, and every other /reply was 429 until they
closed.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from pydantic import SecretStr
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.auth import admin_refusal, let_through
from app.errors import STATUS, ApiError, ErrorKind, error_body


async def _send_error(send: Send, error: ApiError, headers: list[tuple[bytes, bytes]] | None = None) -> None:
    payload = json.dumps(error_body(error)).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(payload)).encode()),
        *(headers or []),
    ]
    await send({"type": "http.response.start", "status": STATUS[error.kind], "headers": headers})
    await send({"type": "http.response.body", "body": payload})


async def _refuse_busy(send: Send, message: str, close: bool) -> None:
    """429 with a retry-after; `close`: the body is left unread, so the connection closes after it."""
    headers = [(b"retry-after", b"1"), *([(b"connection", b"close")] if close else [])]
    await _send_error(send, ApiError(ErrorKind.overloaded, message), headers)


class _Counts(Protocol):
    in_flight: int


async def _run_counted(counts: _Counts, app: ASGIApp, scope: Scope, receive: Receive, send: Send) -> None:
    """The request, counted in `counts.in_flight` until its answer is sent (or it ends unanswered).

    Not until the app returns: a client that sends its next request the moment an answer arrives
    (wrk, a chat app's next turn) could otherwise meet its own last request still counted, the
    app's tail after the answer not yet run, and get a 429 with every other slot free."""
    counts.in_flight += 1
    counted = True

    async def answer(message: Message) -> None:
        nonlocal counted
        if counted and message["type"] == "http.response.body" and not message.get("more_body", False):
            counted = False
            counts.in_flight -= 1
        await send(message)

    try:
        await app(scope, receive, answer)
    finally:
        if counted:
            counts.in_flight -= 1


@dataclass
class Admission:
    """How many requests the admission limit holds and has refused (metrics read it)."""

    max_in_flight: int
    in_flight: int = 0
    refused: int = 0


class AdmissionLimit:
    """Past `max_in_flight` requests on `paths`, a new one gets 429 at once.

    The encoder queue and the search pool refuse too, but only after the
    request was parsed and validated: under a flood that work, on the
    same event loop, is what delays every answer, refusals included (text-
    embeddings-inference's `max_concurrent_requests` is the same check).

    Installed twice, around `BodySizeLimit` (app/main.py). Inside it (`counts`), it counts a request
    once its body is in hand, so a client slow to send its body waits at the reader's deadline, not
    in a slot. Outside it, it only refuses, before a body is read, while the slots are all taken: the
    refusals a flood gets then skip the reader's timer and replay (the chaos suite's flood of the
    in-flight limit; docs/experiments.md has the figures)."""

    def __init__(
        self,
        app: ASGIApp,
        admission: Admission,
        paths: frozenset[str],
        max_drain_bytes: int,
        counts: bool = True,
        drain_deadline_s: float | None = None,
    ) -> None:
        self.app = app
        self.admission = admission
        self.paths = paths
        self.max_drain_bytes = max_drain_bytes  # the body size limit: past it, the connection closes instead
        self.counts = counts  # False: refuses while full, and counts nothing
        self.drain_deadline_s = drain_deadline_s  # a refused body's deadline to arrive; past it, the connection closes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] not in self.paths:
            await self.app(scope, receive, send)
            return
        admission = self.admission
        if admission.in_flight >= admission.max_in_flight:
            admission.refused += 1
            busy = f"{admission.in_flight} requests already in flight; retry shortly"
            await _refuse_busy(send, busy, close=not await self._drained(receive))
            return
        if self.counts:
            await _run_counted(admission, self.app, scope, receive, send)
        else:
            await self.app(scope, receive, send)

    async def _drained(self, receive: Receive) -> bool:
        """Reads what was sent, unparsed, so the connection stays usable for the retry; but no more
        than a body may hold, nor for longer than its deadline, or an overloaded server would read a
        huge or endless upload whole. Whether the body ended."""
        drained = 0
        try:
            async with asyncio.timeout(self.drain_deadline_s):
                while drained <= self.max_drain_bytes:
                    message = await receive()
                    drained += len(message.get("body", b""))
                    if message["type"] != "http.request" or not message.get("more_body", False):
                        return True
        except TimeoutError:
            pass
        return False


class _TooLarge(Exception):
    pass


class BodySizeLimit:
    """Reads a request's body whole before the app sees it: at most its path's limit (413 past it),
    and, but on admin routes, within `deadline_s` of the first read (408 past it, the connection
    closed) and at most `max_reading` bodies at once (429 past it, the body unread, the connection
    closed). Admin bodies are bounded by `AdminGate` (a token first, a few at a time), and an upload
    of 32 MiB may take longer than a chat message's deadline."""

    def __init__(
        self,
        app: ASGIApp,
        max_bytes: int,
        bulk_bytes: int | None = None,
        bulk_paths: re.Pattern[str] | None = None,
        path_bytes: Mapping[str, int] | None = None,
        deadline_s: float | None = None,
        max_reading: int | None = None,
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.bulk_bytes = bulk_bytes or max_bytes  # the limit of paths that take bulk uploads
        self.bulk_paths = bulk_paths  # matched whole against the path
        self.path_bytes = dict(path_bytes or {})  # paths with a limit of their own (their schema's largest body)
        self.deadline_s = deadline_s  # None: no deadline
        self.max_reading = max_reading  # None: no bound
        self.reading = 0  # bodies being read now, admin ones apart
        self.timed_out = 0  # bodies answered 408
        self.refused = 0  # bodies refused unread: `max_reading` were being read

    async def _reject(self, send: Send, limit: int) -> None:
        await _send_error(send, ApiError(ErrorKind.payload_too_large, f"request body exceeds {limit} bytes", "body"))

    @staticmethod
    async def _read(receive: Receive, limit: int) -> bytes | None:
        """The whole body; None if the client left first. Raises _TooLarge past `limit`."""
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise _TooLarge
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        bulk = self.bulk_paths is not None and self.bulk_paths.fullmatch(scope["path"]) is not None
        limit = self.bulk_bytes if bulk else self.path_bytes.get(scope["path"], self.max_bytes)
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            await self._reject(send, limit)
            return
        bounded = not _admin(scope["path"])
        close = [(b"connection", b"close")]  # what is left of the body is never read
        if bounded and self.max_reading is not None and self.reading >= self.max_reading:
            self.refused += 1
            await _refuse_busy(send, f"{self.reading} request bodies already being read; retry shortly", close=True)
            return
        deadline = self.deadline_s if bounded else None
        if bounded:
            self.reading += 1
        try:
            async with asyncio.timeout(deadline):
                body = await self._read(receive, limit)
        except _TooLarge:
            await self._reject(send, limit)
            return
        except TimeoutError:
            self.timed_out += 1
            late = ApiError(ErrorKind.request_timeout, f"request body not received within {deadline:g} s", "body")
            await _send_error(send, late, close)
            return
        finally:
            if bounded:
                self.reading -= 1
        if body is None:
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)


class AdminGate:
    """On admin routes that carry a body: the token first, then at most `max_bodies` bodies in flight,
    both before a byte of the body is read. Without it, an unauthenticated upload was read whole (up
    to 32 MiB) before its 401, and nothing bounded how many were read at once. A refused body is not
    read: the connection closes after the answer."""

    def __init__(self, app: ASGIApp, token: SecretStr | None, max_bodies: int) -> None:
        self.app = app
        self.token = token
        self.max_bodies = max_bodies
        self.in_flight = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS") or not _admin(scope["path"]):
            await self.app(scope, receive, send)
            return
        close = [(b"connection", b"close")]
        authorization = dict(scope["headers"]).get(b"authorization", b"").decode("latin-1")
        refusal = admin_refusal(self.token, authorization)
        if refusal is not None:
            await _send_error(send, refusal, [(b"www-authenticate", b"Bearer"), *close])
            return
        let_through(scope)  # the route's dependency does not ask again
        if self.in_flight >= self.max_bodies:
            await _refuse_busy(send, f"{self.in_flight} admin requests already in flight; retry shortly", close=True)
            return
        await _run_counted(self, self.app, scope, receive, send)


def _admin(path: str) -> bool:
    return path == "/admin" or path.startswith("/admin/")
