"""Per-session conversation history: the last N turns, user and bot, with a TTL.

Turns of one session are handled one request at a time, in arrival order
(`SessionStore.turn`): two messages of one conversation in flight together
would both read the history before either wrote, answer from stale context,
and could store their turns in the wrong order. That lock holds in one
process; across replicas a turn is stored only if no other turn was stored
since its history was read (`History.writes`), else it is answered again from
the new history (`pipeline.session_reply`).

A turn is stored as compact UTF-8 JSON, three bytes a Hangul syllable rather
than the six of an ASCII escape; turns stored in the old escaped form read
the same.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Literal

from app.engine.kv import Guarded

Role = Literal["user", "bot"]


@dataclass(frozen=True)
class SessionTurn:
    role: Role
    text: str


@dataclass(frozen=True)
class History:
    turns: list[SessionTurn]  # oldest first
    writes: int  # appends the session had when read: the next append must find the same count


def encode(turn: SessionTurn) -> bytes:
    """Compact UTF-8 JSON. A lone surrogate, which UTF-8 cannot hold, is escaped as JSON allows."""
    item = {"role": turn.role, "text": turn.text}
    try:
        return json.dumps(item, ensure_ascii=False, separators=(",", ":")).encode()
    except UnicodeEncodeError:
        return json.dumps(item, separators=(",", ":")).encode()


def decode(raw: bytes) -> SessionTurn | None:
    """Either form, compact or ASCII-escaped; None for a corrupt entry."""
    try:
        item = json.loads(raw)
        return SessionTurn(role=item["role"], text=item["text"])
    except (ValueError, KeyError, TypeError):
        return None


@dataclass
class _Holders:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0  # requests holding or waiting for the lock; at 0 the entry goes


class SessionStore:
    def __init__(self, store: Guarded, max_turns: int, ttl_s: int) -> None:
        self.store = store
        self.max_turns = max_turns
        self.ttl_s = ttl_s
        self._turns: dict[str, _Holders] = {}  # only sessions with a request in flight

    @asynccontextmanager
    async def turn(self, session_id: str) -> AsyncIterator[None]:
        """Hold the session for one request: the next one waits (asyncio locks are first come, first served)."""
        holders = self._turns.setdefault(session_id, _Holders())
        holders.users += 1
        try:
            async with holders.lock:
                yield
        finally:
            holders.users -= 1
            if holders.users == 0:
                del self._turns[session_id]

    @staticmethod
    def _key(session_id: str) -> str:
        return f"session:{session_id}"

    async def history(self, session_id: str) -> History:
        """Empty for a new, expired or unreachable session."""
        raws, writes = await self.store.list_read(self._key(session_id))
        turns = [turn for turn in map(decode, raws) if turn is not None]  # a corrupt entry costs one turn
        return History(turns, writes)

    async def append(self, session_id: str, read: History, *turns: SessionTurn) -> bool:
        """Stores the turns after `read`'s; False if another turn was stored since `read` (nothing stored)."""
        values = [encode(t) for t in turns]
        return await self.store.list_append_if(self._key(session_id), read.writes, values, self.max_turns, self.ttl_s)
