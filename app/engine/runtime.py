"""Everything a request needs, loaded once at startup.

The default encoder's model (the bundle and what it carries) loads first;
each candidate set (`sets.py`) pairs a model with one of its index versions.
A set's encoder is the bundle its versions were built with: any shipped
bundle (`Settings.encoders_dir`), named on an upload, loaded the first time a
set uses it. A deployment that brings its own candidates starts with the
default model alone, not ready, and its first upload builds the first version.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import faiss
from threadpoolctl import threadpool_limits

from app.config import Settings
from app.engine.cache import EmbeddingCache
from app.engine.compute import ComputePool
from app.engine.encoding import EncoderQueue, encoder_queue
from app.engine.kernels import choose_lone_session
from app.engine.kv import Guarded, open_store
from app.engine.priority import SERVING, in_lowered_thread
from app.engine.sessions import SessionStore
from app.engine.sets import (
    DEFAULT_SET,
    CandidateSet,
    NoSuchSet,
    NotReady,
    indexes_root,
    names_on_volume,
    on_volume,
)
from app.engine.stats import Stages
from core import filters
from core.bundle import (
    BundleError,
    BundleManifest,
    JoinedWay,
    Thresholds,
    open_bundle,
    read_manifest,
    shipped_bundles,
)
from core.confidence import WARMUP_TURNS, ConfidenceModel, ShareThreshold, threshold_for_share
from core.context import Combiner
from core.encoder import Encoder
from core.mood import reply_moods
from core.reactions import ReactionClassifier
from core.reranker import PolyReranker
from core.retriever import Serving
from core.store import IndexStore, IndexVersion

log = logging.getLogger(__name__)

# A query-similarity threshold no cosine reaches (rounding can put one a hair
# over 1), and finite, so /info's JSON can carry it: query similarity is off.
QUERY_SIMILARITY_OFF = 1.01


class UnknownEncoder(LookupError):
    """An upload named an encoder this service does not ship (404, as a set that does not exist)."""

    def __init__(self, name: str, known: list[str]) -> None:
        super().__init__(f"no encoder {name[:64]!r}: one of {', '.join(known)}")
        self.field = "encoder"


@dataclass
class Runtime:
    settings: Settings
    kv: Guarded
    cache: EmbeddingCache
    sessions: SessionStore
    pool: ComputePool
    encoder_queue: EncoderQueue
    stages: Stages  # seconds per stage of each request, for /metrics
    model: Model | None = None  # the default encoder's
    # Every model's reaction classifier, when the service has a reaction model (`load_reaction_model`).
    reaction_model: ReactionClassifier | None = None
    problem: str | None = None  # why the model is None, for /readyz
    # encoder name -> bundle directory: what a set may name (`Settings.encoders_dir`, and the default).
    encoders: dict[str, Path] = field(default_factory=dict)
    # encoder name -> its loaded model, the default's included. Loaded when a set first needs it;
    # replaced as a whole, as `sets` is.
    models: dict[str, Model] = field(default_factory=dict)
    models_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    # name -> set. Replaced as a whole when a set comes or goes (`add_set`, `drop_set`), so a
    # reader iterating it never sees it change under it.
    sets: dict[str, CandidateSet] = field(default_factory=dict)
    # Held while a set is added or dropped: the admin threads and the follower both add sets. Re-entrant:
    # a delete holds it across moving the set's directory away and dropping the set (`Admin.delete`).
    sets_lock: threading.RLock = field(default_factory=threading.RLock, repr=False)

    @property
    def default(self) -> CandidateSet:
        return self.sets[DEFAULT_SET]

    def candidate_set(self, name: str) -> CandidateSet:
        found = self.sets.get(name)
        if found is None:
            raise NoSuchSet(name)
        return found

    def current(self, name: str = DEFAULT_SET) -> Serving:
        """The serving snapshot of set `name`: a request's, start to end."""
        if self.model is None:
            raise NotReady(self.problem or "still loading")
        return self.candidate_set(name).current()

    def current_model(self) -> Model:
        if self.model is None:
            raise NotReady(self.problem or "still loading")
        return self.model

    @property
    def default_encoder(self) -> str:
        return self.settings.bundle_dir.name

    def model_by_name(self, name: str) -> Model:
        """The shipped bundle `name`, loaded on first use (off the event loop: it reads and checks
        ~40 MB). Raises UnknownEncoder."""
        loaded = self.models.get(name)
        if loaded is not None:
            return loaded
        if name not in self.encoders:
            raise UnknownEncoder(name, sorted(self.encoders))
        with self.models_lock:
            if name not in self.models:
                model = load_model(self.settings, self.encoders[name], self.reaction_model)
                self.models = {**self.models, name: model}
                log.info("loaded encoder %s for the sets that name it", name)
            return self.models[name]

    def model_by_checksum(self, checksum: str) -> Model:
        """The shipped bundle whose checksum is `checksum`: what a version built with it is searched with."""
        for model in self.models.values():
            if model.bundle.checksum == checksum:
                return model
        for name, path in self.encoders.items():
            if read_manifest(path).checksum == checksum:
                return self.model_by_name(name)
        raise ValueError(f"built with another model ({checksum[:12]}), one this service does not ship")

    def model_to_build(self, candidates: CandidateSet, encoder: str | None = None) -> Model:
        """The model a build of the set encodes with: shipped bundle `encoder` if named, else the
        model of what the set serves, else (a set that serves nothing yet) the default's."""
        if encoder:
            return self.model_by_name(encoder)
        serving = candidates.serving
        return self.current_model() if serving is None else self.model_by_checksum(serving.bundle.checksum)

    def load_version(self, candidates: CandidateSet, version: str) -> Serving:
        """An index version of a set with the model it was built with. The version's manifest is
        read before any of its FAISS files; the filters the set served recently are readied on it
        (called off the event loop: reindex, rollback, follower)."""
        self.current_model()  # not before the default has loaded
        model = self.model_by_checksum(candidates.store.manifest(version).bundle_checksum)
        loaded = candidates.store.load(version)
        if candidates.serving is not None:
            filters.warm(loaded, candidates.serving.index)
        return serve(model, loaded, self.settings)

    def add_set(self, name: str) -> CandidateSet:
        """The set `name`, made known to this replica if it was not (nothing served until a version is)."""
        with self.sets_lock:
            if name not in self.sets:
                added = CandidateSet(name, IndexStore(indexes_root(self.settings.artifacts_dir, name)))
                added.problem = f"set {name!r} has no index version yet: upload candidates to it"
                self.sets = {**self.sets, name: added}
            return self.sets[name]

    def add_set_on_volume(self, name: str) -> CandidateSet | None:
        """As `add_set`, only while the set's directory exists, checked under the lock a delete holds:
        a listing read before a delete never brings the deleted set back."""
        with self.sets_lock:
            return self.add_set(name) if on_volume(self.settings.artifacts_dir, name) else None

    def drop_set(self, name: str) -> None:
        with self.sets_lock:
            self.sets = {k: v for k, v in self.sets.items() if k != name}

    def load_set(self, name: str) -> CandidateSet:
        """Adds the set and serves the version its pointer names, with the encoder it was built with;
        if that encoder is not shipped, its newest version built with the default encoder."""
        candidates = self.add_set(name)
        model = self.current_model()
        version = candidates.store.current()
        if version is not None:
            try:
                self.model_by_checksum(candidates.store.manifest(version).bundle_checksum)
            except ValueError:
                version = None
        version = version or candidates.store.latest_for(model.bundle.checksum)
        if version is None:
            if name == DEFAULT_SET:
                candidates.problem = str(no_index(model.bundle))
            return candidates
        started = time.perf_counter()
        candidates.swap(self.load_version(candidates, version), f"loaded in {time.perf_counter() - started:.1f}s")
        return candidates

    async def close(self) -> None:
        await self.encoder_queue.close()
        self.pool.close()
        await self.cache.flush()
        await self.kv.close()
        await self.cache.store.close()


