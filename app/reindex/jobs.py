"""Reindex jobs and the one-at-a-time lock, in Redis or, without it, on disk
and in process.

A job is alive exactly while its token holds the lock: the holder renews it
every few seconds, so a process that dies frees it within LOCK_TTL_S. An
active job whose token does not hold the lock is dead, and the next look at
the jobs (a start, an upload, a listing) marks it failed. Nothing here asks
a hostname or a pid: two replicas on one host, or two containers that share
a hostname, never read each other as dead.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import redis

from core.files import write_atomic
from core.process import THIS_PROCESS, Owner

JobState = Literal["queued", "running", "succeeded", "failed"]
JOB_TTL_S = 7 * 24 * 3600
LOCK_KEY = "reindex:lock"
LOCK_TTL_S = 15  # a crashed holder frees the lock this fast; a live one renews it
LOCK_RENEW_S = 3  # well inside the TTL: a Redis pause of a few seconds costs no lock
# An active job that lost (or released) the lock this recently may be saving its final
# state: the holder releases the lock first, so that a client that sees it done can upload.
FINISHING_GRACE_S = 10
RECENT_KEY = "jobs:recent"  # every job id, scored by creation time: the listing's order


@dataclass
class Job:
    id: str
    mode: str
    state: JobState = "queued"
    stage: str = "queued"
    progress: float = 0.0  # of the current stage, 0..1
    counts: dict[str, int] = field(default_factory=dict)
    # What the upload skipped (on_invalid=skip) and which duplicates it resolved, and how.
    report: dict[str, Any] = field(default_factory=dict)
    version: str | None = None  # the version it built
    previous_version: str | None = None  # what served before it
    error: str | None = None
    created_at: float = field(default_factory=time.time)
    updated_at: float = field(default_factory=time.time)
    owner: str = ""  # "replica/boot" of the process running it; "" if written before owners were recorded

    @staticmethod
    def new(mode: str, owner: Owner = THIS_PROCESS) -> Job:
        return Job(id=uuid.uuid4().hex[:16], mode=mode, owner=str(owner))

    @property
    def token(self) -> str:
        """What the lock holds while this job runs."""
        return f"{self.id}@{self.owner}" if self.owner else self.id

    @classmethod
    def from_json(cls, raw: str | bytes) -> Job:
        """Tolerant of fields this version does not know: during a rolling deploy a
        newer replica may have written the job."""
        body = json.loads(raw)
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in body.items() if k in known})

    @property
    def active(self) -> bool:
        return self.state in ("queued", "running")


class JobStore(Protocol):
    def save(self, job: Job) -> None: ...
    def get(self, job_id: str) -> Job | None: ...
    def active(self) -> list[Job]: ...
    def recent(self, limit: int) -> list[Job]: ...  # newest first
    def remove(self) -> None: ...  # every job of the set: it is being deleted


class RedisJobStore:
    def __init__(self, client: redis.Redis, prefix: str = "") -> None:
        self.client = client
        self.prefix = prefix  # "" for the default set, "set:<name>:" for another
        self.recent_key = f"{prefix}{RECENT_KEY}"
        self.active_key = f"{prefix}jobs:active"

    def save(self, job: Job) -> None:
        job.updated_at = time.time()
        with self.client.pipeline(transaction=True) as pipe:
            pipe.set(f"{self.prefix}job:{job.id}", json.dumps(asdict(job)), ex=JOB_TTL_S)
            if job.active:
                pipe.sadd(self.active_key, job.id)
            else:
                pipe.srem(self.active_key, job.id)
            pipe.zadd(self.recent_key, {job.id: job.created_at})
            # Job records expire; their places in the listing go with them.
            pipe.zremrangebyscore(self.recent_key, "-inf", time.time() - JOB_TTL_S)
            pipe.execute()

    def remove(self) -> None:
        ids = [i.decode() if isinstance(i, bytes) else str(i) for i in self.client.zrange(self.recent_key, 0, -1)]
        ids += [i.decode() if isinstance(i, bytes) else str(i) for i in self.client.smembers(self.active_key)]
        self.client.delete(self.recent_key, self.active_key, *{f"{self.prefix}job:{i}" for i in ids})

    def get(self, job_id: str) -> Job | None:
        raw = self.client.get(f"{self.prefix}job:{job_id}")
        return Job.from_json(raw) if isinstance(raw, bytes | str) else None

    def active(self) -> list[Job]:
        ids = [i.decode() if isinstance(i, bytes) else str(i) for i in self.client.smembers(self.active_key)]
        return [job for job in (self.get(i) for i in ids) if job is not None and job.active]

    def recent(self, limit: int) -> list[Job]:
        jobs: list[Job] = []
        gone: list[str] = []
        start = 0
        while len(jobs) < limit:
            ids = [
                i.decode() if isinstance(i, bytes) else str(i)
                for i in self.client.zrevrange(self.recent_key, start, start + limit - 1)
            ]
            if not ids:
                break
            start += len(ids)
            for job_id, raw in zip(ids, self.client.mget([f"{self.prefix}job:{i}" for i in ids]), strict=True):
                if isinstance(raw, bytes | str):
                    jobs.append(Job.from_json(raw))
                else:  # evicted before its TTL ran out (maxmemory)
                    gone.append(job_id)
        if gone:
            self.client.zrem(self.recent_key, *gone)
        return jobs[:limit]


class FileJobStore:
    def __init__(self, root: Path) -> None:
        self.root = root

    def save(self, job: Job) -> None:
        job.updated_at = time.time()
        self.root.mkdir(parents=True, exist_ok=True)
        write_atomic(self.root / f"{job.id}.json", json.dumps(asdict(job)))
        if not job.active:
            self.expire()

    def remove(self) -> None:
        for path in self.root.glob("*.json") if self.root.is_dir() else ():
            path.unlink(missing_ok=True)

    def expire(self, ttl_s: float = JOB_TTL_S) -> int:
        """Removes finished jobs older than the TTL, as Redis expires its records. Returns how many."""
        removed = 0
        cutoff = time.time() - ttl_s
        for path in self.root.glob("*.json"):
            try:
                job = Job.from_json(path.read_text())
            except (OSError, ValueError, TypeError):
                continue
            if not job.active and job.updated_at < cutoff:
                path.unlink(missing_ok=True)
                removed += 1
        return removed

    def get(self, job_id: str) -> Job | None:
        path = self.root / f"{job_id}.json"
        if not job_id.isalnum() or not path.is_file():
            return None
        return Job.from_json(path.read_text())

    def active(self) -> list[Job]:
        if not self.root.is_dir():
            return []
        jobs = [Job.from_json(p.read_text()) for p in self.root.glob("*.json")]
        return [j for j in jobs if j.active]

    def recent(self, limit: int) -> list[Job]:
        if not self.root.is_dir():
            return []
        jobs = []
        for path in self.root.glob("*.json"):
            try:
                jobs.append(Job.from_json(path.read_text()))
            except (OSError, ValueError, TypeError):  # one bad record must not hide the others
                continue
        return sorted(jobs, key=lambda j: j.created_at, reverse=True)[:limit]


class Lock(Protocol):
    def acquire(self, token: str) -> bool: ...
    def renew(self, token: str) -> bool: ...
    def release(self, token: str) -> None: ...
    def holder(self) -> str | None: ...


class RedisLock:
    """SET NX with a TTL; renewed while held; released only by its holder.

    Renewal and release compare the holder and act in one script: as two round
    trips, the key could expire between them and another replica take it, and
    the renewal would then extend the other replica's lock."""

    _RELEASE = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"
    _RENEW = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('expire', KEYS[1], ARGV[2]) end return 0"

    def __init__(self, client: redis.Redis, key: str = LOCK_KEY) -> None:
        self.client = client
        self.key = key  # one lock per candidate set

    def acquire(self, token: str) -> bool:
        return bool(self.client.set(self.key, token, nx=True, ex=LOCK_TTL_S))

    def renew(self, token: str) -> bool:
        """Whether this token still held the lock (and now holds it for another TTL)."""
        return bool(self.client.eval(self._RENEW, 1, self.key, token, LOCK_TTL_S))

    def release(self, token: str) -> None:
        self.client.eval(self._RELEASE, 1, self.key, token)

    def holder(self) -> str | None:
        raw = self.client.get(self.key)
        return raw.decode() if isinstance(raw, bytes) else None


