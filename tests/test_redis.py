"""Sessions and the embedding cache on the real Redis at 127.0.0.1:6379, and
the service with Redis down."""

from __future__ import annotations

import json

import pytest
import redis

from tests.conftest import REDIS_URL, AppFactory, closed_port

pytestmark = pytest.mark.anyio


@pytest.fixture
def clean_redis(redis_client: redis.Redis) -> redis.Redis:
    redis_client.flushdb()
    return redis_client


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


async def test_session_history_is_capped(make_client: AppFactory, clean_redis: redis.Redis) -> None:
    async with make_client(redis_url=REDIS_URL, session_max_turns=4) as client:
        for message in ["hi! how are you?", "where are you from?", "do you like dogs?"]:
            assert (await client.post("/reply", json={"session_id": "s-3", "message": message})).status_code == 200
    stored = [json.loads(x)["text"] for x in clean_redis.lrange("session:s-3", 0, -1)]
    assert len(stored) == 4
    assert stored[0] == "where are you from?"


async def test_embeddings_are_cached_in_redis_under_the_model_checksum(
    make_client: AppFactory, clean_redis: redis.Redis
) -> None:
    async with make_client(redis_url=REDIS_URL, cache_local_entries=0) as client:
        checksum = (await client.get("/info")).json()["model"]["checksum"]
        await client.post("/similar", json={"text": "Where  are you FROM?"})
        keys = [k.decode() for k in clean_redis.keys("emb:*")]
        assert len(keys) == 1 and keys[0].startswith(f"emb:{checksum[:16]}:context:")
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
