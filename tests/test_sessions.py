"""What sessions may hold: compact turns, a byte bound per session, a count bound on sessions, in
Redis (the real one at 127.0.0.1:6379) and in the process alike."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
import redis

from app.engine.sessions import INDEX_KEY, SessionTurn, decode, encode
from tests.helpers import REDIS_URL, AppFactory

pytestmark = pytest.mark.anyio

HANGUL = "가나다라마바사아자차카타파하"


def korean(chars: int, seed: int = 0) -> str:
    return "".join(HANGUL[(i * 7 + seed) % len(HANGUL)] for i in range(chars))


async def say(client: httpx.AsyncClient, session: str, message: str) -> httpx.Response:
    return await client.post("/reply", json={"session_id": session, "message": message})


@pytest.fixture(params=["redis", "local"])
def store(request: pytest.FixtureRequest, make_client: AppFactory) -> Any:
    """(client factory, raw turns of a session) on Redis or on the in-process store."""
    where = request.param
    if where == "redis":
        state = request.getfixturevalue("clean_redis")

    @asynccontextmanager
    async def client(**settings: object) -> AsyncIterator[httpx.AsyncClient]:
        async with make_client(**({"redis_url": REDIS_URL} if where == "redis" else {}), **settings) as c:
            yield c

    async def raw(c: httpx.AsyncClient, session: str) -> list[bytes]:
        if where == "redis":
            return list(state.lrange(f"session:{session}", 0, -1))
        backend = c._transport.app.state.service.runtime.sessions.backend  # type: ignore[attr-defined]
        return (await backend.read(f"session:{session}"))[0]  # type: ignore[no-any-return]

    return client, raw


async def test_turns_are_stored_as_compact_utf8_and_the_old_escaped_form_still_reads(
    make_client: AppFactory, clean_redis: redis.Redis
) -> None:
    """Turns were ASCII-escaped JSON: six bytes a Hangul syllable (`\\uac00`), and a space after each
    separator. They are compact UTF-8 now, three bytes a syllable; what was stored before reads the same."""
    message = korean(1000)
    async with make_client(redis_url=REDIS_URL) as client:
        assert (await say(client, "s-compact", message)).status_code == 200
        user = clean_redis.lrange("session:s-compact", 0, -1)[0]
        assert user == ('{"role":"user","text":"' + message + '"}').encode()
        assert len(user) < 3 * len(message) + 30  # was 6,029 bytes
        old = [json.dumps({"role": r, "text": t}).encode() for r, t in [("user", message), ("bot", "잘 자")]]
        clean_redis.rpush("session:s-old", *old)
        clean_redis.set("writes:session:s-old", 1)
        sessions = client._transport.app.state.service.runtime.sessions  # type: ignore[attr-defined]
        history = await sessions.history("s-old")
        assert [(t.role, t.text) for t in history.turns] == [("user", message), ("bot", "잘 자")]
        assert (await say(client, "s-old", "내일 봐")).status_code == 200  # and the session goes on
    assert clean_redis.llen("session:s-old") == 4


def test_a_turn_utf8_cannot_hold_is_stored_escaped() -> None:
    turn = SessionTurn("user", "a lone \ud83d surrogate")
    assert decode(encode(turn)) == turn
    assert decode(encode(SessionTurn("bot", "축하해! 🎉"))) == SessionTurn("bot", "축하해! 🎉")


async def test_new_sessions_are_refused_at_the_count_and_stored_ones_keep_every_turn(store: Any) -> None:
    """Each new session id kept its turns for an hour, with no bound but the Redis' memory (in the
    process, the least recently used were dropped, turns of conversations under way included). At
    `session_max_count` a new id is now 429, nothing of it is stored, and the sessions stored go on
    whole; once one expires, a new one starts."""
    client_for, raw = store
    async with client_for(session_max_count=3, session_ttl_s=2) as client:
        for i in range(3):
            assert (await say(client, f"s-{i}", "hi! how are you?")).status_code == 200
        refused = await say(client, "s-new", "hi! how are you?")
        assert refused.status_code == 429, refused.text
        assert refused.json()["error"]["kind"] == "overloaded" and "session" in refused.json()["error"]["message"]
        assert await raw(client, "s-new") == []
        assert 'chitchat_refused_total{queue="sessions"} 1.0' in (await client.get("/metrics")).text
        for i in range(3):
            assert (await say(client, f"s-{i}", "do you like dogs?")).status_code == 200
            assert [decode(r).text for r in await raw(client, f"s-{i}")][0::2] == [  # type: ignore[union-attr]
                "hi! how are you?",
                "do you like dogs?",
            ]
        await asyncio.sleep(2.2)  # every session expires
        assert (await say(client, "s-new", "hi! how are you?")).status_code == 200
        assert len(await raw(client, "s-new")) == 2


async def test_a_session_keeps_its_newest_turns_within_its_bytes(store: Any) -> None:
    """A session of long Korean turns held every one of its last 10 turns, ~60 KiB ASCII-escaped. It keeps
    `session_max_bytes` of them now, the newest first, the newest turn and its reply always."""
    client_for, raw = store
    async with client_for(session_max_bytes=12_288) as client:
        for n in range(6):
            assert (await say(client, "s-long", f"{n} {korean(990, n)}")).status_code == 200
        kept = await raw(client, "s-long")
    assert sum(len(t) for t in kept) <= 12_288
    users = [t.text for t in map(decode, kept) if t is not None and t.role == "user"]
    assert users and users[-1].startswith("5 ") and not any(u.startswith("0 ") for u in users)


async def test_the_session_index_counts_each_stored_session_once(
    make_client: AppFactory, clean_redis: redis.Redis
) -> None:
    """Replicas share the count: it lives in Redis, beside the sessions, never under `session:`."""
    async with make_client(redis_url=REDIS_URL, session_max_count=5) as client:
        for i in range(8):
            await say(client, f"s-{i % 4}", "hi! how are you?")
    assert clean_redis.zcard(INDEX_KEY) == 4
    assert sorted(k.decode() for k in clean_redis.scan_iter("session:*")) == [f"session:s-{i}" for i in range(4)]


async def test_the_in_process_store_takes_no_new_session_once_its_sessions_fill_its_bytes() -> None:
    """Without Redis, CHITCHAT_SESSION_LOCAL_MB bounds what the sessions hold: past it a new one is
    refused, and the sessions stored go on."""
    from app.engine.sessions import LocalSessions, SessionBounds

    store = LocalSessions(SessionBounds(max_turns=10, ttl_s=60, max_sessions=100, max_bytes=16_384, local_bytes=10_000))
    turn = encode(SessionTurn("user", korean(990)))  # ~3 kB
    assert [await store.append(f"session:s-{i}", 0, [turn]) for i in range(4)] == [1, 1, 1, 1]
    assert store.held >= 10_000 and len(store) == 4
    assert await store.read("session:s-new") == ([], 0, False)
    assert await store.append("session:s-new", 0, [turn]) == -1
    assert await store.append("session:s-0", 1, [turn]) == 1  # a stored session goes on
    assert len((await store.read("session:s-0"))[0]) == 2
