"""The small key-value surface the service needs from Redis, with an
in-process twin for the embedded default, and a guard that turns a slow or
dead Redis into cache misses instead of failed requests."""

from __future__ import annotations

import contextlib
import logging
import time
from collections import OrderedDict
from typing import Literal, Protocol

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

log = logging.getLogger(__name__)

Status = Literal["up", "down", "disabled"]
HEALTH_CHECK_INTERVAL_S = 10


# A list's write count lives beside it, under this prefix: an append that names the count it
# read succeeds only if no other write came between (the session store's turn order).
WRITES_PREFIX = "writes:"
UNKNOWN = -1  # the write count of a list that could not be read (Redis bypassed)


class KeyValue(Protocol):
    async def get_many(self, keys: list[str]) -> list[bytes | None]: ...
    async def set_many(self, items: dict[str, bytes], ttl_s: int) -> None: ...
    async def list_read(self, key: str) -> tuple[list[bytes], int]: ...  # (items, writes so far)
    async def list_append_if(
        self, key: str, writes: int, values: list[bytes], keep_last: int, ttl_s: int
    ) -> bool: ...  # False: another write came after `writes`; nothing appended
    async def ping(self) -> bool: ...
    async def close(self) -> None: ...


ENTRY_OVERHEAD = 200  # bytes a stored entry costs besides its key and value: the tuple, list, float, dict slot


def _size(key: str, value: bytes | list[bytes]) -> int:
    stored = len(value) if isinstance(value, bytes) else sum(len(v) + 40 for v in value)  # 40: a bytes object
    return len(key) + stored + ENTRY_OVERHEAD


class MemoryKV:
    """LRU with per-key expiry, bounded by entries and by bytes; the embedded default with no Redis.

    A count alone does not bound memory: a session of ten 1,000-character Korean turns is ~30 KiB,
    so 100,000 of them would hold ~1.5 GiB, and anyone may open sessions."""

    def __init__(self, max_entries: int = 100_000, max_bytes: int = 128 << 20) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.held = 0  # bytes of every entry, by `_size`
        self._data: OrderedDict[str, tuple[float, bytes | list[bytes]]] = OrderedDict()

    def _get(self, key: str) -> bytes | list[bytes] | None:
        item = self._data.get(key)
        if item is None:
            return None
        expires, value = item
        if expires < time.monotonic():
            self._drop(key)
            return None
        self._data.move_to_end(key)
        return value

    def _drop(self, key: str) -> None:
        _, value = self._data.pop(key)
        self.held -= _size(key, value)

    def _put(self, key: str, value: bytes | list[bytes], ttl_s: int) -> None:
        if key in self._data:
            self._drop(key)
        self._data[key] = (time.monotonic() + ttl_s, value)
        self.held += _size(key, value)
        while self._data and (len(self._data) > self.max_entries or self.held > self.max_bytes):
            self._drop(next(iter(self._data)))  # the least recently used

    async def get_many(self, keys: list[str]) -> list[bytes | None]:
        values = [self._get(k) for k in keys]
        return [v if isinstance(v, bytes) else None for v in values]

    async def set_many(self, items: dict[str, bytes], ttl_s: int) -> None:
        for key, value in items.items():
            self._put(key, value, ttl_s)

    async def list_read(self, key: str) -> tuple[list[bytes], int]:
        value, writes = self._get(key), self._get(WRITES_PREFIX + key)
        return (list(value) if isinstance(value, list) else []), int(writes) if isinstance(writes, bytes) else 0

    async def list_append_if(self, key: str, writes: int, values: list[bytes], keep_last: int, ttl_s: int) -> bool:
        current, now = await self.list_read(key)
        if now != writes:
            return False
        self._put(key, (current + values)[-keep_last:], ttl_s)
        self._put(WRITES_PREFIX + key, str(now + 1).encode(), ttl_s)
        return True

    async def ping(self) -> bool:
        return True

    async def close(self) -> None:
        self._data.clear()
        self.held = 0


def _client(url: str, timeout_s: float) -> aioredis.Redis:
    """A client that reconnects rather than fails when a pooled connection went
    stale (Redis restarted): one quick retry on a fresh connection, so only a
    failure that survives it reaches the guard and trips the bypass. A
    connection idle longer than the health-check interval is pinged first.

    Only connection errors are retried. `Retry`'s default list also holds
    TimeoutError, which `retry_on_timeout=False` does not take out: a frozen
    Redis (SIGSTOP, a stalled host) then cost the timeout once per attempt,
    health-check ping included, before the guard could bypass it."""
    return aioredis.Redis.from_url(
        url,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        retry=Retry(
            ExponentialBackoff(cap=timeout_s, base=timeout_s / 10), retries=1, supported_errors=(RedisConnectionError,)
        ),
        retry_on_error=[RedisConnectionError],
        retry_on_timeout=False,  # a slow Redis is slow again on retry: bypass it instead
        health_check_interval=HEALTH_CHECK_INTERVAL_S,
    )


