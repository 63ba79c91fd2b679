"""Embedding cache: an in-process LRU in front of the shared store.

Keys pin the model checksum, so vectors from one bundle are never served for
another, and the normalised text, so "Hi  there" and "Hi there" share one.
"Hi" and "hi" share one only for a model whose tokenizer lower-cases: a cased
one (XLM-R, the multilingual bundle) sees two different inputs.

Only what is likely to be asked again is shared. Most texts are one-offs: a
conversation never repeats its joined turns, and what people do repeat is
short ("hi", "lol", "what about you?"). Writing every vector to Redis cost
the event loop more than any other step (bench/profile.py), and looking
every text up there put a round trip on each request's path for a hit rate
under 1%. So a text longer than SHARED_MAX_CHARS stays in the process (its
key says so, "local:..."), and a short one goes to the shared store when this
process is asked for it a second time (a local hit, or a miss after
eviction). `python -m bench.cache_policy` measures both policies on replayed
conversations. Shared writes leave the request's path: they run as tasks of
their own.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections import OrderedDict

import numpy as np

from app.engine.kv import Guarded
from core.text import normalize

log = logging.getLogger(__name__)

# Shared-store writes in flight. Past it a write is skipped and counted: a
# Redis slower than the traffic must not grow a queue of vectors in memory.
MAX_PENDING_WRITES = 64
# In 27,335 replayed requests of held-out human conversations, every text
# asked for more than once was at most 37 characters long (bench.cache_policy).
SHARED_MAX_CHARS = 40
LOCAL_ONLY = "local:"  # the prefix of a key the shared store never sees
# Keys asked for once and not shared yet, at least this many kept (or the local
# LRU's size, if larger): a text asked again within that many others is shared.
MIN_ASKED_ONCE = 16_384


class EmbeddingCache:
    def __init__(
        self,
        store: Guarded,
        local_entries: int,
        ttl_s: int,
        lowercase: bool = False,
        local_bytes: int = 64 << 20,
    ) -> None:
        self.store = store
        self.lowercase = lowercase  # for keys whose model is not named (`key`'s lowercase)
        self.local_entries = local_entries
        # Entries differ 16-fold in size (a context vector: 1.5 kB; its poly vectors, m = 16: 24 kB),
        # so a count alone does not bound memory: 20,000 entries could hold about 490 MB.
        self.local_bytes = local_bytes
        self.ttl_s = ttl_s
        self._local: OrderedDict[str, np.ndarray] = OrderedDict()
        self._held = 0  # bytes of the vectors in _local
        self.hits = 0
        self.misses = 0
        self.skipped_writes = 0  # shared-store writes dropped at MAX_PENDING_WRITES
        self.shared_writes = 0  # vectors sent to the shared store
        self.shared_reads = 0  # lookups that waited for the shared store
        self._writes: set[asyncio.Task[None]] = set()
        # Keys this process was asked for once, oldest first: not in the shared store (by us).
        self._asked_once: OrderedDict[str, None] = OrderedDict()
        self._asked_once_max = max(MIN_ASKED_ONCE, local_entries)

    def key(self, model_checksum: str, kind: str, text: str, lowercase: bool | None = None) -> str:
        """kind: what the vector is ("context", "reply", "poly"): one text has several.
        lowercase: whether the model's tokenizer lower-cases (`Encoder.lowercases`; default
        `self.lowercase`), so "Hi" and "hi" share a key. A text longer than SHARED_MAX_CHARS gets
        a LOCAL_ONLY key."""
        normalized = normalize(text, self.lowercase if lowercase is None else lowercase)
        digest = hashlib.blake2b(normalized.encode(), digest_size=16).hexdigest()
        scope = "emb:" if len(normalized) <= SHARED_MAX_CHARS else LOCAL_ONLY
        return f"{scope}{model_checksum[:16]}:{kind}:{digest}"

    async def get_many(self, keys: list[str], sizes: int | list[int], shared: bool = True) -> list[np.ndarray | None]:
        """Each hit is a float32 vector of its key's size (one size for all, or one per key).

        shared=False: only what this process keeps, for vectors `put_many` never shares."""
        expected = [sizes] * len(keys) if isinstance(sizes, int) else sizes
        found: list[np.ndarray | None] = [self._local.get(k) for k in keys]
        if shared:  # a local hit of a text asked once before: asked again, so worth sharing
            again = {k: v for k, v in zip(keys, found, strict=True) if v is not None and k in self._asked_once}
            for k in again:
                del self._asked_once[k]
            self._share_in_background(again)
        remote = [i for i, v in enumerate(found) if v is None and not keys[i].startswith(LOCAL_ONLY)]
        if remote and shared and self.store.status != "disabled":
            self.shared_reads += 1
            values = await self.store.get_many([keys[i] for i in remote])
            for i, raw in zip(remote, values, strict=True):
                if raw is not None and len(raw) == 4 * expected[i]:
                    found[i] = np.frombuffer(raw, dtype=np.float32)
                    self._remember(keys[i], found[i])
        for k in keys:
            if k in self._local:
                self._local.move_to_end(k)
        hits = sum(v is not None for v in found)
        self.hits += hits
        self.misses += len(keys) - hits
        return found

    async def put_many(self, items: dict[str, np.ndarray], share: bool = True) -> None:
        """Keeps freshly encoded vectors here. With `share`, those whose text was asked for
        before (and evicted since) go to the shared store in the background; the others wait
        for a second ask (`get_many`)."""
        for key, vector in items.items():
            self._remember(key, vector)
        if not share or self.store.status == "disabled":  # no shared store to count asks for
            return
        again = {}
        for key, vector in items.items():
            if key.startswith(LOCAL_ONLY):
                continue
            if key in self._asked_once:
                self._asked_once.pop(key, None)
                again[key] = vector
            else:
                self._asked_once[key] = None
        while len(self._asked_once) > self._asked_once_max:
            self._asked_once.popitem(last=False)
        self._share_in_background(again)

    def _share_in_background(self, items: dict[str, np.ndarray]) -> None:
        if not items or self.store.status == "disabled":
            return
        if len(self._writes) >= MAX_PENDING_WRITES:
            self.skipped_writes += 1
            return
        self.shared_writes += len(items)
        payload = {k: v.astype(np.float32).tobytes() for k, v in items.items()}
        task = asyncio.get_running_loop().create_task(self._share(payload))
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    async def _share(self, payload: dict[str, bytes]) -> None:
        try:
            await self.store.set_many(payload, self.ttl_s)  # Guarded: a Redis failure is counted, not raised
        except Exception:
            log.exception("embedding cache write failed")

    async def flush(self) -> None:
        """Waits for the shared-store writes in flight (shutdown, tests)."""
        while self._writes:
            await asyncio.gather(*self._writes, return_exceptions=True)

    def _remember(self, key: str, vector: np.ndarray | None) -> None:
        if vector is None or self.local_entries == 0:
            return
        previous = self._local.pop(key, None)
        self._held -= previous.nbytes if previous is not None else 0
        # A copy: the encoder's vectors are views into their whole batch's output (a poly
        # batch is up to ~1.5 MB), which a view would keep alive beyond what `_held` counts.
        self._local[key] = vector = np.array(vector, dtype=np.float32)
        self._held += vector.nbytes
        while len(self._local) > self.local_entries or (self._held > self.local_bytes and len(self._local) > 1):
            _, evicted = self._local.popitem(last=False)
            self._held -= evicted.nbytes

    @property
    def local_size(self) -> tuple[int, int]:
        """(entries, bytes) held in process."""
        return len(self._local), self._held
