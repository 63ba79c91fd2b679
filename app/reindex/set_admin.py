"""Wires the admin side of each candidate set: its candidate store, jobs, lock and
reindexer, on Redis when configured, else on the artifact volume and in process.

The default set keeps the keys and files it always had; another set's live
under `set:<name>:` in Redis and `artifacts/sets/<name>/` on the volume.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import redis

from app.config import Settings
from app.engine.replicas import Publisher, replica_id
from app.engine.runtime import Runtime
from app.engine.sets import (
    DEFAULT_SET,
    CandidateSet,
    NoSuchSet,
    check_set_name,
    creating,
    holds_a_version,
    move_set_dir_away,
    names_on_volume,
    on_volume,
    remove_moved,
    set_dir,
    stored_candidates,
)
from app.engine.stats import Buckets
from app.reindex.budget import BuildBudget
from app.reindex.jobs import (
    FINISHING_GRACE_S,
    LOCK_KEY,
    FileJobStore,
    Job,
    JobStore,
    Lock,
    ProcessLock,
    RedisJobStore,
    RedisLock,
    fail_dead,
)
from app.reindex.reindexer import REINDEX_SECONDS, Reindexer
from core.records import Candidate
from index.candidates import REDIS_KEY, CandidateStore, FileCandidateStore, RedisCandidateStore

log = logging.getLogger(__name__)

# Admin calls move whole candidate sets; they get longer than the serving path's timeout.
ADMIN_REDIS_TIMEOUT_S = 10


class SetLimit(Exception):
    """A new set, or more candidates, would take the service past its configured limits."""

    def __init__(self, message: str, field: str, too_large: bool) -> None:
        super().__init__(message)
        self.field = field
        self.too_large = too_large  # 413 (too many candidates) rather than 409 (too many sets)


@dataclass
class SetAdmin:
    """One set's candidate store, jobs and reindexer."""

    reindexer: Reindexer
    jobs: JobStore
    candidates: CandidateStore

    @property
    def candidate_set(self) -> CandidateSet:
        return self.reindexer.candidate_set

    def sweep(self) -> None:
        """Marks failed the active jobs whose process is gone, before someone reads them as running."""
        try:
            for job_id in fail_dead(self.jobs, self.reindexer.lock):
                log.warning("reindex job %s was interrupted (its process is gone); marked failed", job_id)
        except Exception as error:  # a bad job record or a Redis blip must not fail the read
            log.warning("could not check for interrupted jobs: %s", error)


