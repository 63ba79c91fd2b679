"""Reindex jobs and the one-at-a-time lock, in Redis or, without it, on disk
and in process.

A job that was queued or running when its process died is marked failed at
the next start: in Redis once its lock has expired (no live replica is
working on it), on disk always (without Redis there is only one process).
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal, Protocol

import redis

JobState = Literal["queued", "running", "succeeded", "failed"]
JOB_TTL_S = 7 * 24 * 3600
LOCK_KEY = "reindex:lock"
LOCK_TTL_S = 30  # a crashed holder frees the lock this fast; a live one renews it


@dataclass
class Job:
    id: str
    mode: str
    state: JobState = "queued"
    stage: str = "queued"
    progress: float = 0.0  # of the current stage, 0..1
    counts: dict[str, int] = field(default_factory=dict)
    version: str | None = None  # the version it built
    previous_version: str | None = None  # what served before it
    error: str | None = None
    created_at: float = field(default_factory=time.time)
    updated_at: float = field(default_factory=time.time)

    @staticmethod
    def new(mode: str) -> Job:
        return Job(id=uuid.uuid4().hex[:16], mode=mode)

    @property
    def active(self) -> bool:
        return self.state in ("queued", "running")


class JobStore(Protocol):
    def save(self, job: Job) -> None: ...
    def get(self, job_id: str) -> Job | None: ...
    def active(self) -> list[Job]: ...


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
            pipe.execute()

    def get(self, job_id: str) -> Job | None:
        raw = self.client.get(f"job:{job_id}")
        return Job(**json.loads(raw)) if isinstance(raw, bytes | str) else None

    def active(self) -> list[Job]:
        ids = [i.decode() if isinstance(i, bytes) else str(i) for i in self.client.smembers("jobs:active")]
        return [job for job in (self.get(i) for i in ids) if job is not None and job.active]


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
        return Job(**json.loads(path.read_text()))

    def active(self) -> list[Job]:
        if not self.root.is_dir():
            return []
        jobs = [Job(**json.loads(p.read_text())) for p in self.root.glob("*.json")]
        return [j for j in jobs if j.active]


class Lock(Protocol):
    def acquire(self, token: str) -> bool: ...
    def renew(self, token: str) -> None: ...
    def release(self, token: str) -> None: ...
    def holder(self) -> str | None: ...


class RedisLock:
    """SET NX with a TTL; renewed while held; released only by its holder."""

    _RELEASE = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"

    def __init__(self, client: redis.Redis) -> None:
        self.client = client

    def acquire(self, token: str) -> bool:
        return bool(self.client.set(LOCK_KEY, token, nx=True, ex=LOCK_TTL_S))

    def renew(self, token: str) -> None:
        if self.holder() == token:
            self.client.expire(LOCK_KEY, LOCK_TTL_S)

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

    def renew(self, token: str) -> None:
        pass

    def release(self, token: str) -> None:
        with self._guard:
            if self._token == token:
                self._token = None

    def holder(self) -> str | None:
        return self._token


def fail_interrupted(jobs: JobStore, lock: Lock) -> list[str]:
    """Marks failed every active job that no live process holds the lock for."""
    failed = []
    holder = lock.holder()
    for job in jobs.active():
        if job.id != holder:
            job.state, job.error = "failed", "interrupted: the process running it stopped"
            jobs.save(job)
            failed.append(job.id)
    return failed