@dataclass(frozen=True)
class Model:
    """A loaded bundle: what serving needs of it besides an index."""

    bundle: BundleManifest
    bundle_dir: Path
    encoder: Encoder
    reranker: PolyReranker | None
    reactions: ReactionClassifier | None
    confidence: ConfidenceModel | None
    # The way contexts become vectors, and the calibration fitted that way: the combiner's
    # (per turn) where the bundle has one, unless Settings.joined_context.
    combiner: Combiner | None = None
    thresholds: Thresholds = field(default_factory=Thresholds)
    calibration: dict[str, Any] = field(default_factory=dict)  # how `thresholds` were fitted; {}: never


def load_reaction_model(settings: Settings) -> ReactionClassifier | None:
    """The reaction model's classifier, reading turns with its own encoder; None where the settings
    name none. Loaded once: every encoder's model shares it."""
    folder = settings.reactions_dir
    if folder is None:
        return None
    return in_lowered_thread(lambda: ReactionClassifier.reading(folder, settings.ort_intra_op_threads), SERVING)


def own_reactions(bundle_dir: Path, bundle: BundleManifest, encoder: Encoder) -> ReactionClassifier | None:
    """The bundle's own reaction head over its context vectors, if it has one."""
    return ReactionClassifier.load(bundle_dir, bundle.reactions, encoder) if bundle.reactions is not None else None


