"""The in-process embedding LRU: bounded by entries and by bytes, most recent kept."""

from __future__ import annotations

import asyncio
import weakref

import numpy as np
import pytest

from app.engine.cache import LOCAL_ONLY, MAX_PENDING_WRITES, SHARED_MAX_CHARS, EmbeddingCache
from app.engine.kv import Guarded, MemoryKV, open_store

pytestmark = pytest.mark.anyio

CONTEXT = np.zeros(384, dtype=np.float32)  # 1.5 kB
POLY = np.zeros(16 * 384, dtype=np.float32)  # 24 kB, the m = 16 vectors of one context


def cache(entries: int, local_bytes: int) -> EmbeddingCache:
    return EmbeddingCache(open_store(None, 50, 1.0, 0), entries, 60, local_bytes=local_bytes)


async def test_large_vectors_are_bounded_by_bytes_not_by_their_count() -> None:
    lru = cache(entries=1000, local_bytes=100_000)  # room for 4 poly entries
    await lru.put_many({f"poly:{i}": POLY for i in range(10)})
    entries, held = lru.local_size
    assert entries == 4 and held == 4 * POLY.nbytes <= 100_000
    found = await lru.get_many([f"poly:{i}" for i in range(10)], POLY.size)
    assert [v is not None for v in found] == [False] * 6 + [True] * 4  # the newest stay


async def test_small_vectors_are_bounded_by_the_entry_count() -> None:
    lru = cache(entries=3, local_bytes=1 << 30)
    await lru.put_many({f"ctx:{i}": CONTEXT for i in range(5)})
    assert lru.local_size == (3, 3 * CONTEXT.nbytes)


async def test_a_key_stored_again_is_counted_once_and_becomes_the_newest() -> None:
    lru = cache(entries=2, local_bytes=1 << 30)
    await lru.put_many({"a": CONTEXT, "b": CONTEXT})
    await lru.put_many({"a": CONTEXT})
    await lru.put_many({"c": CONTEXT})
    assert lru.local_size == (2, 2 * CONTEXT.nbytes)
    assert [v is not None for v in await lru.get_many(["a", "b", "c"], CONTEXT.size)] == [True, False, True]


async def test_a_cached_row_does_not_keep_its_whole_batch_alive() -> None:
    """The encoder hands each request views into its batch's output ([R, m, D] for poly vectors):
    an entry that kept its view would hold the whole batch, beyond what the byte bound counts."""
    batch = np.zeros((64, 16 * 384), dtype=np.float32)  # [R, m * D]: 1.5 MB
    batch_alive = weakref.ref(batch)
    lru = cache(entries=1000, local_bytes=1 << 30)
    await lru.put_many({"poly:0": batch[3]})
    del batch
    assert batch_alive() is None
    assert lru.local_size == (1, POLY.nbytes)


class HeldStore(MemoryKV):
    """A shared store whose writes wait until the test lets them through."""

    def __init__(self) -> None:
        super().__init__()
        self.release = asyncio.Event()
        self.writes: list[list[str]] = []

    async def set_many(self, items: dict[str, bytes], ttl_s: int) -> None:
        await self.release.wait()
        self.writes.append(sorted(items))
        await super().set_many(items, ttl_s)


def shared_cache(store: HeldStore) -> EmbeddingCache:
    return EmbeddingCache(Guarded(store, retry_after_s=1.0), local_entries=100, ttl_s=60)


async def test_a_shared_write_never_holds_up_the_request() -> None:
    store = HeldStore()
    lru = shared_cache(store)
    await lru.put_many({"ctx:0": CONTEXT})
    found = await lru.get_many(["ctx:0"], CONTEXT.size)  # asked again: shared, and returns while that is held
    assert store.writes == [] and found[0] is not None
    store.release.set()
    await lru.flush()
    assert store.writes == [["ctx:0"]]