class RedisKV:
    # Compare, append, trim and count in one step: between two round trips another replica could append.
    _APPEND_IF = """
local writes = tonumber(redis.call('get', KEYS[2]) or '0')
if writes ~= tonumber(ARGV[1]) then return 0 end
redis.call('rpush', KEYS[1], unpack(ARGV, 4))
redis.call('ltrim', KEYS[1], -tonumber(ARGV[2]), -1)
redis.call('expire', KEYS[1], ARGV[3])
redis.call('set', KEYS[2], writes + 1, 'EX', ARGV[3])
return 1
"""

    def __init__(self, url: str, timeout_s: float) -> None:
        self.client = _client(url, timeout_s)

    async def get_many(self, keys: list[str]) -> list[bytes | None]:
        return [v if isinstance(v, bytes) else None for v in await self.client.mget(keys)] if keys else []

    async def set_many(self, items: dict[str, bytes], ttl_s: int) -> None:
        if not items:
            return
        async with self.client.pipeline(transaction=False) as pipe:
            for key, value in items.items():
                pipe.set(key, value, ex=ttl_s)
            await pipe.execute()

    async def list_read(self, key: str) -> tuple[list[bytes], int]:
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.lrange(key, 0, -1)
            pipe.get(WRITES_PREFIX + key)
            items, writes = await pipe.execute()
        return [v for v in items if isinstance(v, bytes)], int(writes or 0)

    async def list_append_if(self, key: str, writes: int, values: list[bytes], keep_last: int, ttl_s: int) -> bool:
        keys = [key, WRITES_PREFIX + key]
        done = await self.client.eval(self._APPEND_IF, 2, *keys, writes, keep_last, ttl_s, *values)
        return bool(done)

    async def ping(self) -> bool:
        return bool(await self.client.ping())

    async def close(self) -> None:
        await self.client.aclose()


class Guarded:
    """Wraps a KeyValue so that a failure costs one timeout, then nothing.

    After an error every call is skipped (a miss, a no-op) for `retry_after_s`;
    the next call after that probes Redis again. Reads return misses, so
    callers never need their own error handling.
    """

    def __init__(self, inner: KeyValue, retry_after_s: float, disabled: bool = False) -> None:
        self.inner = inner
        self.retry_after_s = retry_after_s
        self.disabled = disabled  # an in-process store: nothing can be down
        self._down_until = 0.0
        self.errors = 0  # failures that survived the client's reconnect, by operation below
        self.errors_by_op: dict[str, int] = {}
        self.bypass_seconds = 0.0  # total length of the bypass windows entered so far
        self.skipped_calls = 0  # calls answered as misses or no-ops because Redis was bypassed

    @property
    def status(self) -> Status:
        if self.disabled:
            return "disabled"
        return "down" if time.monotonic() < self._down_until else "up"

    def _available(self) -> bool:
        if time.monotonic() >= self._down_until:
            return True
        self.skipped_calls += 1
        return False

    def _failed(self, op: str, error: Exception) -> None:
        now = time.monotonic()
        if now >= self._down_until:
            log.warning("redis %s failed (%s); bypassing it for %.0fs", op, error, self.retry_after_s)
            self.bypass_seconds += self.retry_after_s
        else:  # already bypassed (a ping): the window only grows by what is new
            self.bypass_seconds += now + self.retry_after_s - self._down_until
        self.errors += 1
        self.errors_by_op[op] = self.errors_by_op.get(op, 0) + 1
        self._down_until = now + self.retry_after_s

    async def get_many(self, keys: list[str]) -> list[bytes | None]:
        if self._available():
            try:
                return await self.inner.get_many(keys)
            except (RedisError, OSError, TimeoutError) as error:
                self._failed("get", error)
        return [None] * len(keys)

    async def set_many(self, items: dict[str, bytes], ttl_s: int) -> None:
        if self._available():
            try:
                await self.inner.set_many(items, ttl_s)
            except (RedisError, OSError, TimeoutError) as error:
                self._failed("set", error)

    async def list_read(self, key: str) -> tuple[list[bytes], int]:
        if self._available():
            try:
                return await self.inner.list_read(key)
            except (RedisError, OSError, TimeoutError) as error:
                self._failed("lrange", error)
        return [], UNKNOWN

    async def list_append_if(self, key: str, writes: int, values: list[bytes], keep_last: int, ttl_s: int) -> bool:
        """True also when Redis is away: the turn is lost with the outage, and there is nothing to retry."""
        if self._available():
            try:
                return await self.inner.list_append_if(key, writes, values, keep_last, ttl_s)
            except (RedisError, OSError, TimeoutError) as error:
                self._failed("rpush", error)
        return True

    async def ping(self) -> bool:
        """Always asks, even while bypassed: readiness wants the live answer."""
        try:
            ok = await self.inner.ping()
        except (RedisError, OSError, TimeoutError) as error:
            self._failed("ping", error)
            return False
        if ok:
            self._down_until = 0.0
        return ok

    async def close(self) -> None:
        with contextlib.suppress(RedisError, OSError, TimeoutError):
            await self.inner.close()


def open_store(
    redis_url: str | None, timeout_ms: int, retry_after_s: float, memory_entries: int, memory_bytes: int = 128 << 20
) -> Guarded:
    if redis_url:
        return Guarded(RedisKV(redis_url, timeout_ms / 1000), retry_after_s)
    return Guarded(MemoryKV(memory_entries, memory_bytes), retry_after_s, disabled=True)
