"""The small key-value surface the service needs from Redis, with an
in-process twin for the embedded default, and a guard that turns a slow or
dead Redis into cache misses instead of failed requests.

A busy connection pool is not a dead Redis: a call waits for a pooled
connection (bounded), and one that waited in vain is `RedisBusy`, which the
guard never takes for a failure of Redis (it bypasses nothing)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any, Literal, Protocol, TypeVar

import redis.asyncio as aioredis
from redis.asyncio.connection import AbstractConnection, BlockingConnectionPool
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import MaxConnectionsError, RedisError

log = logging.getLogger(__name__)
T = TypeVar("T")

Status = Literal["up", "down", "disabled"]
HEALTH_CHECK_INTERVAL_S = 10


# A list's write count lives beside it, under this prefix: an append that names the count it
# read succeeds only if no other write came between (the session store's turn order).
WRITES_PREFIX = "writes:"
UNKNOWN = -1  # the write count of a list that could not be read (Redis bypassed)


class RedisBusy(Exception):
    """Every connection of the pool stayed in use for the whole wait: Redis is busy from this
    process, not down. Not a RedisError: nothing that handles a failing Redis may take it for one."""


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


class _WaitingPool(BlockingConnectionPool):
    """With every connection in use, a caller waits up to `timeout` seconds for one to come back.
    The library's pools say "Too many connections" at once (the default one) or a ConnectionError
    after the wait (this one), either of which reads as Redis failing; past the wait this one
    raises `RedisBusy` instead."""

    busy = 0  # callers that waited in vain, whatever they called through (the guard, the session scripts)

    async def get_connection(self, *args: Any, **kwargs: Any) -> AbstractConnection:
        try:
            connection: AbstractConnection = await super().get_connection(*args, **kwargs)  # type: ignore[no-untyped-call]
            return connection
        except RedisConnectionError as error:
            if isinstance(error.__cause__, TimeoutError):  # the wait for a connection, not a connect
                self.busy += 1
                raise RedisBusy(f"all {self.max_connections} connections busy for {self.timeout}s") from error
            raise


def _client(url: str, timeout_s: float, max_connections: int = 100, pool_wait_s: float = 1.0) -> aioredis.Redis:
    """A client that reconnects rather than fails when a pooled connection went
    stale (Redis restarted): one quick retry on a fresh connection, so only a
    failure that survives it reaches the guard and trips the bypass. A
    connection idle longer than the health-check interval is pinged first.
    At most `max_connections` connections; with all in use a call waits up to
    `pool_wait_s` for one (`_WaitingPool`).

    Only connection errors are retried. `Retry`'s default list also holds
    TimeoutError, which `retry_on_timeout=False` does not take out: a frozen
    Redis (SIGSTOP, a stalled host) then cost the timeout once per attempt,
    health-check ping included, before the guard could bypass it."""
    pool = _WaitingPool.from_url(
        url,
        max_connections=max_connections,
        timeout=pool_wait_s,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        retry=Retry(
            ExponentialBackoff(cap=timeout_s, base=timeout_s / 10), retries=1, supported_errors=(RedisConnectionError,)
        ),
        retry_on_error=[RedisConnectionError],
        retry_on_timeout=False,  # a slow Redis is slow again on retry: bypass it instead
        health_check_interval=HEALTH_CHECK_INTERVAL_S,
    )
    return aioredis.Redis.from_pool(pool)  # the client owns the pool: closing it closes the pool


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

    def __init__(self, url: str, timeout_s: float, max_connections: int = 100, pool_wait_s: float = 1.0) -> None:
        self.client = _client(url, timeout_s, max_connections, pool_wait_s)

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

    @property
    def busy(self) -> int:
        """Calls that found no free connection within the pool's wait."""
        pool = self.client.connection_pool
        return pool.busy if isinstance(pool, _WaitingPool) else 0

    async def close(self) -> None:
        await self.client.aclose()


# What a pool that ran out of connections raises: ours after its wait, the library's default at once.
BUSY = (RedisBusy, MaxConnectionsError)


