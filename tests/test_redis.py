"""Sessions and the embedding cache on the real Redis at 127.0.0.1:6379, and
the service with Redis down."""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import TimeoutError as RedisTimeoutError

from app.engine import kv as kv_module
from app.engine.kv import UNKNOWN, open_store
from tests.helpers import REDIS_URL, AppFactory, closed_port

pytestmark = pytest.mark.anyio


async def test_session_turns_live_in_redis_with_a_ttl(make_client: AppFactory, clean_redis: redis.Redis) -> None:
    async with make_client(redis_url=REDIS_URL, session_ttl_s=120) as client:
        ready = (await client.get("/readyz")).json()
        assert ready["redis"] == "up"
        first = (await client.post("/reply", json={"session_id": "s-1", "message": "good night"})).json()

    stored = [json.loads(x) for x in clean_redis.lrange("session:s-1", 0, -1)]
    assert stored == [{"role": "user", "text": "good night"}, {"role": "bot", "text": first["reply"]}]
    assert 0 < clean_redis.ttl("session:s-1") <= 120


async def test_a_second_replica_continues_the_session_without_repeating(
    make_client: AppFactory, clean_redis: redis.Redis
) -> None:
    async with make_client(redis_url=REDIS_URL) as replica_a:
        first = (await replica_a.post("/reply", json={"session_id": "s-2", "message": "my cat is sick"})).json()
    async with make_client(redis_url=REDIS_URL) as replica_b:
        second = (await replica_b.post("/reply", json={"session_id": "s-2", "message": "my cat is sick"})).json()
    assert second["reply"] != first["reply"]
    assert clean_redis.llen("session:s-2") == 4


async def test_an_append_after_another_replicas_write_is_refused(clean_redis: redis.Redis) -> None:
    """Two replicas read one session's history, both answer; only the first to write stores its turn."""
    replica_a, replica_b = (open_store(REDIS_URL, 1000, 2.0, 10) for _ in range(2))
    try:
        _, read_by_a = await replica_a.list_read("session:race")
        _, read_by_b = await replica_b.list_read("session:race")
        assert await replica_b.list_append_if("session:race", read_by_b, [b"b"], 10, 60)
        assert not await replica_a.list_append_if("session:race", read_by_a, [b"a"], 10, 60)
        items, writes = await replica_a.list_read("session:race")
        assert (items, writes) == ([b"b"], 1)
        assert await replica_a.list_append_if("session:race", writes, [b"a"], 10, 60)  # read again: stored after
        assert clean_redis.lrange("session:race", 0, -1) == [b"b", b"a"]
        assert 0 < clean_redis.ttl("writes:session:race") <= 60
    finally:
        await replica_a.close()
        await replica_b.close()


async def test_a_cache_redis_that_is_gone_bypasses_the_cache_not_the_sessions(
    make_client: AppFactory, clean_redis: redis.Redis
) -> None:
    async with make_client(redis_url=REDIS_URL, cache_redis_url=closed_port_url()) as client:
        assert (
            await client.post("/reply", json={"session_id": "s-cache", "message": "hello there"})
        ).status_code == 200
        assert (
            await client.post("/reply", json={"session_id": "s-cache", "message": "how are you?"})
        ).status_code == 200
        assert (await client.get("/readyz")).json()["redis"] == "up"
    assert clean_redis.llen("session:s-cache") == 4


def closed_port_url() -> str:
    return f"redis://127.0.0.1:{closed_port()}/0"


async def test_session_history_is_capped(make_client: AppFactory, clean_redis: redis.Redis) -> None:
    async with make_client(redis_url=REDIS_URL, session_max_turns=4) as client:
        for message in ["hi! how are you?", "where are you from?", "do you like dogs?"]:
            assert (await client.post("/reply", json={"session_id": "s-3", "message": message})).status_code == 200
    stored = [json.loads(x)["text"] for x in clean_redis.lrange("session:s-3", 0, -1)]
    assert len(stored) == 4
    assert stored[0] == "where are you from?"