@dataclass
class Admin:
    settings: Settings
    runtime: Runtime
    client: redis.Redis | None
    origin: str  # this replica's id on the update channel
    sets: dict[str, SetAdmin] = field(default_factory=dict)
    # Every set's jobs, for /metrics: "succeeded"/"failed" -> count, and seconds from submit to done.
    outcomes: dict[str, int] = field(default_factory=dict)
    durations: Buckets = field(default_factory=lambda: Buckets(REINDEX_SECONDS))
    # Every set's index builds share it: a process-wide memory bound (`budget.py`).
    builds: BuildBudget = field(default_factory=lambda: BuildBudget(1 << 30))
    # Without Redis, each set's lock, by name, for as long as the process lives: a set is wired again
    # whenever this replica finds it again (`of`), and a fresh lock then would let a second job run
    # beside the one the old lock still holds.
    locks: dict[str, ProcessLock] = field(default_factory=dict, repr=False)
    _guard: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def default(self) -> SetAdmin:
        return self.of(DEFAULT_SET)

    def sweep(self) -> None:
        """Every set's sweep: before a job of any set is read."""
        for name in list(self.runtime.sets):
            self.of(name).sweep()

    def of(self, name: str) -> SetAdmin:
        """The admin side of set `name`. NoSuchSet unless this replica has the set."""
        check_set_name(name)
        with self._guard:
            if name not in self.runtime.sets:
                raise NoSuchSet(name)
            if name not in self.sets or self.sets[name].candidate_set is not self.runtime.add_set(name):
                self.sets[name] = self._wire(self.runtime.add_set(name))
            return self.sets[name]

    def admit(
        self,
        name: str,
        mode: str,
        records: list[Candidate],
        report: dict[str, Any],
        encoder: str | None = None,
        lines: list[int] | None = None,
    ) -> tuple[SetAdmin, Job]:
        """Counts the sets and the candidates, and submits the upload's job, as one step under the lock
        on the shared volume that every replica takes for it (`creating`). A job that runs counts as
        what it will hold: a set whose first job runs takes a slot, and its candidates count, so uploads
        sent together (here or to other replicas) cannot all pass the limits. A set whose first job
        failed holds nothing and takes no slot, until its next upload is counted as a new set's.
        SetLimit past a limit, NoSuchSet for a delete from no set, Busy while the set's job runs."""
        check_set_name(name)
        artifacts = self.settings.artifacts_dir
        with creating(artifacts):
            exists = name in self.runtime.sets or on_volume(artifacts, name)
            if not exists and mode == "delete":
                raise NoSuchSet(name)
            reserved = 0
            if mode != "delete":
                others, held = self._usage(besides=name)
                if not (name == DEFAULT_SET or holds_a_version(artifacts, name) or self._running(name)):
                    self._check_room_for_a_set(name, others)
                # At most what is stored plus what is uploaded (records, as the job builds on the version
                # the pointer names); a replace holds what is uploaded.
                reserved = (stored_candidates(artifacts, name) if mode == "append" else 0) + len(records)
                self._check_total(name, reserved, held)
            if not exists:
                set_dir(artifacts, name).joinpath("indexes").mkdir(parents=True, exist_ok=True)
            self.runtime.add_set_on_volume(name)
            target = self.of(name)
            # Saved, with what it reserves, before the volume's lock is let go: the next count sees it.
            return target, target.reindexer.submit(mode, records, report, encoder, reserved=reserved, lines=lines)

    def find_job(self, job_id: str) -> Job | None:
        """A job of any set, by id (ids are unique across sets)."""
        for name in list(self.runtime.sets):
            found = self.of(name).jobs.get(job_id)
            if found is not None:
                return found
        return None

    def _usage(self, besides: str) -> tuple[int, int]:
        """(the sets that take a slot, the candidates they hold or will hold) over every set but `besides`
        on the shared volume, those no replica here has found yet included. A set takes a slot while
        it holds a version or a job of it runs (the default set always does); it holds what its
        pointer's version was built from, or what a running job reserved, whichever is more."""
        artifacts = self.settings.artifacts_dir
        sets = candidates = 0
        for name in {DEFAULT_SET, *(names_on_volume(artifacts) or ()), *self.runtime.sets} - {besides}:
            running = self._running(name)
            if name == DEFAULT_SET or running or holds_a_version(artifacts, name):
                sets += 1
            candidates += max([stored_candidates(artifacts, name), *(j.counts.get("reserved", 0) for j in running)])
        return sets, candidates

    def _running(self, name: str) -> list[Job]:
        """Set `name`'s jobs that run: active, and their token holds the set's lock (or held it a
        moment ago: a job saves its end after it lets the lock go)."""
        wired = self.sets.get(name)
        jobs, lock = (wired.jobs, wired.reindexer.lock) if wired is not None else self._jobs_and_lock(name)
        try:
            holder, active = lock.holder(), jobs.active()
        except Exception as error:  # a bad job record of one set must not refuse every upload
            log.warning("set %s: could not read its jobs to count them (%s); counted as none running", name, error)
            return []
        return [j for j in active if j.token == holder or time.time() - j.updated_at < FINISHING_GRACE_S]

    def _check_total(self, name: str, after: int, others: int) -> None:
        limit = self.settings.max_total_candidates
        if others + after > limit:
            raise SetLimit(
                f"set {name!r} would hold {after:,} candidates and the other sets hold {others:,} (or will, "
                f"once their running jobs end): over the service's limit of {limit:,} "
                "(CHITCHAT_MAX_TOTAL_CANDIDATES)",
                "records",
                too_large=True,
            )

    def delete(self, name: str) -> None:
        """Removes a named set: its candidates, jobs' lock and index versions, on every replica.
        Busy while one of its jobs runs; the default set is never deleted."""
        if name == DEFAULT_SET:
            raise ValueError("the default set cannot be deleted; replace its candidates instead")
        admin = self.of(name)
        holding = admin.reindexer.claim(f"delete-{name}@{self.origin}")
        try:
            # Its records and jobs first, while the set still exists: a Redis error here is a 503 and the
            # retry finds the set (the directory first left a 404 on every retry, and records that a new
            # set of the name then built on). Meanwhile it keeps serving; no job can run (the lock).
            admin.candidates.remove()
            admin.jobs.remove()
            # Then the directory: once it is gone no follower (here or elsewhere) can add the set back,
            # and the other replicas drop it at their next look. Under the lock the follower adds sets
            # under, so its listing from before cannot add it back here. Requests in flight keep their
            # snapshot.
            with self._guard, self.runtime.sets_lock:  # `of`'s order: the guard, then the runtime's lock
                gone = move_set_dir_away(self.settings.artifacts_dir, name)
                self.runtime.drop_set(name)
                self.sets.pop(name, None)
            remove_moved(gone)
        finally:
            holding.release()

    def close(self) -> None:
        if self.client is not None:
            self.client.close()

    def _check_room_for_a_set(self, name: str, held: int) -> None:
        if held >= self.settings.max_sets:
            raise SetLimit(
                f"cannot create set {name!r}: the service holds {held} sets (those whose first job runs "
                "included), its limit (CHITCHAT_MAX_SETS); delete one first",
                "set",
                too_large=False,
            )

    def _jobs_and_lock(self, name: str) -> tuple[JobStore, Lock]:
        if self.client is not None:
            prefix = "" if name == DEFAULT_SET else f"set:{name}:"
            return RedisJobStore(self.client, prefix), RedisLock(self.client, f"{prefix}{LOCK_KEY}")
        root = self.settings.artifacts_dir if name == DEFAULT_SET else set_dir(self.settings.artifacts_dir, name)
        return FileJobStore(root / "jobs"), self.locks.setdefault(name, ProcessLock())

    def _wire(self, candidate_set: CandidateSet) -> SetAdmin:
        name = candidate_set.name
        candidates: CandidateStore
        jobs, lock = self._jobs_and_lock(name)
        if self.client is not None:
            prefix = "" if name == DEFAULT_SET else f"set:{name}:"
            candidates = RedisCandidateStore(self.client, f"{prefix}{REDIS_KEY}")
        else:
            root = self.settings.artifacts_dir if name == DEFAULT_SET else set_dir(self.settings.artifacts_dir, name)
            candidates = FileCandidateStore(root / "candidates.jsonl")
        publish = Publisher(self.client, self.origin, name)
        reindexer = Reindexer(
            self.runtime, candidate_set, candidates, jobs, lock, publish, self.outcomes, self.durations, self.builds
        )
        admin = SetAdmin(reindexer, jobs, candidates)
        self._sweep_at_start(admin)
        return admin

    def _sweep_at_start(self, admin: SetAdmin) -> None:
        try:
            # Without Redis this is the only process: a job active before it started is dead. With
            # it, a job is alive while its token holds the lock, whichever replica or host runs it.
            grace = 0 if self.client is None else FINISHING_GRACE_S
            for job_id in fail_dead(admin.jobs, admin.reindexer.lock, grace_s=grace):
                log.warning("reindex job %s was interrupted (its process is gone); marked failed", job_id)
        except Exception as error:  # a bad job record must not stop the replica from starting
            log.warning("could not check for interrupted jobs: %s", error)
        # Builds whose process is gone; a build another replica is writing is left alone.
        for leftover in admin.candidate_set.store.remove_staging():
            log.warning("removed %s: an index build whose process is gone", leftover)


def build_admin(settings: Settings, runtime: Runtime) -> Admin:
    client: redis.Redis | None = None
    if settings.redis_url:
        client = redis.Redis.from_url(
            settings.redis_url, socket_timeout=ADMIN_REDIS_TIMEOUT_S, socket_connect_timeout=2
        )
    admin = Admin(settings, runtime, client, replica_id(), builds=BuildBudget(settings.reindex_memory_mb << 20))
    for name in list(runtime.sets):
        admin.of(name)
    return admin
