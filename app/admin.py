"""Wires the admin side: candidate store, jobs, lock and reindexer, on Redis
when configured, else on the artifact volume and in process."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import redis

from app.config import Settings
from app.engine.jobs import (
    FINISHING_GRACE_S,
    FileJobStore,
    JobStore,
    Lock,
    ProcessLock,
    RedisJobStore,
    RedisLock,
    fail_dead,
)
from app.engine.reindex import Reindexer
from app.engine.replicas import Publisher, replica_id
from app.engine.runtime import Runtime
from index.candidates import CandidateStore, FileCandidateStore, RedisCandidateStore

log = logging.getLogger(__name__)

# Admin calls move whole candidate sets; they get longer than the serving path's timeout.
ADMIN_REDIS_TIMEOUT_S = 10


@dataclass
class Admin:
    reindexer: Reindexer
    jobs: JobStore
    candidates: CandidateStore
    client: redis.Redis | None
    origin: str  # this replica's id on the update channel

    def sweep(self) -> None:
        """Marks failed the active jobs whose process is gone, before someone reads them as running."""
        try:
            for job_id in fail_dead(self.jobs, self.reindexer.lock):
                log.warning("reindex job %s was interrupted (its process is gone); marked failed", job_id)
        except Exception as error:  # a bad job record or a Redis blip must not fail the read
            log.warning("could not check for interrupted jobs: %s", error)

    def close(self) -> None:
        if self.client is not None:
            self.client.close()


def build_admin(settings: Settings, runtime: Runtime) -> Admin:
    client: redis.Redis | None = None
    candidates: CandidateStore
    jobs: JobStore
    lock: Lock
    if settings.redis_url:
        client = redis.Redis.from_url(
            settings.redis_url, socket_timeout=ADMIN_REDIS_TIMEOUT_S, socket_connect_timeout=2
        )
        candidates, jobs, lock = RedisCandidateStore(client), RedisJobStore(client), RedisLock(client)
    else:
        candidates = FileCandidateStore(settings.artifacts_dir / "candidates.jsonl")
        jobs, lock = FileJobStore(settings.artifacts_dir / "jobs"), ProcessLock()
    origin = replica_id()
    reindexer = Reindexer(runtime, candidates, jobs, lock, Publisher(client, origin))
    admin = Admin(reindexer, jobs, candidates, client, origin)
    try:
        # Without Redis this is the only process, just started: every active job is dead. With
        # it, a job is alive while its token holds the lock, whichever replica or host runs it.
        for job_id in fail_dead(jobs, lock, grace_s=0 if client is None else FINISHING_GRACE_S):
            log.warning("reindex job %s was interrupted (its process is gone); marked failed", job_id)
    except Exception as error:  # a bad job record must not stop the replica from starting
        log.warning("could not check for interrupted jobs: %s", error)
    # Builds whose process is gone; a build another replica is writing is left alone.
    for leftover in runtime.store.remove_staging():
        log.warning("removed %s: an index build whose process is gone", leftover)
    return admin