async def written(client: redis.Redis, pattern: str) -> list[bytes]:
    """The keys matching `pattern` once a background write has put any there (or none after 5 s)."""
    for _ in range(100):
        if keys := client.keys(pattern):
            return list(keys)
        await asyncio.sleep(0.05)
    return []


async def test_embeddings_are_cached_in_redis_under_the_model_checksum(
    make_client: AppFactory, clean_redis: redis.Redis
) -> None:
    async with make_client(redis_url=REDIS_URL, cache_local_entries=0) as client:
        checksum = (await client.get("/info")).json()["model"]["checksum"]
        await client.post("/similar", json={"text": "Where  are you FROM?"})
        await asyncio.sleep(0.2)
        assert clean_redis.keys("emb:*") == []  # asked once: for all anyone knows, a one-off
        await client.post("/similar", json={"text": "Where  are you FROM?"})
        keys = [k.decode() for k in await written(clean_redis, "emb:*")]  # the write runs after the answer
        # Compared with stored queries, so encoded as they were: as a stored turn (the reply side).
        assert len(keys) == 1 and keys[0].startswith(f"emb:{checksum[:16]}:reply:")
        assert len(clean_redis.get(keys[0]) or b"") == 4 * 32  # tiny model: 32 float32 dims

        # Normalised text: a differently spaced and cased query hits the same key.
        again = (await client.post("/similar", json={"text": "where are you from?"})).json()
        assert len(clean_redis.keys("emb:*")) == 1
        assert again["matches"][0]["query"] == "where are you from?"


async def test_redis_down_still_answers(make_client: AppFactory) -> None:
    async with make_client(redis_url=f"redis://127.0.0.1:{closed_port()}/0", redis_timeout_ms=50) as client:
        response = await client.post("/reply", json={"context": ["hi! how are you?"]})
        assert response.status_code == 200, response.text
        assert response.json()["reply"] == "i'm good thanks, how about you?"
        session = await client.post("/reply", json={"session_id": "s-down", "message": "good night"})
        assert session.status_code == 200
        ready = await client.get("/readyz")
        assert ready.status_code == 200
        assert ready.json() == {**ready.json(), "ready": True, "redis": "down"}


class PrivateRedis:
    """A redis-server of this test's own, on a free port, that the test can kill and restart."""

    def __init__(self) -> None:
        self.port = closed_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        command = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL)
        client = redis.Redis(port=self.port, socket_connect_timeout=0.2)
        for _ in range(100):
            try:
                client.ping()
                return
            except redis.ConnectionError:
                time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def kill(self) -> None:
        assert self.process is not None
        self.process.kill()  # SIGKILL: no goodbye to the connected clients
        self.process.wait()


@pytest.fixture
def private_redis() -> Iterator[PrivateRedis]:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (apt-get install redis-server)")
    server = PrivateRedis()
    server.start()
    yield server
    if server.process is not None and server.process.poll() is None:
        server.kill()


async def test_after_a_redis_restart_the_first_session_turn_is_kept(
    make_client: AppFactory, private_redis: PrivateRedis
) -> None:
    """Pooled connections from before the restart are dead; the first call on each
    must reconnect, not trip the bypass and drop the turn it was writing."""
    async with make_client(redis_url=private_redis.url, redis_timeout_ms=200) as client:
        for i in range(3):  # several pooled connections, all soon stale
            await client.post("/reply", json={"session_id": f"warm-{i}", "message": "hello"})
        private_redis.kill()
        private_redis.start()
        reply = await client.post("/reply", json={"session_id": "after", "message": "good night"})
        assert reply.status_code == 200
        assert (await client.get("/readyz")).json()["redis"] == "up"
    stored = redis.Redis(port=private_redis.port).lrange("session:after", 0, -1)
    assert [json.loads(x)["role"] for x in stored] == ["user", "bot"]


