"""What the sync and async clients share: request building, the retry policy, response parsing, file streaming
and the job progress bar. Only the sending differs between them."""

from __future__ import annotations

import os
import random
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypedDict, TypeVar
from urllib.parse import quote

import httpx
import pydantic
from tqdm import tqdm

from app.client import errors
from app.client.models import Job, Readiness

Mode = Literal["append", "replace", "delete"]
Records = Iterable[Mapping[str, Any]]
Source = str | os.PathLike[str] | Records  # a file to stream, or the records themselves
TimeoutLike = float | httpx.Timeout


class UploadOptions(TypedDict, total=False):
    """`upload_candidates`' keyword options but `wait`, on which its overloads differ."""

    on_invalid: str | None
    progress: bool
    poll_interval: float
    wait_timeout: float | None
    content_type: str | None
    set_name: str | None
    encoder: str | None


DEFAULT_TIMEOUT = 10.0
# The server reads, parses and validates a whole upload (up to 32 MiB, 200k records) before it answers 202.
UPLOAD_TIMEOUT = httpx.Timeout(300.0, connect=10.0)
DEFAULT_RETRIES = 2
DEFAULT_BACKOFF = 0.5  # seconds before the first retry; doubles each time
MAX_BACKOFF = 8.0
# A server that asks for a longer pause than this is better reported to the caller than waited on.
MAX_RETRY_AFTER = 60.0
DEFAULT_POLL_INTERVAL = 0.5
DEFAULT_JOBS = 20  # jobs() lists this many
CHUNK_BYTES = 64 * 1024

# 429: the encoder queue is full. 503: not ready (starting up, a bundle swap). 502/504: a proxy in front of a
# replica that is restarting. All of these clear up on their own; anything else would fail again the same way.
RETRY_STATUSES = frozenset({429, 502, 503, 504})
# No response arrived. Timeouts other than connect are left out: the server may still be working on the
# request, and piling retries onto an overloaded encoder makes it worse.
RETRY_ERRORS: tuple[type[httpx.TransportError], ...] = (
    httpx.ConnectError,
    httpx.ConnectTimeout,
    httpx.ReadError,
    httpx.WriteError,
    httpx.RemoteProtocolError,
)

CONTENT_TYPES = {
    ".jsonl": "application/x-ndjson",
    ".ndjson": "application/x-ndjson",
    ".json": "application/json",
    ".csv": "text/csv",
}
USER_AGENT = "chitchat-client/0.1"

M = TypeVar("M", bound=pydantic.BaseModel)


@dataclass(frozen=True)
class Call:
    """One API request, independent of how it is sent."""

    method: str
    path: str
    idempotent: bool  # safe to send again: only these are retried
    params: Mapping[str, str] | None = None
    json: Any = None
    file: Path | None = None  # streamed as the body
    headers: Mapping[str, str] | None = None
    timeout: httpx.Timeout | None = None  # None: the client's
    admin: bool = False  # sends the bearer token
    answers: frozenset[int] = frozenset()  # error statuses whose body is the answer (/readyz's 503)


def reply_call(
    context: str | Sequence[str] | None,
    session_id: str | None,
    message: str | None,
    k: int | None,
    strategies: Sequence[str] | None,
    rerank: bool | None,
    thresholds: Mapping[str, float] | None,
    *,
    filter: Mapping[str, Any] | None = None,
    exclude_ids: Sequence[str] | None = None,
    set_name: str | None = None,
) -> Call:
    body: dict[str, Any] = {}
    if set_name is not None:
        body["set"] = set_name
    if context is not None:
        body["context"] = [context] if isinstance(context, str) else list(context)
    if session_id is not None:
        body["session_id"] = session_id
    if message is not None:
        body["message"] = message
    if k is not None:
        body["k"] = k
    if strategies is not None:
        body["strategies"] = list(strategies)
    if rerank is not None:
        body["rerank"] = rerank
    if thresholds is not None:
        # The server takes thresholds as strict floats.
        body["thresholds"] = {name: float(value) for name, value in thresholds.items()}
    if filter is not None:
        body["filter"] = {name: list(value) if name.startswith("tags") else value for name, value in filter.items()}
    if exclude_ids is not None:
        body["exclude_ids"] = list(exclude_ids)
    # A session reply appends the message and the reply to the session on the server: sent twice, both would
    # be recorded twice and the bot would avoid a reply it never delivered. A context reply changes nothing.
    return Call("POST", "/reply", idempotent=session_id is None and message is None, json=body)


