"""Reindex jobs and the one-at-a-time lock, in Redis or, without it, on disk
and in process.

A job that was queued or running when its process died is marked failed at
the next start: in Redis once no live process holds its lock, on disk always
(without Redis there is only one process). The lock token names the job's
owner, its replica and that replica's boot, so a replica restarted before the
lock's TTL ran out still recognises its own earlier boot's job as dead, while
another replica's live job is left alone.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import redis

JobState = Literal["queued", "running", "succeeded", "failed"]
JOB_TTL_S = 7 * 24 * 3600
LOCK_KEY = "reindex:lock"
LOCK_TTL_S = 30  # a crashed holder frees the lock this fast; a live one renews it
RECENT_KEY = "jobs:recent"  # every job id, scored by creation time: the listing's order


@dataclass(frozen=True)
class Owner:
    """Who runs a job. `replica` outlives a restart (a container keeps its
    hostname when it restarts), `boot` does not: a job of this replica from
    another boot was running in a process that is gone. So replicas sharing
    one Redis need distinct hostnames, as separate containers have."""

    replica: str
    boot: str

    def __str__(self) -> str:
        return f"{self.replica}/{self.boot}"

    @staticmethod
    def parse(text: str) -> Owner | None:
        replica, _, boot = text.rpartition("/")
        return Owner(replica, boot) if replica and boot else None


THIS_PROCESS = Owner(socket.gethostname(), uuid.uuid4().hex[:12])


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


class RedisJobStore:
    def __init__(self, client: redis.Redis) -> None:
        self.client = client

    def save(self, job: Job) -> None:
        job.updated_at = time.time()
        with self.client.pipeline(transaction=True) as pipe:
            pipe.set(f"job:{job.id}", json.dumps(asdict(job)), ex=JOB_TTL_S)
            if job.active:
                pipe.sadd("jobs:active", job.id)
            else:
                pipe.srem("jobs:active", job.id)
            pipe.zadd(RECENT_KEY, {job.id: job.created_at})
            # Job records expire; their places in the listing go with them.
            pipe.zremrangebyscore(RECENT_KEY, "-inf", time.time() - JOB_TTL_S)
            pipe.execute()

    def get(self, job_id: str) -> Job | None:
        raw = self.client.get(f"job:{job_id}")
        return Job.from_json(raw) if isinstance(raw, bytes | str) else None

    def active(self) -> list[Job]:
        ids = [i.decode() if isinstance(i, bytes) else str(i) for i in self.client.smembers("jobs:active")]
        return [job for job in (self.get(i) for i in ids) if job is not None and job.active]

    def recent(self, limit: int) -> list[Job]:
        jobs: list[Job] = []
        gone: list[str] = []
        start = 0
        while len(jobs) < limit:
            ids = [
                i.decode() if isinstance(i, bytes) else str(i)
                for i in self.client.zrevrange(RECENT_KEY, start, start + limit - 1)
            ]
            if not ids:
                break
            start += len(ids)
            for job_id, raw in zip(ids, self.client.mget([f"job:{i}" for i in ids]), strict=True):
                if isinstance(raw, bytes | str):
                    jobs.append(Job.from_json(raw))
                else:  # evicted before its TTL ran out (maxmemory)
                    gone.append(job_id)
        if gone:
            self.client.zrem(RECENT_KEY, *gone)
        return jobs[:limit]


class FileJobStore:
    def __init__(self, root: Path) -> None:
        self.root = root

    def save(self, job: Job) -> None:
        job.updated_at = time.time()
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.root / f".{job.id}.tmp"
        tmp.write_text(json.dumps(asdict(job)))
        os.replace(tmp, self.root / f"{job.id}.json")

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

    def __init__(self, client: redis.Redis) -> None:
        self.client = client

    def acquire(self, token: str) -> bool:
        return bool(self.client.set(LOCK_KEY, token, nx=True, ex=LOCK_TTL_S))

    def renew(self, token: str) -> bool:
        """Whether this token still held the lock (and now holds it for another TTL)."""
        return bool(self.client.eval(self._RENEW, 1, LOCK_KEY, token, LOCK_TTL_S))

    def release(self, token: str) -> None:
        self.client.eval(self._RELEASE, 1, LOCK_KEY, token)

    def holder(self) -> str | None:
        raw = self.client.get(LOCK_KEY)
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


def fail_interrupted(jobs: JobStore, lock: Lock, me: Owner = THIS_PROCESS) -> list[str]:
    """At startup: marks failed every active job that no live process runs, and
    frees the lock if an earlier boot of this replica still holds it."""
    failed = []
    holder = lock.holder()
    for job in jobs.active():
        if job.token == holder:
            owner = Owner.parse(job.owner)
            if owner is None or owner.replica != me.replica or owner.boot == me.boot:
                continue  # another replica's (or this process's own): alive as far as anyone here knows
            # This replica restarted within the lock's TTL: the boot that held it is gone.
            lock.release(job.token)
        job.state, job.error = "failed", "interrupted: the process running it stopped"
        jobs.save(job)
        failed.append(job.id)
    return failed