class Guarded:
    """Wraps a KeyValue so that a failure costs one timeout, then nothing.

    After an error every call is skipped (a miss, a no-op) for `retry_after_s`;
    the next call after that probes Redis again. Reads return misses, so
    callers never need their own error handling.

    A busy pool (`BUSY`: no connection came free within the pool's wait) is
    not an error of Redis and bypasses nothing: a cache read is a miss and a
    cache write is dropped, but a session read or write raises `RedisBusy`, so
    the turn is refused rather than answered and silently not stored.
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
        self._busy_logged = -float("inf")
        self._pinged_at = -float("inf")  # when the last ping for `readiness` answered
        self._pinging: asyncio.Future[bool] | None = None

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

    @property
    def busy(self) -> int:
        """Calls that found no free pooled connection within the wait (not errors), by any path."""
        return int(getattr(self.inner, "busy", 0))

    def _busy(self, op: str, error: Exception) -> None:
        now = time.monotonic()
        if now - self._busy_logged >= self.retry_after_s:  # at most one line a window
            self._busy_logged = now
            log.warning("redis %s: no free connection (%s); Redis is not bypassed", op, error)

    async def get_many(self, keys: list[str]) -> list[bytes | None]:
        if self._available():
            try:
                return await self.inner.get_many(keys)
            except BUSY as error:
                self._busy("get", error)
            except (RedisError, OSError, TimeoutError) as error:
                self._failed("get", error)
        return [None] * len(keys)

    async def set_many(self, items: dict[str, bytes], ttl_s: int) -> None:
        if self._available():
            try:
                await self.inner.set_many(items, ttl_s)
            except BUSY as error:
                self._busy("set", error)
            except (RedisError, OSError, TimeoutError) as error:
                self._failed("set", error)

    async def list_read(self, key: str) -> tuple[list[bytes], int]:
        """Raises RedisBusy when no connection came free: a turn answered without its history
        would also be stored after the wrong context."""
        return await self._session_call("lrange", lambda: self.inner.list_read(key), ([], UNKNOWN))

    async def list_append_if(self, key: str, writes: int, values: list[bytes], keep_last: int, ttl_s: int) -> bool:
        """True also when Redis is away: the turn is lost with the outage, and there is nothing to retry.
        Raises RedisBusy when no connection came free: Redis is there, and the caller must hear the
        turn was not stored."""
        return await self._session_call(
            "rpush", lambda: self.inner.list_append_if(key, writes, values, keep_last, ttl_s), True
        )

    async def _session_call(self, op: str, call: Callable[[], Awaitable[T]], away: T) -> T:
        """A session read or write: `away` while Redis is bypassed or once it fails; RedisBusy when no
        pooled connection came free, which a session's caller must hear (a cache call need not)."""
        if self._available():
            try:
                return await call()
            except BUSY as error:
                self._busy(op, error)
                if isinstance(error, MaxConnectionsError):
                    raise RedisBusy(str(error)) from error
                raise
            except (RedisError, OSError, TimeoutError) as error:
                self._failed(op, error)
        return away

    async def ping(self) -> bool:
        """Always asks, even while bypassed: readiness wants the live answer. A busy pool says
        nothing about Redis: the status stays what it was."""
        try:
            ok = await self.inner.ping()
        except BUSY as error:
            self._busy("ping", error)
            return self.status == "up"
        except (RedisError, OSError, TimeoutError) as error:
            self._failed("ping", error)
            return False
        if ok:
            self._down_until = 0.0
        return ok

    async def readiness(self, max_age_s: float) -> Status:
        """The status, with Redis pinged at most once every `max_age_s` and never twice at once:
        calls that arrive while a ping is out wait for it and share its answer (/readyz under a
        flood of probes). A caller that gives up does not cancel the ping the others wait for."""
        if self.disabled:
            return "disabled"
        if time.monotonic() - self._pinged_at >= max_age_s:
            if self._pinging is None:
                self._pinging = asyncio.ensure_future(self._ping_once())
            await asyncio.shield(self._pinging)
        return self.status

    async def _ping_once(self) -> bool:
        try:
            return await self.ping()
        finally:
            self._pinged_at = time.monotonic()
            self._pinging = None

    async def close(self) -> None:
        if self._pinging is not None:
            self._pinging.cancel()
        with contextlib.suppress(RedisError, OSError, TimeoutError):
            await self.inner.close()


def open_store(
    redis_url: str | None,
    timeout_ms: int,
    retry_after_s: float,
    memory_entries: int,
    memory_bytes: int = 128 << 20,
    max_connections: int = 100,
    pool_wait_ms: int = 1000,
) -> Guarded:
    if redis_url:
        return Guarded(RedisKV(redis_url, timeout_ms / 1000, max_connections, pool_wait_ms / 1000), retry_after_s)
    return Guarded(MemoryKV(memory_entries, memory_bytes), retry_after_s, disabled=True)
