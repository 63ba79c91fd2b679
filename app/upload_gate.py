"""The upload gate: what refuses a candidate upload before its body is read, and where the upload
routes are.

The routes (app/routes/admin.py) are spelled from the pieces below, and `UPLOAD_ROUTE` matches
exactly them: the body reader gives their paths the admin body limit (app/main.py), and
`RefuseBeforeBody` answers their refusals before a byte of the body is read. The route asks
`refuse_before_body` again once the body is in: a job may have started since.
"""

from __future__ import annotations

import re
from urllib.parse import parse_qs

import anyio.to_thread
from starlette.types import ASGIApp, Receive, Scope, Send

from app.engine.runtime import Runtime, UnknownEncoder
from app.engine.sets import DEFAULT_SET, BadSetName, NoSuchSet, check_set_name
from app.errors import error_response, from_engine
from app.reindex.reindexer import Busy
from app.reindex.set_admin import Admin
from app.state import ServiceState

ADMIN = "/admin"  # the admin router's prefix
SET = "/sets/{name}"  # a named set's routes; the default set's have none
CANDIDATES = "/candidates"  # an upload, after ADMIN or ADMIN + SET
DELETE = "/delete"  # after CANDIDATES: a deletion
# Any upload route, matched whole: `name` absent for the default set's; `delete` on deletions.
UPLOAD_ROUTE = re.compile(
    ADMIN + f"(?:{SET.format(name='(?P<name>[^/]{1,64})')})?" + CANDIDATES + f"(?P<delete>{DELETE})?"
)
# A shipped bundle's directory name (`Settings.encoders_dir`); checked against them before the body is read.
ENCODER_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"


def check_encoder(runtime: Runtime, encoder: str | None) -> None:
    if encoder is not None and encoder not in runtime.encoders:
        raise UnknownEncoder(encoder, sorted(runtime.encoders))


async def refuse_before_body(admin: Admin, name: str, delete: bool, encoder: str | None) -> None:
    """What refuses an upload to set `name` without its body: an unknown encoder (404 naming
    `encoder`), a set name that is not one (422), a delete from a set that does not exist (404
    naming `set`), a set whose job holds its lock (409). Raised as the engine's exceptions."""
    check_encoder(admin.runtime, encoder)
    check_set_name(name)
    if name in admin.runtime.sets:
        target = await anyio.to_thread.run_sync(admin.of, name)
        holder = await anyio.to_thread.run_sync(target.reindexer.lock.holder)
        if holder is not None:
            raise Busy(f"reindex job {holder} is running")
    elif delete:
        raise NoSuchSet(name)


# What `refuse_before_body` raises; their kinds are the routes' (`errors.ENGINE_KINDS`).
REFUSALS = (UnknownEncoder, NoSuchSet, BadSetName, Busy)


class RefuseBeforeBody:
    """ASGI middleware: answers `refuse_before_body`'s refusals of an upload before a byte of its body
    is read. The route asks the same, but only once the body reader (`limits.BodySizeLimit`, which
    reads a body whole before the app sees it) has read up to 32 MiB, or waited for a body that
    never comes. Installed inside `limits.AdminGate`, so the token is checked first, and outside
    the body reader. Anything it cannot tell (the service still loading, Redis away) it leaves to
    the route."""

    def __init__(self, app: ASGIApp, service: ServiceState) -> None:
        self.app = app
        self.service = service

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        upload = (
            UPLOAD_ROUTE.fullmatch(scope["path"])
            if scope["type"] == "http" and scope["method"] in ("POST", "PUT")
            else None
        )
        if upload is not None and scope["method"] == "PUT" and (not upload["name"] or upload["delete"]):
            upload = None  # only a named set's candidates take PUT: the router answers the others' 405
        admin = self.service.admin if upload is not None else None
        if upload is not None and admin is not None:
            query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
            encoder = query.get("encoder", [None])[-1]
            if encoder is not None and not re.fullmatch(ENCODER_NAME, encoder[:64]):
                encoder = None  # not a name: the route's 422
            try:
                await refuse_before_body(admin, upload["name"] or DEFAULT_SET, bool(upload["delete"]), encoder)
            except REFUSALS as refusal:
                error = from_engine(refusal)
                # The body stays unread: the connection closes after the answer.
                await error_response(error, {"connection": "close"})(scope, receive, send)
                return
            except Exception:  # the route asks again, and answers with the error's own status
                pass
        await self.app(scope, receive, send)