class ProcessLock:
    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._token: str | None = None

    def acquire(self, token: str) -> bool:
        with self._guard:
            if self._token is not None:
                return False
            self._token = token
            return True

    def renew(self, token: str) -> bool:
        return self._token == token

    def release(self, token: str) -> None:
        with self._guard:
            if self._token == token:
                self._token = None

    def holder(self) -> str | None:
        return self._token


def fail_dead(jobs: JobStore, lock: Lock, grace_s: float = FINISHING_GRACE_S) -> list[str]:
    """Marks failed every active job whose token does not hold the lock (and has not for
    `grace_s`): the process running it is gone. Returns their ids.

    At a start without Redis, `grace_s=0`: there is only this process, and it just started."""
    failed = []
    holder = lock.holder()
    for job in jobs.active():
        if job.token == holder or time.time() - job.updated_at < grace_s:
            continue
        job.state, job.error = "failed", "interrupted: the process running it stopped"
        jobs.save(job)
        failed.append(job.id)
    return failed


class Renewer:
    """Holds the lock for one token: acquired, renewed in a thread every LOCK_RENEW_S, released.

    `lost` is set when a renewal finds another holder; the work checks it before it changes
    what serves. A failed renewal (Redis away) is not a loss: the TTL covers a short outage."""

    def __init__(self, lock: Lock, token: str) -> None:
        self.lock = lock
        self.token = token
        self.lost = threading.Event()
        self._stop = threading.Event()

    def acquire(self) -> bool:
        if not self.lock.acquire(self.token):
            return False
        threading.Thread(target=self._renew, name=f"renew-{self.token[:16]}", daemon=True).start()
        return True

    def _renew(self) -> None:
        while not self._stop.wait(LOCK_RENEW_S):
            try:
                if not self.lock.renew(self.token):
                    self.lost.set()
                    return
            except Exception:  # a Redis blip must not end the holder's work; the TTL covers it
                continue

    def still_held(self) -> bool:
        """Asks the lock itself, once more, before a change that only the holder may make."""
        return not self.lost.is_set() and self.lock.renew(self.token)

    def release(self) -> None:
        self._stop.set()
        with contextlib.suppress(Exception):  # Redis away: the TTL frees it
            self.lock.release(self.token)
