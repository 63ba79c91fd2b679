"""Per-session conversation history: the last N turns, user and bot, with a TTL.

Turns of one session are handled one request at a time, in arrival order
(`SessionStore.turn`): two messages of one conversation in flight together
would both read the history before either wrote, answer from stale context,
and could store their turns in the wrong order. That lock holds in one
process; across replicas a turn is stored only if no other turn was stored
since its history was read (`History.writes`), else it is answered again from
the new history (`pipeline.session_reply`).

Anyone may open a session, so what sessions hold is bounded, in Redis and in
the process alike (`SessionBounds`): at most `max_sessions` sessions at once,
each of at most `max_bytes` of turns. A session over its bytes loses its
oldest turns first, as one over its turns does; the newest turn and its reply
are always kept. At the count a new session id is refused (`Overloaded`, a
429) until a stored session expires, and the sessions already stored keep
every turn: a flood of new ids never pushes out a conversation under way,
and never takes the room of what else lives in the state Redis (the candidate
store, jobs, the reindex lock). A turn is stored as compact UTF-8 JSON, three
bytes a Hangul syllable rather than the six of an ASCII escape; turns stored
in the old escaped form read the same.

In the per-turn way (core/context.py) a turn keeps its vector, packed beside its
text (`TurnVector`), so the next request encodes only its new message. The
vector names its space, the bundle checksum and the side it was encoded on, and
is read only by a request in that same space: a reindex with another encoder, a
rollback or a replica on another bundle recomputes it, never reuses it. Its
bytes count toward the session's byte bound as the text's do.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Literal, Protocol, TypeVar

import numpy as np
from redis.asyncio import Redis
from redis.exceptions import RedisError

from app.config import Settings
from app.engine.batcher import Overloaded
from app.engine.kv import UNKNOWN, WRITES_PREFIX, Guarded, RedisKV

Role = Literal["user", "bot"]
T = TypeVar("T")

# Every stored session's key, scored by when a turn was last stored in it (ms): what counts the
# sessions stored, and finds those expired, across replicas. Not under `session:`, so no scan of
# sessions' keys meets it.
INDEX_KEY = "sessions:touched"
# What a session costs the in-process store besides its turns' bytes: its entry, and each turn's object.
ENTRY_OVERHEAD, TURN_OVERHEAD = 200, 40


@dataclass(frozen=True)
class TurnVector:
    """A turn's vector in the per-turn way, in the space it was made in."""

    vector: np.ndarray = field(compare=False)  # [D] unit
    space: str  # "<bundle checksum, first 16>:<side>": `space_of`

    def pack(self) -> str:
        """int8 codes scaled by the largest component, base64: 4 + D bytes before base64 (520
        characters at D = 384), where float32 would take 2,048; cosine to the original > 0.9999."""
        scale = float(np.abs(self.vector).max()) or 1.0
        codes = np.round(self.vector / scale * 127).astype(np.int8)
        return base64.b64encode(np.float32(scale).tobytes() + codes.tobytes()).decode("ascii")

    @classmethod
    def unpack(cls, packed: str, space: str) -> TurnVector | None:
        try:
            raw = base64.b64decode(packed, validate=True)
        except (binascii.Error, ValueError):
            return None
        if len(raw) < 5:
            return None
        scale = float(np.frombuffer(raw[:4], dtype=np.float32)[0])
        vector = np.frombuffer(raw[4:], dtype=np.int8).astype(np.float32) * (scale / 127)
        norm = float(np.linalg.norm(vector))
        if not np.isfinite(norm) or norm == 0:
            return None
        return cls(vector / norm, space)


def space_of(bundle_checksum: str, side: str) -> str:
    """What a vector's space is named: the bundle it was made with and the side it was read on."""
    return f"{bundle_checksum[:16]}:{side}"


@dataclass(frozen=True)
class SessionTurn:
    role: Role
    text: str
    vector: TurnVector | None = None  # in the per-turn way, where the turn has one

    def vector_in(self, space: str) -> np.ndarray | None:
        """[D] the turn's vector if it was made in `space`; None otherwise, to be made again."""
        return self.vector.vector if self.vector is not None and self.vector.space == space else None


@dataclass(frozen=True)
class History:
    turns: list[SessionTurn]  # oldest first
    writes: int  # appends the session had when read: the next append must find the same count


@dataclass(frozen=True)
class SessionBounds:
    max_turns: int  # entries a session keeps, user and bot turns both
    ttl_s: int  # a session expires this long after its last stored turn
    max_sessions: int  # sessions stored at once; past it a new one is refused
    max_bytes: int  # bytes of turns one session keeps, its oldest dropped first
    local_bytes: int = 128 << 20  # the in-process store: no new session while its sessions hold this much


def encode(turn: SessionTurn) -> bytes:
    """Compact UTF-8 JSON. A lone surrogate, which UTF-8 cannot hold, is escaped as JSON allows."""
    item = {"role": turn.role, "text": turn.text}
    if turn.vector is not None:
        item.update(v=turn.vector.pack(), s=turn.vector.space)
    try:
        return json.dumps(item, ensure_ascii=False, separators=(",", ":")).encode()
    except UnicodeEncodeError:
        return json.dumps(item, separators=(",", ":")).encode()