def load_model(
    settings: Settings, bundle_dir: Path | None = None, reaction_model: ReactionClassifier | None = None
) -> Model:
    """The bundle at `bundle_dir` (default: the default encoder's) with what serving needs of it.
    `reaction_model` (`load_reaction_model`) answers its reactions in place of the bundle's own head."""
    bundle_dir = bundle_dir or settings.bundle_dir
    bundle = open_bundle(bundle_dir)  # a bundle whose files do not match its manifest stops here
    # Made in a lowered thread, so the sessions' own threads start below the event loop (priority.py).
    encoder = in_lowered_thread(
        lambda: Encoder(bundle_dir, bundle, settings.ort_intra_op_threads, settings.ort_spin), SERVING
    )
    if settings.ort_spin_alone and not settings.ort_spin:
        spinning = in_lowered_thread(lambda: encoder.sibling(settings.ort_intra_op_threads, spin=True), SERVING)
        encoder.alone_choice = choose_lone_session(encoder, spinning)
    if bundle.poly is not None and not encoder.has_poly:
        raise BundleError(f"bundle {bundle.name}: the manifest names a poly head the encoder graph lacks")
    combiner, thresholds, confidence, calibration = (
        encoder.combiner,
        bundle.thresholds,
        bundle.confidence,
        bundle.calibration,
    )
    if combiner is not None and settings.joined_context:
        joined = bundle.joined or JoinedWay()  # without its own: uncalibrated, as a bundle never calibrated
        combiner, thresholds, confidence, calibration = None, joined.thresholds, joined.confidence, joined.calibration
    return Model(
        bundle=bundle,
        bundle_dir=bundle_dir,
        encoder=encoder,
        reranker=PolyReranker(bundle.poly) if bundle.poly is not None else None,
        reactions=reaction_model if reaction_model is not None else own_reactions(bundle_dir, bundle, encoder),
        confidence=ConfidenceModel(confidence) if confidence is not None else None,
        combiner=combiner,
        thresholds=thresholds,
        calibration=calibration,
    )


def serve(model: Model, index: IndexVersion, settings: Settings) -> Serving:
    """The model with an index version, and the thresholds the pair gets.

    Vectors from one model are never searched with another."""
    if index.manifest.bundle_checksum != model.bundle.checksum:
        raise ValueError(f"index {index.version} was built with another model ({index.manifest.bundle_checksum[:12]})")
    thresholds = model.thresholds
    if not model.calibration:
        # Never calibrated (no held-out data of its own, e.g. the multilingual bundle): query
        # similarity answers only for a last turn closer to a stored query than 99% of stored
        # queries are to their nearest neighbour.
        # With fewer than two stored queries there is no such figure, and the untrained default
        # would let one stored query answer nearly every turn: query similarity is off.
        p99 = index.manifest.profile.get("query_neighbour_p99", QUERY_SIMILARITY_OFF)
        thresholds = replace(thresholds, query_similarity=p99)
    share = None
    if model.confidence is not None and model.reactions is not None:
        # The product setting: this share of turns, the least confident, goes to reactions.
        thresholds = replace(thresholds, reply_matching=model.confidence.threshold_for_share(settings.reaction_share))
        if settings.reaction_share_window:
            window = settings.reaction_share_window
            # Where that share lies depends on the candidates: until this version's own turns say
            # it, its stored replies do (index/confidence_quantiles.py). A version built before them starts
            # from the validation turns'.
            stored = index.manifest.confidence_quantiles
            start = threshold_for_share(stored, settings.reaction_share) if stored else thresholds.reply_matching
            share = ShareThreshold(settings.reaction_share, start, window, min(WARMUP_TURNS, window))
    valence = model.reactions.valence if model.reactions is not None else None
    if valence is not None and index.reply_moods is None:
        index.reply_moods = reply_moods(index, valence)
    return Serving(
        model.bundle,
        model.bundle_dir,
        model.encoder,
        index,
        thresholds,
        model.reranker,
        model.reactions,
        model.confidence,
        share,
        model.combiner,
    )