def similar_call(
    text: str | None, pairs: Sequence[tuple[str, str]] | None, k: int | None, set_name: str | None = None
) -> Call:
    body: dict[str, Any] = {} if set_name is None else {"set": set_name}
    if text is not None:
        body["text"] = text
    if pairs is not None:
        body["pairs"] = [list(pair) for pair in pairs]
    if k is not None:
        body["k"] = k
    return Call("POST", "/similar", idempotent=True, json=body)


def upload_call(
    source: Source,
    mode: Mode,
    on_invalid: str | None,
    content_type: str | None,
    set_name: str | None = None,
    encoder: str | None = None,
) -> Call:
    # Deletions have a route of their own: their records are ids (or whole records), not candidates.
    path_for = admin_path(set_name, "candidates/delete" if mode == "delete" else "candidates")
    params: dict[str, str] = {} if mode == "delete" else {"mode": mode}
    if on_invalid is not None:
        params["on_invalid"] = on_invalid
    if encoder is not None:
        params["encoder"] = encoder
    if not isinstance(source, str | os.PathLike):
        records = [dict(record) for record in source]
        return Call(
            "POST",
            path_for,
            idempotent=False,
            params=params,
            json=records,
            timeout=UPLOAD_TIMEOUT,
            admin=True,
        )
    path = Path(source)
    content_type = content_type or CONTENT_TYPES.get(path.suffix.lower())
    if content_type is None:
        raise ValueError(
            f"cannot tell the format of {path.name} from its extension ({', '.join(CONTENT_TYPES)}); pass content_type"
        )
    # A declared length lets the server refuse an oversize file before any of it is sent; without it httpx
    # would send the stream chunked.
    headers = {"content-type": content_type, "content-length": str(path.stat().st_size)}
    return Call(
        "POST",
        path_for,
        idempotent=False,
        params=params,
        file=path,
        headers=headers,
        timeout=UPLOAD_TIMEOUT,
        admin=True,
    )


def job_call(job_id: str) -> Call:
    return Call("GET", f"/admin/jobs/{quote(job_id, safe='')}", idempotent=True, admin=True)


def jobs_call(limit: int, set_name: str | None = None) -> Call:
    if limit < 1:
        raise ValueError(f"limit must be at least 1, not {limit}")
    return Call("GET", admin_path(set_name, "jobs"), idempotent=True, params={"limit": str(limit)}, admin=True)


def iter_file(path: Path) -> Iterator[bytes]:
    with path.open("rb") as file:
        while chunk := file.read(CHUNK_BYTES):
            yield chunk


def request_id() -> str:
    """One id per call, sent with every attempt, so the server's access log ties the retries together."""
    return uuid.uuid4().hex


def request_kwargs(call: Call, token: str | None, request_id: str | None) -> dict[str, Any]:
    """httpx request arguments for `call`, without its body."""
    headers = dict(call.headers or {})
    if request_id is not None:
        headers["x-request-id"] = request_id
    if call.admin and token:
        headers["authorization"] = f"Bearer {token}"
    kwargs: dict[str, Any] = {"params": call.params, "headers": headers}
    if call.json is not None:
        kwargs["json"] = call.json
    if call.timeout is not None:
        kwargs["timeout"] = call.timeout
    return kwargs


