"""Everything a request needs, loaded once at startup.

`Runtime.serving` is the one reference to the current (bundle, index) pair.
Replacing it is a single assignment, so a request that read it keeps its
snapshot to the end while later requests see the new one.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import faiss
from threadpoolctl import threadpool_limits

from app.config import Settings
from app.engine.bundle import ranked_bundles, read_manifest, verify_files
from app.engine.cache import EmbeddingCache
from app.engine.compute import ComputePool
from app.engine.encoder import Encoder
from app.engine.kv import Guarded, open_store
from app.engine.reactions import ReactionClassifier
from app.engine.reranker import PolyReranker
from app.engine.retriever import Serving
from app.engine.sessions import SessionStore
from index.store import IndexStore

log = logging.getLogger(__name__)


class NotReady(Exception):
    pass


@dataclass
class Runtime:
    settings: Settings
    kv: Guarded
    cache: EmbeddingCache
    sessions: SessionStore
    pool: ComputePool
    store: IndexStore
    serving: Serving | None = None
    problem: str | None = None  # why serving is None, for /readyz

    def current(self) -> Serving:
        serving = self.serving
        if serving is None:
            raise NotReady(self.problem or "still loading")
        return serving

    async def close(self) -> None:
        await self.kv.close()


def _pick(settings: Settings, store: IndexStore) -> tuple[Path, str]:
    """The configured bundle, or the best servable one that has an index.

    Vectors from one model are never searched with another: a bundle is
    served only with an index version built with its checksum."""
    candidates = [settings.bundle_dir] if settings.bundle_dir else ranked_bundles(settings.bundles_root)
    if not candidates:
        raise NotReady(f"no model bundle under {settings.bundles_root}; run `make artifacts`")
    for bundle_dir in candidates:
        version = store.latest_for(read_manifest(bundle_dir).checksum)
        if version is not None:
            if bundle_dir != candidates[0]:
                log.warning(
                    "bundle %s has no index; serving %s. Run `make index`.", candidates[0].name, bundle_dir.name
                )
            return bundle_dir, version
    raise NotReady(f"no index version built with bundle {candidates[0].name}; run `make index`")


def load_serving(settings: Settings, store: IndexStore) -> Serving:
    bundle_dir, version = _pick(settings, store)
    bundle = read_manifest(bundle_dir)
    verify_files(bundle_dir, bundle)
    started = time.perf_counter()
    encoder = Encoder(bundle_dir, bundle, intra_op_threads=settings.ort_intra_op_threads)
    index = store.load(version)
    if bundle.poly is not None and not encoder.has_poly:
        raise ValueError(f"bundle {bundle.name}: the manifest names a poly head the encoder graph lacks")
    reranker = PolyReranker(bundle.poly) if bundle.poly is not None else None
    reactions = ReactionClassifier.load(bundle_dir, bundle.reactions) if bundle.reactions is not None else None
    log.info("serving bundle %s with index %s (loaded in %.1fs)", bundle.name, version, time.perf_counter() - started)
    return Serving(bundle, bundle_dir, encoder, index, reranker, reactions)


def limit_cpu_threads(settings: Settings) -> None:
    """onnxruntime owns the cores. The numpy work here (rerank, reaction
    classifier) is a few small matmuls, and OpenBLAS threads left spinning
    after one steal the CPU from the next encoder run: measured, a 0.3 ms
    rerank took 30 ms and the encoder 7.3 ms instead of 2.8 ms."""
    faiss.omp_set_num_threads(settings.faiss_threads)
    threadpool_limits(limits=1, user_api="blas")


def build_runtime(settings: Settings) -> Runtime:
    limit_cpu_threads(settings)
    kv = open_store(
        settings.redis_url, settings.redis_timeout_ms, settings.redis_retry_after_s, settings.cache_local_entries
    )
    store = IndexStore(settings.indexes_root)
    for leftover in store.remove_staging():
        log.warning("removed %s: an index build that did not finish", leftover)
    runtime = Runtime(
        settings=settings,
        kv=kv,
        cache=EmbeddingCache(kv, settings.cache_local_entries, settings.cache_ttl_s),
        sessions=SessionStore(kv, settings.session_max_turns, settings.session_ttl_s),
        pool=ComputePool(settings.max_pending),
        store=store,
    )
    try:
        runtime.serving = load_serving(settings, store)
    except (NotReady, FileNotFoundError, ValueError) as error:
        runtime.problem = str(error)
        log.error("not ready: %s", error)
    return runtime
