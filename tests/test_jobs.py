"""The reindex lock and job records, on a real Redis."""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
import redis

from app.reindex.jobs import (
    JOB_TTL_S,
    LOCK_KEY,
    LOCK_TTL_S,
    FileJobStore,
    Job,
    RedisJobStore,
    RedisLock,
    Renewer,
    fail_dead,
)
from app.reindex.reindexer import Busy
from core.process import THIS_PROCESS, Owner
from core.store import IndexStore
from tests.helpers import AUTH, REDIS_URL, TOKEN, AppFactory, wait_for


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
    assert fail_dead(store, RedisLock(clean_redis), grace_s=0) == [newer["id"]]  # startup still recovers it
    files = FileJobStore(tmp_path)
    (tmp_path / f"{newer['id']}.json").write_text(json.dumps(newer))
    assert [j.id for j in files.active()] == [newer["id"]]


def running_job(store: RedisJobStore, owner: Owner) -> Job:
    job = Job.new("append", owner=owner)
    job.state, job.stage = "running", "encode"
    store.save(job)
    return job


def test_a_job_whose_lock_expired_is_failed(clean_redis: redis.Redis) -> None:
    """Its process died: nobody renewed the lock, and the TTL freed it."""
    store, lock = RedisJobStore(clean_redis), RedisLock(clean_redis)
    job = running_job(store, Owner("replica-a", "first-boot"))
    assert lock.acquire(job.token)
    assert fail_dead(store, lock, grace_s=0) == []  # held: alive, whoever asks
    clean_redis.delete(LOCK_KEY)  # what the TTL does once renewals stop
    assert fail_dead(store, lock, grace_s=0) == [job.id]
    found = store.get(job.id)
    assert found is not None and found.state == "failed" and "interrupted" in (found.error or "")
    assert store.active() == []


def test_a_live_job_of_another_process_on_this_host_is_left_alone(clean_redis: redis.Redis) -> None:
    """The defect: ownership told by hostname made two processes on one host read each other as dead."""
    store, lock = RedisJobStore(clean_redis), RedisLock(clean_redis)
    job = running_job(store, Owner(THIS_PROCESS.replica, "another-process"))
    assert lock.acquire(job.token)
    assert fail_dead(store, lock, grace_s=0) == []
    found = store.get(job.id)
    assert found is not None and found.state == "running"
    assert lock.holder() == job.token


def test_a_job_that_just_released_the_lock_is_given_time_to_save_its_end(clean_redis: redis.Redis) -> None:
    store, lock = RedisJobStore(clean_redis), RedisLock(clean_redis)
    finishing = running_job(store, THIS_PROCESS)  # released the lock a moment ago, saving "succeeded" next
    assert fail_dead(store, lock) == []
    assert fail_dead(store, lock, grace_s=0) == [finishing.id]


