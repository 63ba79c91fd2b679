"""The reindex lock and job records, on a real Redis."""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import redis

from app.engine.jobs import (
    JOB_TTL_S,
    LOCK_KEY,
    LOCK_TTL_S,
    THIS_PROCESS,
    FileJobStore,
    Job,
    Owner,
    RedisJobStore,
    RedisLock,
    fail_interrupted,
)


class TakenOverAfterOneCommand(redis.Redis):
    """A client after whose next command another replica takes the lock over:
    the window a renewal in two round trips (read the holder, then extend)
    leaves open, and one script does not."""

    armed = False

    def execute_command(self, *args: Any, **options: Any) -> Any:
        result = super().execute_command(*args, **options)
        if self.armed:
            self.armed = False
            super().execute_command("SET", LOCK_KEY, "replica-b", "EX", 3)
        return result


def test_renewal_never_extends_another_replicas_lock(clean_redis: redis.Redis) -> None:
    client = TakenOverAfterOneCommand(connection_pool=clean_redis.connection_pool)
    lock = RedisLock(client)
    assert lock.acquire("replica-a")
    client.armed = True
    lock.renew("replica-a")  # replica-b takes the lock over in the middle of this
    assert clean_redis.get(LOCK_KEY) == b"replica-b"
    assert clean_redis.ttl(LOCK_KEY) <= 3  # b's own TTL: a's renewal did not extend b's lock
    assert lock.renew("replica-a") is False  # and a learns that it lost it
    assert RedisLock(clean_redis).renew("replica-b")
    assert 3 < clean_redis.ttl(LOCK_KEY) <= LOCK_TTL_S


def test_a_job_written_by_a_newer_version_still_loads(clean_redis: redis.Redis, tmp_path: Path) -> None:
    newer = {**asdict(Job.new("append")), "state": "running", "shard": 3, "priority": "high"}
    clean_redis.set(f"job:{newer['id']}", json.dumps(newer))
    clean_redis.sadd("jobs:active", newer["id"])
    store = RedisJobStore(clean_redis)
    job = store.get(newer["id"])
    assert job is not None and job.state == "running"
    assert fail_interrupted(store, RedisLock(clean_redis)) == [newer["id"]]  # startup still recovers it
    files = FileJobStore(tmp_path)
    (tmp_path / f"{newer['id']}.json").write_text(json.dumps(newer))
    assert [j.id for j in files.active()] == [newer["id"]]


def running_job(store: RedisJobStore, owner: Owner) -> Job:
    job = Job.new("append", owner=owner)
    job.state, job.stage = "running", "encode"
    store.save(job)
    return job


def test_a_restarted_replica_fails_and_frees_its_earlier_boots_job(clean_redis: redis.Redis) -> None:
    """Killed mid-build and back within the lock's TTL: the lock is still held, by a process that is gone."""
    store, lock = RedisJobStore(clean_redis), RedisLock(clean_redis)
    job = running_job(store, Owner("replica-a", "first-boot"))
    assert lock.acquire(job.token)
    assert fail_interrupted(store, lock, me=Owner("replica-a", "second-boot")) == [job.id]
    found = store.get(job.id)
    assert found is not None and found.state == "failed" and "interrupted" in (found.error or "")
    assert lock.holder() is None  # the next upload is not refused for up to 30 s
    assert store.active() == []


def test_another_replicas_live_job_is_left_alone(clean_redis: redis.Redis) -> None:
    store, lock = RedisJobStore(clean_redis), RedisLock(clean_redis)
    job = running_job(store, Owner("replica-b", "its-boot"))
    assert lock.acquire(job.token)
    assert fail_interrupted(store, lock, me=Owner("replica-a", "second-boot")) == []
    found = store.get(job.id)
    assert found is not None and found.state == "running"
    assert lock.holder() == job.token and clean_redis.ttl(LOCK_KEY) > LOCK_TTL_S - 5
    assert fail_interrupted(store, lock, me=Owner("replica-b", "its-boot")) == []  # its own process: alive


def test_an_earlier_boots_job_whose_lock_expired_or_moved_on_is_failed_without_touching_the_lock(
    clean_redis: redis.Redis,
) -> None:
    store, lock = RedisJobStore(clean_redis), RedisLock(clean_redis)
    dead = running_job(store, Owner("replica-a", "first-boot"))
    live = running_job(store, Owner("replica-b", "its-boot"))
    assert lock.acquire(live.token)  # a's lock expired and b took it
    assert fail_interrupted(store, lock, me=Owner("replica-a", "second-boot")) == [dead.id]
    assert lock.holder() == live.token
    assert [j.id for j in store.active()] == [live.id]


def test_a_job_records_its_owner_and_locks_with_it() -> None:
    job = Job.new("append")
    assert job.owner == str(THIS_PROCESS) and Owner.parse(job.owner) == THIS_PROCESS
    assert job.token == f"{job.id}@{THIS_PROCESS}" and job.id in job.token


def test_recent_jobs_come_newest_first_from_either_store(clean_redis: redis.Redis, tmp_path: Path) -> None:
    now = time.time()
    for store in (RedisJobStore(clean_redis), FileJobStore(tmp_path)):
        jobs = [Job(id=f"job{i}", mode="append", state="succeeded", created_at=now - 100 + i) for i in range(5)]
        for job in jobs[::2] + jobs[1::2]:  # saved out of order
            store.save(job)
        assert [j.id for j in store.recent(3)] == ["job4", "job3", "job2"]
        assert [j.id for j in store.recent(100)] == ["job4", "job3", "job2", "job1", "job0"]
    # A record past its TTL leaves the listing with it.
    RedisJobStore(clean_redis).save(Job(id="ancient", mode="append", state="failed", created_at=now - JOB_TTL_S - 1))
    assert "ancient" not in [j.id for j in RedisJobStore(clean_redis).recent(100)]
    clean_redis.delete("job:job3")  # evicted early
    assert [j.id for j in RedisJobStore(clean_redis).recent(3)] == ["job4", "job2", "job1"]