def retry_delay(
    call: Call,
    attempt: int,
    retries: int,
    backoff: float,
    response: httpx.Response | None = None,
    error: Exception | None = None,
) -> float | None:
    """Seconds to wait before sending `call` again after `attempt` (0-based) failed, or None to give up."""
    if not call.idempotent or attempt >= retries:
        return None
    if response is not None:
        if response.status_code not in RETRY_STATUSES:
            return None
        asked = errors.retry_after(response)
        if asked is not None:
            return asked if asked <= MAX_RETRY_AFTER else None
    elif not isinstance(error, RETRY_ERRORS):
        return None
    step = min(MAX_BACKOFF, backoff * 2.0**attempt)
    # Jittered, so clients that failed together do not all come back together.
    return step / 2 + random.uniform(0, step / 2)


def connection_failed(call: Call, base_url: httpx.URL, error: httpx.TransportError) -> errors.ConnectionFailed:
    reason = str(error) or type(error).__name__
    return errors.ConnectionFailed(f"{call.method} {call.path} at {base_url}: {reason}")


def check(call: Call, response: httpx.Response) -> bool:
    """True when `response` is an answer to return; False when it is an error (raise or retry)."""
    return response.is_success or response.status_code in call.answers


def parse(model: type[M], response: httpx.Response) -> M:
    try:
        return model.model_validate_json(response.content)
    except pydantic.ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        raise errors.UnexpectedResponse(
            f"{response.request.method} {response.request.url.path} answered {response.status_code} with a body "
            f"that is not a {model.__name__} ({where}: {first['msg']})",
            status_code=response.status_code,
        ) from error


HEALTH = Call("GET", "/healthz", idempotent=True)
READY = Call("GET", "/readyz", idempotent=True, answers=frozenset({503}))
INFO = Call("GET", "/info", idempotent=True)
SETS = Call("GET", "/admin/sets", idempotent=True, admin=True)
DEFAULT_SET = "default"  # the set a call without one is about, as on the server


def admin_path(set_name: str | None, tail: str) -> str:
    """/admin/<tail> for the default set, /admin/sets/<name>/<tail> for another."""
    if set_name is None or set_name == DEFAULT_SET:
        return f"/admin/{tail}"
    return f"/admin/sets/{quote(set_name, safe='')}/{tail}"


def index_call(set_name: str | None) -> Call:
    return Call("GET", admin_path(set_name, "index"), idempotent=True, admin=True)


def rollback_call(set_name: str | None) -> Call:
    return Call("POST", admin_path(set_name, "rollback"), idempotent=False, admin=True)


def delete_set_call(set_name: str) -> Call:
    # Deleting what is already gone answers 404: safe to send again.
    return Call("DELETE", f"/admin/sets/{quote(set_name, safe='')}", idempotent=True, admin=True)


def parse_readiness(response: httpx.Response) -> Readiness:
    try:
        return parse(Readiness, response)
    except errors.UnexpectedResponse:
        if response.status_code == 503:
            # Not the service's own not-ready answer: a proxy's, say.
            raise errors.from_response(response) from None
        raise


def waiting_for_ready(readiness: Readiness | None, error: errors.ChitchatError | None) -> str:
    if readiness is not None:
        return f"not ready: {readiness.problem or 'no bundle or index loaded'}"
    return f"not reachable: {error}"


class JobProgress:
    """A tqdm bar over one job: the stage in the description, the stage's progress as the bar."""

    def __init__(self, job_id: str, enabled: bool) -> None:
        self._bar = tqdm(
            total=100,
            desc=f"job {job_id}",
            disable=not enabled,
            bar_format="{desc}: {percentage:3.0f}%|{bar}| {elapsed}",
        )
        self._stage: str | None = None

    def update(self, job: Job) -> None:
        if job.stage != self._stage:
            self._stage = job.stage
            self._bar.set_description_str(f"job {job.id} {job.stage}", refresh=False)
        if job.state == "failed":
            self._bar.set_description_str(f"job {job.id} failed in {job.stage}", refresh=False)
        self._bar.n = round(100 * min(max(job.progress, 0.0), 1.0), 1)
        self._bar.refresh()

    def close(self) -> None:
        self._bar.close()