def no_index(bundle: BundleManifest) -> NotReady:
    return NotReady(
        f"no index version built with bundle {bundle.name} yet: run `make index`, "
        "or upload candidates (POST /admin/candidates)"
    )


def load_newest_serving(settings: Settings, store: IndexStore) -> Serving:
    """The configured bundle with the newest index version built with it."""
    started = time.perf_counter()
    model = load_model(settings, reaction_model=load_reaction_model(settings))
    version = store.latest_for(model.bundle.checksum)
    if version is None:
        raise no_index(model.bundle)
    serving = serve(model, store.load(version), settings)
    log.info("loaded bundle %s and index %s in %.1fs", model.bundle.name, version, time.perf_counter() - started)
    return serving


def limit_cpu_threads(settings: Settings) -> None:
    """onnxruntime owns the cores. The numpy work here (rerank, reaction
    classifier) is a few small matmuls, and OpenBLAS threads left spinning
    after one steal the CPU from the next encoder run: measured, a 0.3 ms
    rerank took 30 ms and the encoder 7.3 ms instead of 2.8 ms."""
    faiss.omp_set_num_threads(settings.faiss_threads)
    threadpool_limits(limits=1, user_api="blas")
    # The tokenizer's thread pool, likewise: for a request's two texts it costs more than it
    # saves (measured: 390 us a request with it, 200 us without). Read at its first use, so
    # before any text is tokenised; an operator's own setting wins.
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def build_runtime(settings: Settings) -> Runtime:
    """The model and every set on the volume, each serving its newest version built with the model."""
    limit_cpu_threads(settings)
    kv = open_store(
        settings.redis_url,
        settings.redis_timeout_ms,
        settings.redis_retry_after_s,
        settings.session_local_entries,
        settings.session_local_mb << 20,
        settings.redis_max_connections,
        settings.redis_pool_wait_ms,
    )
    # A guard of its own: a cache Redis that is full or gone bypasses the cache, never the sessions.
    # Without Redis the cache is its in-process LRU alone, so the store's size does not matter.
    cache_kv = open_store(
        settings.cache_redis_url or settings.redis_url,
        settings.redis_timeout_ms,
        settings.redis_retry_after_s,
        1,
        max_connections=settings.redis_max_connections,
        pool_wait_ms=settings.redis_pool_wait_ms,
    )
    stages = Stages()
    runtime = Runtime(
        settings=settings,
        kv=kv,
        cache=EmbeddingCache(
            cache_kv, settings.cache_local_entries, settings.cache_ttl_s, local_bytes=settings.cache_local_mb << 20
        ),
        sessions=SessionStore.for_settings(kv, settings),
        pool=ComputePool(settings.max_pending, workers=settings.search_threads, faiss_threads=settings.faiss_threads),
        encoder_queue=encoder_queue(
            settings.batch_max_tokens, settings.batch_max_wait_ms, settings.max_pending, stages
        ),
        stages=stages,
    )
    runtime.add_set(DEFAULT_SET)
    runtime.encoders = {**shipped_bundles(settings.encoders_dir), runtime.default_encoder: settings.bundle_dir}
    try:
        runtime.reaction_model = load_reaction_model(settings)
        runtime.model = load_model(settings, reaction_model=runtime.reaction_model)
        runtime.models = {runtime.default_encoder: runtime.model}
    except (NotReady, FileNotFoundError, ValueError) as error:
        runtime.problem = str(error)
        log.error("not ready: %s", error)
        return runtime
    for name in names_on_volume(settings.artifacts_dir) or [DEFAULT_SET]:
        try:
            runtime.load_set(name)
        except Exception as error:  # an unreadable version (a corrupt .faiss, a cut gzip) fails its set alone
            runtime.add_set(name).problem = f"{type(error).__name__}: {error}"
            log.error("set %s: not ready: %s: %s", name, type(error).__name__, error)
    return runtime