class Reads:
    """Every reply the Redis client waits for, counted: how many, and how many timed out."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = self.timeouts = 0
        real = AbstractConnection.read_response

        async def counted(connection: AbstractConnection, *args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            try:
                return await real(connection, *args, **kwargs)
            except (RedisTimeoutError, TimeoutError):
                self.timeouts += 1
                raise

        monkeypatch.setattr(AbstractConnection, "read_response", counted)


@pytest.mark.parametrize("health_check", [False, True], ids=["command", "health-check ping first"])
async def test_a_frozen_redis_costs_one_timeout_then_is_bypassed(
    private_redis: PrivateRedis, monkeypatch: pytest.MonkeyPatch, health_check: bool
) -> None:
    """SIGSTOP: connections are accepted and then never answered. A timeout must
    trip the bypass at once; only a broken connection is worth a retry."""
    if health_check:  # an idle pooled connection is pinged before its next command
        monkeypatch.setattr(kv_module, "HEALTH_CHECK_INTERVAL_S", 0.05)
    reads = Reads(monkeypatch)
    store = open_store(private_redis.url, timeout_ms=300, retry_after_s=30, memory_entries=0)
    assert private_redis.process is not None
    try:
        await store.set_many({"k": b"v"}, 60)
        assert await store.get_many(["k"]) == [b"v"]
        await asyncio.sleep(0.1)
        private_redis.process.send_signal(signal.SIGSTOP)
        try:
            assert await store.get_many(["k"]) == [None]
            assert store.status == "down" and store.errors == 1
            # One read timed out and nothing was retried: neither the command nor, with the
            # health check, the command after its ping. A retry would pay the 0.3 s again.
            assert reads.timeouts == 1, f"the timeout was paid {reads.timeouts} times"
            asked = reads.calls
            assert await store.list_read("session:x") == ([], UNKNOWN)
            assert reads.calls == asked and store.skipped_calls == 1  # bypassed: Redis not asked at all
        finally:
            private_redis.process.send_signal(signal.SIGCONT)
    finally:
        await store.close()


def test_a_candidate_store_write_leaves_no_staging_hash_behind(clean_redis: redis.Redis) -> None:
    """#49, item 8: staging hashes had no expiry and no cleanup, so a failed write or a dead process left
    tens of MB for good in a Redis that never evicts."""
    from core.records import Candidate
    from index.candidates import CHUNK, STAGING_TTL_S, RedisCandidateStore

    store = RedisCandidateStore(clean_redis, "set:t:candidates")
    seen_ttls: list[int] = []

    def records(fail: bool) -> Iterator[Candidate]:
        for i in range(CHUNK * 2 + 5):
            if i == CHUNK + 1:  # the first chunk is staged: its key must already expire
                staging = [k for k in clean_redis.keys("set:t:candidates:staging:*")]
                seen_ttls.extend(int(clean_redis.ttl(k)) for k in staging)
                if fail:
                    raise RuntimeError("the upload's source broke mid-write")
            yield Candidate(reply=f"reply {i}")

    store.replace(records(fail=False), "v20990101T000000000000-aaaaaa")
    assert store.count() == CHUNK * 2 + 5 and clean_redis.ttl("set:t:candidates") == -1  # the live hash persists
    assert seen_ttls and all(0 < t <= STAGING_TTL_S for t in seen_ttls)
    with pytest.raises(RuntimeError):
        store.replace(records(fail=True), "v20990101T000000000000-bbbbbb")
    assert clean_redis.keys("set:t:candidates:staging:*") == []  # a failed write cleans up after itself
    assert store.count() == CHUNK * 2 + 5  # and the live records are as they were


async def test_a_readyz_flood_pings_redis_once_at_a_time_and_finds_it_up(
    make_client: AppFactory, clean_redis: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """400 sockets on /readyz for 20 s read a healthy Redis as down 49,086 times: every call pinged
    it, outside the in-flight limit, until the pool ran out. Its status is now cached: one ping at a
    time, at most one per `readyz_redis_cache_s`, its answer shared by every call meanwhile."""
    pinging = most = pings = 0
    real = kv_module.RedisKV.ping

    async def slow_ping(self: kv_module.RedisKV) -> bool:
        nonlocal pinging, most, pings
        pings += 1
        pinging += 1
        most = max(most, pinging)
        try:
            await asyncio.sleep(0.05)  # a ping the others arrive during
            return await real(self)
        finally:
            pinging -= 1

    monkeypatch.setattr(kv_module.RedisKV, "ping", slow_ping)
    async with make_client(redis_url=REDIS_URL, readyz_redis_cache_s=30.0) as client:
        answers = await asyncio.gather(*(client.get("/readyz") for _ in range(200)))
        session = await client.post("/reply", json={"session_id": "s-flood", "message": "good night"})
    assert [a.json()["redis"] for a in answers] == ["up"] * 200
    assert most == 1 and pings == 1, f"{pings} pings, {most} at once"
    assert session.status_code == 200 and clean_redis.llen("session:s-flood") == 2


async def test_a_busy_pool_is_waited_for_not_taken_for_a_dead_redis(
    make_client: AppFactory, clean_redis: redis.Redis
) -> None:
    """With every pooled connection in use, the client raised "Too many connections"; the guard took
    that for a dead Redis, bypassed it for 2 s, and session turns were answered 200 and not stored.
    A busy pool is waited for (within `redis_pool_wait_ms`), and Redis stays up."""
    async with make_client(redis_url=REDIS_URL, redis_pool_wait_ms=3000) as client:
        runtime = client._transport.app.state.service.runtime  # type: ignore[attr-defined]
        redis_client = runtime.kv.inner.client
        size = redis_client.connection_pool.max_connections
        # Every connection of the pool held by a blocking pop that returns in 0.4 s.
        held = [asyncio.create_task(redis_client.blpop([f"nothing-{i}"], timeout=0.4)) for i in range(size)]
        await asyncio.sleep(0.1)
        turn = await client.post("/reply", json={"session_id": "s-busy", "message": "good night"})
        await asyncio.gather(*held)
        ready = (await client.get("/readyz")).json()
        errors = runtime.kv.errors
    assert turn.status_code == 200, turn.text
    assert clean_redis.llen("session:s-busy") == 2  # the turn and its reply, stored
    assert ready["redis"] == "up" and errors == 0


async def test_a_session_turn_no_connection_came_free_for_is_429_and_redis_stays_up(
    make_client: AppFactory, clean_redis: redis.Redis
) -> None:
    """Past the pool's wait the turn is refused (429, retry), not answered and silently dropped, and
    Redis is not bypassed: the next turn, once a connection is free, is stored."""
    async with make_client(redis_url=REDIS_URL, redis_max_connections=2, redis_pool_wait_ms=100) as client:
        runtime = client._transport.app.state.service.runtime  # type: ignore[attr-defined]
        redis_client = runtime.kv.inner.client
        held = [asyncio.create_task(redis_client.blpop([f"nothing-{i}"], timeout=0.5)) for i in range(2)]
        await asyncio.sleep(0.1)
        refused = await client.post("/reply", json={"session_id": "s-full", "message": "good night"})
        await asyncio.gather(*held)
        stored_then = clean_redis.llen("session:s-full")
        later = await client.post("/reply", json={"session_id": "s-full", "message": "good night"})
        status, errors, busy = runtime.kv.status, runtime.kv.errors, runtime.kv.busy
    assert refused.status_code == 429 and refused.headers["retry-after"] == "1", refused.text
    assert refused.json()["error"]["kind"] == "overloaded" and stored_then == 0
    assert later.status_code == 200 and clean_redis.llen("session:s-full") == 2
    assert status == "up" and errors == 0 and busy == 1, refused.text