def test_the_renewer_keeps_the_lock_past_its_ttl_and_says_when_it_lost_it(
    clean_redis: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.reindex import jobs

    monkeypatch.setattr(jobs, "LOCK_RENEW_S", 0.05)
    lock = RedisLock(clean_redis)
    holding = Renewer(lock, "rollback-1")
    assert holding.acquire()
    assert not Renewer(lock, "rollback-2").acquire()
    clean_redis.expire(LOCK_KEY, 1)
    time.sleep(0.3)
    assert clean_redis.ttl(LOCK_KEY) > 1  # renewed
    assert holding.still_held()
    clean_redis.set(LOCK_KEY, "someone-else")
    assert not holding.still_held()
    holding.release()
    assert lock.holder() == "someone-else"  # released only by its holder


def test_the_file_job_store_expires_finished_jobs(tmp_path: Path) -> None:
    store = FileJobStore(tmp_path)
    old = Job(id="old", mode="append", state="succeeded")
    store.save(old)
    (tmp_path / "old.json").write_text(json.dumps({**asdict(old), "updated_at": time.time() - JOB_TTL_S - 1}))
    store.save(Job(id="running", mode="append", state="running", updated_at=0))
    store.save(Job(id="new", mode="append", state="failed"))
    assert sorted(j.id for j in store.recent(10)) == ["new", "running"]


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


def test_builds_of_several_sets_wait_for_the_process_memory_budget() -> None:
    """#49, item 6: each set's job built at once in the process that serves every set (~0.4 GB for 96k
    candidates each); uploads to several sets could be killed for memory and take every set down."""
    import threading
    import time

    from app.reindex.budget import BuildBudget

    budget = BuildBudget(max_bytes=BuildBudget.estimate(150_000))
    order: list[str] = []
    waited: list[str] = []
    first_in = threading.Event()
    release_first = threading.Event()

    def build(name: str, candidates: int, hold: threading.Event | None = None) -> None:
        with budget.held(candidates, waiting=lambda: waited.append(name)):
            order.append(f"{name} starts")
            if hold is not None:
                first_in.set()
                hold.wait(10)
            order.append(f"{name} ends")

    first = threading.Thread(target=build, args=("a", 100_000, release_first))
    first.start()
    assert first_in.wait(10)
    small = threading.Thread(target=build, args=("b", 10_000))  # fits beside it: runs at once
    small.start()
    small.join(10)
    big = threading.Thread(target=build, args=("c", 100_000))  # does not fit: waits for a
    big.start()
    time.sleep(0.2)
    assert order == ["a starts", "b starts", "b ends"] and waited == ["c"]
    release_first.set()
    first.join(10)
    big.join(10)
    assert order[-2:] == ["c starts", "c ends"] and budget.used == 0 and budget.running == 0
    with budget.held(10_000_000):  # larger than the whole budget: runs alone, never waits for ever
        assert budget.running == 1


# --- the lock, held where it matters -----------------------------------------------------------------------


@pytest.fixture
def own_artifacts(artifacts: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(artifacts, tmp_path / "artifacts"))


@pytest.mark.anyio
async def test_a_reindex_that_loses_its_lock_while_the_new_version_loads_never_swaps(
    make_client: AppFactory, own_artifacts: Path, clean_redis: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """replicas.md, Scale-out: one reindex or rollback at a time, and only the lock's holder swaps.
    The lock was checked before `load_version`, which takes seconds on a large set: a job whose lock
    another replica took meanwhile swapped anyway. It is checked after, as a rollback does."""
    from app.engine.runtime import Runtime

    real = Runtime.load_version

    def taken_over_meanwhile(self: Runtime, candidates: Any, version: str) -> Any:
        served = real(self, candidates, version)
        clean_redis.set(LOCK_KEY, "another-replica", ex=LOCK_TTL_S)  # this one's lock expired in a pause
        return served

    async with make_client(artifacts_dir=own_artifacts, admin_token=TOKEN, redis_url=REDIS_URL) as client:
        before = (await client.get("/readyz")).json()["index_version"]
        monkeypatch.setattr(Runtime, "load_version", taken_over_meanwhile)
        response = await client.post("/admin/candidates", json=[{"reply": "not served", "id": "x"}], headers=AUTH)
        job = await wait_for(client, response.json()["job_id"])
        assert job["state"] == "failed" and "lost the reindex lock" in job["error"], job
        assert (await client.get("/readyz")).json()["index_version"] == before
        assert IndexStore(own_artifacts / "indexes").current() == before
        assert clean_redis.get(LOCK_KEY) == b"another-replica"


@pytest.mark.anyio
async def test_without_redis_a_set_keeps_one_lock_however_often_it_is_found_again(
    make_client: AppFactory, own_artifacts: Path
) -> None:
    """candidates.md, Candidate sets: each set has its own lock, and one reindex or rollback runs at
    a time. Without Redis a set got a fresh lock whenever this replica found it again (the follower
    drops a set whose directory a remount hides, and adds it back): two jobs could run on one set."""
    (own_artifacts / "sets" / "kids" / "indexes").mkdir(parents=True)
    async with make_client(artifacts_dir=own_artifacts, admin_token=TOKEN) as client:
        app = client._transport.app  # type: ignore[attr-defined]
        admin, runtime = app.state.service.admin, app.state.service.runtime
        running = admin.of("kids").reindexer.claim("a-running-job")
        try:
            runtime.drop_set("kids")  # the directory was out of sight for one poll ...
            runtime.add_set("kids")  # ... and is back: another CandidateSet object
            with pytest.raises(Busy):
                admin.of("kids").reindexer.claim("a-second-job")
            assert admin.of("kids").reindexer.lock.holder() == "a-running-job"
        finally:
            running.release()
