"""How sessions are stored, in Redis (the real one at 127.0.0.1:6379)."""

from __future__ import annotations

import json

import httpx
import pytest
import redis

from app.engine.sessions import SessionTurn, decode, encode
from tests.helpers import REDIS_URL, AppFactory

pytestmark = pytest.mark.anyio

HANGUL = "가나다라마바사아자차카타파하"


def korean(chars: int, seed: int = 0) -> str:
    return "".join(HANGUL[(i * 7 + seed) % len(HANGUL)] for i in range(chars))


async def say(client: httpx.AsyncClient, session: str, message: str) -> httpx.Response:
    return await client.post("/reply", json={"session_id": session, "message": message})


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
        sessions = client._transport.app.state.runtime.sessions  # type: ignore[attr-defined]
        history = await sessions.history("s-old")
        assert [(t.role, t.text) for t in history.turns] == [("user", message), ("bot", "잘 자")]
        assert (await say(client, "s-old", "내일 봐")).status_code == 200  # and the session goes on
    assert clean_redis.llen("session:s-old") == 4


def test_a_turn_utf8_cannot_hold_is_stored_escaped() -> None:
    turn = SessionTurn("user", "a lone \ud83d surrogate")
    assert decode(encode(turn)) == turn
    assert decode(encode(SessionTurn("bot", "축하해! 🎉"))) == SessionTurn("bot", "축하해! 🎉")