def decode(raw: bytes) -> SessionTurn | None:
    """Either form, compact or ASCII-escaped; None for a corrupt entry. A vector that does not
    unpack is dropped (the turn is encoded again), the turn kept."""
    try:
        item = json.loads(raw)
        packed, space = item.get("v"), item.get("s")
        vector = TurnVector.unpack(packed, space) if isinstance(packed, str) and isinstance(space, str) else None
        return SessionTurn(role=item["role"], text=item["text"], vector=vector)
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


class Backend(Protocol):
    async def read(self, key: str) -> tuple[list[bytes], int, bool]: ...  # (turns, writes, room for it if new)

    # 1 stored; 0 another write came after `writes` (nothing stored); -1 a new session with no room
    async def append(self, key: str, writes: int, values: list[bytes]) -> int: ...


def _to_drop(sizes: list[int], fresh: int, max_bytes: int) -> int:
    """How many of the oldest entries (of `sizes`, oldest first) to drop so the rest fit `max_bytes`;
    never any of the last `fresh`."""
    total, drop = sum(sizes), 0
    while total > max_bytes and len(sizes) - drop > fresh:
        total -= sizes[drop]
        drop += 1
    return drop


class LocalSessions:
    """The in-process store (no Redis): sessions in order of their last stored turn, so the expired
    ones are always the first."""

    def __init__(self, bounds: SessionBounds) -> None:
        self.bounds = bounds
        self.held = 0  # bytes, by `_size`
        self._sessions: OrderedDict[str, tuple[float, list[bytes], int]] = OrderedDict()  # (expires, turns, writes)

    @staticmethod
    def _size(key: str, turns: list[bytes]) -> int:
        return len(key) + sum(len(t) + TURN_OVERHEAD for t in turns) + ENTRY_OVERHEAD

    def _prune(self) -> None:
        now = time.monotonic()
        while self._sessions:
            key, (expires, turns, _) = next(iter(self._sessions.items()))
            if expires >= now:
                break
            del self._sessions[key]
            self.held -= self._size(key, turns)

    def _room(self) -> bool:
        self._prune()
        return len(self._sessions) < self.bounds.max_sessions and self.held < self.bounds.local_bytes

    async def read(self, key: str) -> tuple[list[bytes], int, bool]:
        self._prune()
        entry = self._sessions.get(key)
        if entry is None:
            return [], 0, self._room()
        return list(entry[1]), entry[2], True

    async def append(self, key: str, writes: int, values: list[bytes]) -> int:
        self._prune()
        entry = self._sessions.get(key)
        turns, now_writes = (entry[1], entry[2]) if entry else ([], 0)
        if now_writes != writes:
            return 0
        if entry is None and not self._room():
            return -1
        if entry is not None:
            del self._sessions[key]  # back in at the end: the order is by last write
            self.held -= self._size(key, turns)
        kept = (turns + values)[-self.bounds.max_turns :]
        kept = kept[_to_drop([len(t) for t in kept], len(values), self.bounds.max_bytes) :]
        self._sessions[key] = (time.monotonic() + self.bounds.ttl_s, kept, writes + 1)
        self.held += self._size(key, kept)
        return 1

    def __len__(self) -> int:
        self._prune()
        return len(self._sessions)


# Shared by both scripts: while the index is at the count, drops expired sessions from it, 100 at a
# time, so that no script runs long; true if a new session fits after that.
_ROOM = """
local function now_ms()
  local t = redis.call('time')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function room(index, now, ttl_ms, most)
  for _ = 1, 100 do
    if redis.call('zcard', index) < most then return true end
    local old = redis.call('zrangebyscore', index, '-inf', now - ttl_ms, 'LIMIT', 0, 100)
    if #old == 0 then return false end
    redis.call('zrem', index, unpack(old))
  end
  return redis.call('zcard', index) < most
end
"""

# KEYS: the session's list, its write count, the index. ARGV: ttl_s, max_sessions.
_READ = (
    _ROOM
    + """
local turns = redis.call('lrange', KEYS[1], 0, -1)
local writes = tonumber(redis.call('get', KEYS[2]) or '0')
local fits = 1
if writes == 0 and not redis.call('zscore', KEYS[3], KEYS[1]) then
  if not room(KEYS[3], now_ms(), tonumber(ARGV[1]) * 1000, tonumber(ARGV[2])) then fits = 0 end
end
return {turns, writes, fits}
"""
)