async def test_a_text_is_shared_once_it_is_asked_for_a_second_time_and_only_once() -> None:
    store = HeldStore()
    store.release.set()
    lru = shared_cache(store)
    key = lru.key("checksum", "context", "hi there")
    await lru.put_many({key: CONTEXT})  # encoded on its first ask: a one-off, as far as anyone knows
    await lru.flush()
    assert store.writes == []
    for _ in range(3):
        assert (await lru.get_many([key], CONTEXT.size))[0] is not None
    await lru.flush()
    assert store.writes == [[key]] and lru.shared_writes == 1


async def test_a_text_evicted_and_asked_again_is_shared() -> None:
    store = HeldStore()
    store.release.set()
    lru = EmbeddingCache(Guarded(store, retry_after_s=1.0), local_entries=0, ttl_s=60)  # keeps nothing in process
    key = lru.key("checksum", "context", "lol")
    await lru.put_many({key: CONTEXT})
    await lru.put_many({key: CONTEXT})  # not found anywhere, encoded again: the second ask
    await lru.flush()
    assert store.writes == [[key]]


class CountingStore(MemoryKV):
    def __init__(self) -> None:
        super().__init__()
        self.lookups: list[list[str]] = []

    async def get_many(self, keys: list[str]) -> list[bytes | None]:
        self.lookups.append(keys)
        return await super().get_many(keys)


async def test_a_long_text_never_goes_near_the_shared_store() -> None:
    """What people repeat is short; a long text's lookup would be a round trip on the request's path for nothing."""
    store = CountingStore()
    lru = EmbeddingCache(Guarded(store, retry_after_s=1.0), local_entries=0, ttl_s=60)
    long = lru.key("checksum", "context", "x" * (SHARED_MAX_CHARS + 1))
    short = lru.key("checksum", "context", "x" * SHARED_MAX_CHARS)
    assert long.startswith(LOCAL_ONLY) and not short.startswith(LOCAL_ONLY)
    for _ in range(3):
        assert await lru.get_many([long], CONTEXT.size) == [None]
        await lru.put_many({long: CONTEXT})
    await lru.flush()
    assert store.lookups == [] and lru.shared_writes == 0
    await lru.get_many([long, short], CONTEXT.size)
    assert store.lookups == [[short]]


async def test_unshared_vectors_stay_in_the_process() -> None:
    store = HeldStore()
    store.release.set()
    lru = shared_cache(store)
    await lru.put_many({"poly:0": POLY}, share=False)
    await lru.flush()
    assert store.writes == [] and lru.local_size[0] == 1


async def test_writes_past_the_in_flight_bound_are_skipped_and_counted() -> None:
    store = HeldStore()
    lru = shared_cache(store)
    for i in range(MAX_PENDING_WRITES + 3):
        await lru.put_many({f"ctx:{i}": CONTEXT})
        await lru.get_many([f"ctx:{i}"], CONTEXT.size)  # asked again: to be shared
    assert lru.skipped_writes == 3
    store.release.set()
    await lru.flush()
    assert len(store.writes) == MAX_PENDING_WRITES and lru.local_size[0] == MAX_PENDING_WRITES + 3


async def test_the_in_process_session_store_is_bounded_in_bytes_not_only_in_entries() -> None:
    """#49: a session of ten 1,000-character Korean turns is ~30 KiB; 100,000 sessions, the entry bound,
    would hold ~1.5 GiB, and sessions are open to anyone. The byte bound drops the least recently used."""
    store = MemoryKV(max_entries=100_000, max_bytes=4 << 20)
    turn = ("가" * 1000).encode()  # 3,000 bytes of UTF-8
    for session in range(1000):
        for writes in range(10):
            assert await store.list_append_if(f"s:{session}", writes, [turn], keep_last=10, ttl_s=60)
    assert store.held <= 4 << 20  # 1,000 sessions of ~30 KiB: ~30 MiB without the byte bound
    newest, writes = await store.list_read("s:999")
    assert len(newest) == 10 and writes == 10  # the most recent session is whole
    assert (await store.list_read("s:0"))[0] == []  # the oldest went first
    await store.set_many({"k": b"x"}, ttl_s=60)
    await store.set_many({"k": b"y" * 10}, ttl_s=60)  # a rewrite replaces its bytes, not adds them
    assert store.held <= 4 << 20 and await store.get_many(["k"]) == [b"y" * 10]
