"""The asyncio client: the same calls as `ChitchatClient`, awaited.

It and `_sync.py` are a deliberate sync/async pair: the same calls, line for line, with and without
`await`. What they share that need not be written twice (requests, retries, parsing, streaming) is in
`_base.py`; a change to one is made to the other."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Self, Unpack, overload

import httpx

from app.client import _base, errors
from app.client._base import Call, Mode, Source, TimeoutLike, UploadOptions
from app.client.errors import ChitchatError, ConnectionFailed, NotReady
from app.client.models import (
    Health,
    IndexInfo,
    Info,
    Job,
    JobList,
    Readiness,
    ReplyResult,
    RollbackResult,
    SetList,
    SimilarResult,
    UploadAccepted,
)


class AsyncChitchatClient:
    """An asyncio client for the chit-chat retrieval service.

    ``token`` is the admin bearer token (``CHITCHAT_ADMIN_TOKEN`` on the server); only ``/admin`` calls send it.
    Errors raise a `ChitchatError` subclass named for the service's error kind; no response at all raises
    `ConnectionFailed`.

    Retries: only requests that are safe to repeat are retried -- every GET, ``similar``, and ``reply`` with an
    explicit ``context``. ``reply`` with a ``session_id`` (the server appends the turn to the session) and every
    admin POST (an upload queues a reindex; a rollback moves the serving version) are sent exactly once. A safe
    request is retried up to ``retries`` times on a connection failure (refused, reset, connect timeout) and on
    429, 502, 503 and 504, waiting what Retry-After asks (giving up if that is over a minute), else
    ``backoff`` seconds doubled each attempt (jittered, at most 8 s). Read timeouts are not retried.
    """

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        *,
        timeout: TimeoutLike = _base.DEFAULT_TIMEOUT,
        retries: int = _base.DEFAULT_RETRIES,
        backoff: float = _base.DEFAULT_BACKOFF,
        transport: httpx.AsyncBaseTransport | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.token = token
        self.retries = retries
        self.backoff = backoff
        self._sleep: Callable[[float], Awaitable[None]] = asyncio.sleep  # replaceable in tests
        self._http = httpx.AsyncClient(
            base_url=base_url,
            timeout=timeout,
            transport=transport,
            headers={"user-agent": _base.USER_AGENT, **(headers or {})},
        )

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _send(self, call: Call) -> httpx.Response:
        # A request id the caller set on the client wins.
        request_id = None if "x-request-id" in self._http.headers else _base.request_id()
        attempt = 0
        while True:
            kwargs = _base.request_kwargs(call, self.token, request_id)
            if call.file is not None:
                kwargs["content"] = _aiter_file(call.file)
            try:
                response = await self._http.request(call.method, call.path, **kwargs)
            except httpx.TransportError as error:
                delay = _base.retry_delay(call, attempt, self.retries, self.backoff, error=error)
                if delay is None:
                    raise _base.connection_failed(call, self._http.base_url, error) from error
            else:
                if _base.check(call, response):
                    return response
                delay = _base.retry_delay(call, attempt, self.retries, self.backoff, response=response)
                if delay is None:
                    raise errors.from_response(response)
            await self._sleep(delay)
            attempt += 1

    async def reply(
        self,
        context: str | Sequence[str] | None = None,
        *,
        session_id: str | None = None,
        message: str | None = None,
        k: int | None = None,
        strategies: Sequence[str] | None = None,
        rerank: bool | None = None,
        thresholds: Mapping[str, float] | None = None,
        filter: Mapping[str, Any] | None = None,
        exclude_ids: Sequence[str] | None = None,
        set_name: str | None = None,
    ) -> ReplyResult:
        """The best next reply: to ``context`` (turns oldest first; a str is one turn), or to ``message`` in
        the server-side session ``session_id``. ``strategies``: query_similarity, reply_matching, reaction.
        ``thresholds``: {"query_similarity": cos, "reply_matching": cos} overrides. ``filter``:
        {"tags_any": [...], "tags_all": [...], "tags_none": [...], "language": "ko"}; ``exclude_ids``:
        candidate ids never to answer with. A filter that admits nothing raises `NoCandidate`.
        ``set_name``: the candidate set to answer from (the default set unless given)."""
        call = _base.reply_call(
            context,
            session_id,
            message,
            k,
            strategies,
            rerank,
            thresholds,
            filter=filter,
            exclude_ids=exclude_ids,
            set_name=set_name,
        )
        return _base.parse(ReplyResult, await self._send(call))

    async def similar(
        self,
        text: str | None = None,
        *,
        pairs: Sequence[tuple[str, str]] | None = None,
        k: int | None = None,
        set_name: str | None = None,
    ) -> SimilarResult:
        """Stored queries of set ``set_name`` most similar to ``text`` (``matches``), or a cosine per pair
        (``scores``)."""
        return _base.parse(SimilarResult, await self._send(_base.similar_call(text, pairs, k, set_name)))

    async def submit_candidates(
        self,
        source: Source,
        mode: Mode = "append",
        *,
        on_invalid: str | None = None,
        content_type: str | None = None,
        set_name: str | None = None,
        encoder: str | None = None,
    ) -> UploadAccepted:
        """Upload candidates and return once the reindex job is queued. See `upload_candidates`."""
        call = _base.upload_call(source, mode, on_invalid, content_type, set_name, encoder)
        return _base.parse(UploadAccepted, await self._send(call))

    @overload
    async def upload_candidates(
        self, source: Source, mode: Mode = ..., *, wait: Literal[True] = ..., **options: Unpack[UploadOptions]
    ) -> Job: ...

    @overload
    async def upload_candidates(
        self, source: Source, mode: Mode = ..., *, wait: Literal[False], **options: Unpack[UploadOptions]
    ) -> UploadAccepted: ...

    @overload
    async def upload_candidates(
        self, source: Source, mode: Mode = ..., *, wait: bool, **options: Unpack[UploadOptions]
    ) -> Job | UploadAccepted: ...

    async def upload_candidates(
        self,
        source: Source,
        mode: Mode = "append",
        *,
        on_invalid: str | None = None,
        wait: bool = True,
        progress: bool = True,
        poll_interval: float = _base.DEFAULT_POLL_INTERVAL,
        wait_timeout: float | None = None,
        content_type: str | None = None,
        set_name: str | None = None,
        encoder: str | None = None,
    ) -> Job | UploadAccepted:
        """Upload candidates ({reply, query?, id?, metadata?}; {id} to delete) and reindex.

        ``source`` is a file path, streamed from disk (.jsonl/.ndjson, .json, .csv; or pass ``content_type``),
        or the records themselves. ``on_invalid="skip"`` asks the server to drop invalid records rather than
        refuse the upload (servers that predate it ignore it). With ``wait`` it polls the job, with a progress
        bar on stderr when ``progress``, and returns the finished `Job` -- failed or succeeded, check
        ``job.succeeded``; without, the `UploadAccepted`. Never retried. ``set_name``: the candidate set to
        upload to (the default set unless given); the first upload to a name creates the set.
        ``encoder``: the shipped encoder to build the set with (its own, or the default, unless given).
        """
        accepted = await self.submit_candidates(
            source, mode, on_invalid=on_invalid, content_type=content_type, set_name=set_name, encoder=encoder
        )
        if not wait:
            return accepted
        return await self.wait_for_job(
            accepted.job_id, progress=progress, poll_interval=poll_interval, timeout=wait_timeout
        )

    async def wait_for_job(
        self,
        job_id: str,
        *,
        progress: bool = True,
        poll_interval: float = _base.DEFAULT_POLL_INTERVAL,
        timeout: float | None = None,
    ) -> Job:
        """Poll until the job has left the queued and running states. Raises TimeoutError after ``timeout`` seconds
        (the job goes on on the server)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        bar = _base.JobProgress(job_id, progress)
        try:
            while True:
                job = await self.job(job_id)
                bar.update(job)
                if job.done:
                    return job
                if deadline is not None and time.monotonic() >= deadline:
                    raise TimeoutError(f"job {job_id} is still {job.state} ({job.stage}) after {timeout} s")
                await self._sleep(poll_interval)
        finally:
            bar.close()

    async def job(self, job_id: str) -> Job:
        return _base.parse(Job, await self._send(_base.job_call(job_id)))

    async def jobs(self, limit: int = _base.DEFAULT_JOBS, *, set_name: str | None = None) -> list[Job]:
        """The most recent reindex jobs (on any replica), newest first; at most ``limit``."""
        return _base.parse(JobList, await self._send(_base.jobs_call(limit, set_name))).jobs

    async def index(self, *, set_name: str | None = None) -> IndexInfo:
        """The serving index version, the versions kept, and the stored candidate count."""
        return _base.parse(IndexInfo, await self._send(_base.index_call(set_name)))

    async def rollback(self, *, set_name: str | None = None) -> RollbackResult:
        """Serve the index version before the current one. Conflict when there is none (or a reindex runs)."""
        return _base.parse(RollbackResult, await self._send(_base.rollback_call(set_name)))

    async def sets(self) -> SetList:
        """Every candidate set: its version, counts and index size, and the server's limits on sets."""
        return _base.parse(SetList, await self._send(_base.SETS))

    async def delete_set(self, set_name: str) -> None:
        """Remove a named set and its index versions on every replica (not the default set)."""
        await self._send(_base.delete_set_call(set_name))

    async def health(self) -> Health:
        return _base.parse(Health, await self._send(_base.HEALTH))

    async def ready(self) -> Readiness:
        """Readiness; a not-ready server (503) returns ``ready=False`` rather than raising."""
        return _base.parse_readiness(await self._send(_base.READY))

    async def wait_until_ready(self, timeout: float = 60.0, poll_interval: float = 0.5) -> Readiness:
        """Poll /readyz until the server is ready: it accepts requests while it still loads the bundle and
        index, answering 503 meanwhile. Raises TimeoutError, with the last reason, after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            readiness: Readiness | None = None
            failure: ChitchatError | None = None
            try:
                readiness = await self.ready()
                if readiness.ready:
                    return readiness
            except (ConnectionFailed, NotReady) as error:  # not listening yet, or a proxy's 503
                failure = error
            if time.monotonic() >= deadline:
                reason = _base.waiting_for_ready(readiness, failure)
                raise TimeoutError(f"{self._http.base_url} {reason} after {timeout} s")
            await self._sleep(poll_interval)

    async def info(self) -> Info:
        return _base.parse(Info, await self._send(_base.INFO))


async def _aiter_file(path: Path) -> AsyncIterator[bytes]:
    # Blocking reads of 64 KiB from a local file take well under a millisecond; a thread hop per chunk would
    # cost more than it saves.
    for chunk in _base.iter_file(path):
        yield chunk