# Compare, admit, append, trim by turns and by bytes, and touch the index, in one step: between two
# round trips another replica could append, or take the last place.
# KEYS: as _READ. ARGV: writes read, keep_last, ttl_s, max_sessions, max_bytes, the values...
_APPEND = (
    _ROOM
    + """
local writes = tonumber(redis.call('get', KEYS[2]) or '0')
if writes ~= tonumber(ARGV[1]) then return 0 end
local ttl = tonumber(ARGV[3])
local now = now_ms()
if writes == 0 and not redis.call('zscore', KEYS[3], KEYS[1]) then
  if not room(KEYS[3], now, ttl * 1000, tonumber(ARGV[4])) then return -1 end
end
redis.call('rpush', KEYS[1], unpack(ARGV, 6))
redis.call('ltrim', KEYS[1], -tonumber(ARGV[2]), -1)
local turns = redis.call('lrange', KEYS[1], 0, -1)
local total, drop, fresh = 0, 0, #ARGV - 5
for _, turn in ipairs(turns) do total = total + #turn end
while total > tonumber(ARGV[5]) and #turns - drop > fresh do
  drop = drop + 1
  total = total - #turns[drop]
end
if drop > 0 then redis.call('ltrim', KEYS[1], drop, -1) end
redis.call('expire', KEYS[1], ttl)
redis.call('set', KEYS[2], writes + 1, 'EX', ttl)
redis.call('zadd', KEYS[3], now, KEYS[1])
return 1
"""
)


class RedisSessions:
    """Sessions in the state Redis, behind its guard: a failing Redis is bypassed as for every other
    call (a read finds no history, a write stores nothing), and counted by the guard."""

    def __init__(self, guard: Guarded, client: Redis, bounds: SessionBounds) -> None:
        self.guard = guard
        self.bounds = bounds
        self._read = client.register_script(_READ)
        self._append = client.register_script(_APPEND)

    async def _guarded(self, operation: str, call: Callable[[], Awaitable[T]], bypassed: T) -> T:
        if not self.guard._available():
            return bypassed
        try:
            return await call()
        except (RedisError, OSError, TimeoutError) as error:
            self.guard._failed(operation, error)
            return bypassed

    async def read(self, key: str) -> tuple[list[bytes], int, bool]:
        b = self.bounds

        async def call() -> tuple[list[bytes], int, bool]:
            turns, writes, fits = await self._read(
                keys=[key, WRITES_PREFIX + key, INDEX_KEY], args=[b.ttl_s, b.max_sessions]
            )
            return [t for t in turns if isinstance(t, bytes)], int(writes), bool(fits)

        return await self._guarded("lrange", call, ([], UNKNOWN, True))

    async def append(self, key: str, writes: int, values: list[bytes]) -> int:
        b = self.bounds
        keys = [key, WRITES_PREFIX + key, INDEX_KEY]
        args: list[bytes | int] = [writes, b.max_turns, b.ttl_s, b.max_sessions, b.max_bytes, *values]

        async def call() -> int:
            return int(await self._append(keys=keys, args=args))

        # Redis away: the turn is lost with the outage, and there is nothing to retry.
        return await self._guarded("rpush", call, 1)


@dataclass
class _Holders:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0  # requests holding or waiting for the lock; at 0 the entry goes


class SessionStore:
    def __init__(self, store: Guarded, bounds: SessionBounds) -> None:
        self.store = store
        self.bounds = bounds
        inner = store.inner
        self.backend: Backend = (
            RedisSessions(store, inner.client, bounds) if isinstance(inner, RedisKV) else LocalSessions(bounds)
        )
        self.refused = 0  # new sessions turned away at max_sessions (or the in-process store's bytes)
        self._turns: dict[str, _Holders] = {}  # only sessions with a request in flight

    @classmethod
    def for_settings(cls, store: Guarded, settings: Settings) -> SessionStore:
        """The bounds `settings` give; the in-process store also keeps to its own entries and MiB."""
        local = not isinstance(store.inner, RedisKV)
        bounds = SessionBounds(
            max_turns=settings.session_max_turns,
            ttl_s=settings.session_ttl_s,
            max_sessions=min(settings.session_max_count, settings.session_local_entries)
            if local
            else settings.session_max_count,
            max_bytes=settings.session_max_bytes,
            local_bytes=settings.session_local_mb << 20,
        )
        return cls(store, bounds)

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

    def _full(self) -> Overloaded:
        self.refused += 1
        return Overloaded(
            f"no room for a new session: {self.bounds.max_sessions} are stored; one can start once another "
            f"expires ({self.bounds.ttl_s} s after its last turn)"
        )

    async def history(self, session_id: str) -> History:
        """Empty for a new, expired or unreachable session. Raises Overloaded (429) for a new one
        that would not be stored: refused before it is answered."""
        raws, writes, fits = await self.backend.read(self._key(session_id))
        if not fits:
            raise self._full()
        turns = [turn for turn in map(decode, raws) if turn is not None]  # a corrupt entry costs one turn
        return History(turns, writes)

    async def append(self, session_id: str, read: History, *turns: SessionTurn) -> bool:
        """Stores the turns after `read`'s; False if another turn was stored since `read` (nothing stored).
        Raises Overloaded (429) if the session is new and the last place went meanwhile."""
        stored = await self.backend.append(self._key(session_id), read.writes, [encode(t) for t in turns])
        if stored < 0:
            raise self._full()
        return stored > 0
