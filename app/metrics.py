"""Prometheus metrics at /metrics, one registry per app.

HTTP traffic and answers are counted as they happen; everything the engine
keeps (the encoder queue, the cache, Redis, reindex jobs, the serving
version) is read from its plain counters at scrape time, so the engine
imports no metrics library.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import get_args

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, InfoMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from app.engine import describe
from app.engine.cache import EmbeddingCache
from app.engine.kv import Guarded
from app.engine.runtime import Runtime
from app.engine.stats import Buckets
from app.limits import Admission
from app.reindex.set_admin import Admin
from core.retriever import Strategy

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
# The operations app.engine.kv.Guarded counts failures of (tests/test_metrics.py keeps the two in step).
REDIS_OPERATIONS = ("get", "set", "lrange", "rpush", "ping")
REINDEX_OUTCOMES = ("succeeded", "failed")  # a job's final states


def _histogram(name: str, documentation: str, buckets: Buckets) -> HistogramMetricFamily:
    return HistogramMetricFamily(name, documentation, buckets=buckets.cumulative(), sum_value=buckets.total)


class EngineCollector(Collector):
    """Reads the runtime and the admin side of one app when scraped."""

    def __init__(self, state: Callable[[], tuple[Runtime | None, Admin | None]], admission: Admission) -> None:
        self.state = state  # () -> (runtime or None, admin or None)
        self.admission = admission

    def collect(self) -> Iterator[Metric]:
        runtime, admin = self.state()
        if runtime is None:
            return
        yield from _queues(runtime, self.admission)
        yield from _cache(runtime.cache)
        yield from _redis(runtime.kv)
        yield from _serving(runtime)
        yield from _sets(runtime)
        if admin is not None:
            yield from _jobs(admin)


def _queues(runtime: Runtime, admission: Admission) -> Iterator[Metric]:
    """In flight, the encoder queue and its batches, each stage's seconds, and what each queue refused."""
    queue = runtime.encoder_queue
    yield GaugeMetricFamily(
        "chitchat_in_flight", "Requests on /reply and /similar in flight", value=admission.in_flight
    )
    yield GaugeMetricFamily("chitchat_encoder_queue_depth", "Requests waiting for the encoder", value=queue.pending)
    yield _histogram("chitchat_encoder_batch_requests", "Requests per encoder batch", queue.stats.batch_items)
    yield _histogram("chitchat_encoder_batch_tokens", "Tokens per encoder batch", queue.stats.batch_cost)
    yield _histogram("chitchat_encoder_queue_seconds", "Wait of a batch's oldest request", queue.stats.queue_seconds)
    stages = HistogramMetricFamily(
        "chitchat_stage_seconds",
        "Seconds in each stage of a request; encode is per encoder batch, which may hold several requests",
        labels=["stage"],
    )
    waits = {"queue_wait": queue.stats.request_wait_seconds}
    for stage, buckets in {**runtime.stages.buckets, **waits}.items():
        stages.add_metric([stage], buckets.cumulative(), sum_value=buckets.total)
    yield stages
    refused = CounterMetricFamily(
        "chitchat_refused", "Requests refused with 429, by the queue that was full", labels=["queue"]
    )
    refused.add_metric(["in_flight"], admission.refused)  # before the body was read
    refused.add_metric(["encoder"], queue.stats.refused)
    refused.add_metric(["search"], runtime.pool.refused)
    refused.add_metric(["sessions"], runtime.sessions.refused)  # a new session at CHITCHAT_SESSION_MAX_COUNT
    yield refused
    yield CounterMetricFamily(
        "chitchat_encoder_cancelled", "Jobs dropped: their caller left", value=queue.stats.cancelled
    )
    # Unpadded, every batch's: what the per-turn way saves shows here (a kept turn is not encoded again).
    yield CounterMetricFamily(
        "chitchat_encoder_tokens",
        "Tokens the request path's encoder batches read, unpadded",
        value=int(queue.stats.batch_cost.total),
    )


def _cache(cache: EmbeddingCache) -> Iterator[Metric]:
    yield CounterMetricFamily("chitchat_cache_hits", "Embedding cache hits", value=cache.hits)
    yield CounterMetricFamily("chitchat_cache_misses", "Embedding cache misses", value=cache.misses)
    yield CounterMetricFamily(
        "chitchat_cache_shared_writes",
        "Vectors written to the shared cache: those asked for a second time",
        value=cache.shared_writes,
    )
    yield CounterMetricFamily(
        "chitchat_cache_skipped_writes",
        "Shared-cache writes skipped: too many already in flight",
        value=cache.skipped_writes,
    )
    yield GaugeMetricFamily(
        "chitchat_cache_local_bytes", "Bytes of vectors in the in-process cache", value=cache.local_size[1]
    )


def _redis(kv: Guarded) -> Iterator[Metric]:
    redis_up = GaugeMetricFamily("chitchat_redis_up", "1 up, 0 bypassed after a failure, -1 not configured")
    redis_up.add_metric([], {"up": 1, "down": 0, "disabled": -1}[kv.status])
    yield redis_up
    errors = CounterMetricFamily(
        "chitchat_redis_errors", "Redis failures that survived a reconnect", labels=["operation"]
    )
    for operation in sorted({*REDIS_OPERATIONS, *kv.errors_by_op}):
        errors.add_metric([operation], kv.errors_by_op.get(operation, 0))
    yield errors
    yield CounterMetricFamily("chitchat_redis_bypass_seconds", "Time Redis was bypassed", value=kv.bypass_seconds)
    yield CounterMetricFamily("chitchat_redis_skipped_calls", "Calls skipped while bypassed", value=kv.skipped_calls)


def _serving(runtime: Runtime) -> Iterator[Metric]:
    """The bundle and the default set's index version being served, and its stored texts."""
    serving = runtime.default.serving if runtime.sets else None
    if serving is None:
        return
    info = InfoMetricFamily("chitchat_serving", "The bundle and the default set's index version being served")
    info.add_metric(
        [],
        {
            "bundle": serving.bundle.name,
            "bundle_checksum": serving.bundle.checksum[:16],
            "index_version": serving.index_version,
            "release": str(serving.bundle.release.get("released_at", "")),
        },
    )
    yield info
    candidates = GaugeMetricFamily(
        "chitchat_index_entries", "Stored texts in the default set's served index", labels=["kind"]
    )
    candidates.add_metric(["replies"], serving.index.manifest.replies)
    candidates.add_metric(["queries"], serving.index.manifest.queries)
    yield candidates


def _jobs(admin: Admin) -> Iterator[Metric]:
    jobs = CounterMetricFamily(
        "chitchat_reindex_jobs", "Reindex jobs finished, every set's, by outcome", labels=["outcome"]
    )
    for outcome in sorted({*REINDEX_OUTCOMES, *admin.outcomes}):
        jobs.add_metric([outcome], admin.outcomes.get(outcome, 0))
    yield jobs
    yield _histogram("chitchat_reindex_seconds", "Reindex jobs, submit to done", admin.durations)


def _sets(runtime: Runtime) -> Iterator[Metric]:
    """Per candidate set: its stored texts and the memory its indexes hold."""
    entries = GaugeMetricFamily("chitchat_set_entries", "Stored texts in a set's served index", labels=["set", "kind"])
    memory = GaugeMetricFamily(
        "chitchat_set_index_bytes", "Bytes of a set's served FAISS indexes (held in memory)", labels=["set"]
    )
    for name, candidates in runtime.sets.items():
        if candidates.serving is None:
            continue
        manifest = candidates.serving.index.manifest
        entries.add_metric([name, "replies"], manifest.replies)
        entries.add_metric([name, "queries"], manifest.queries)
        entries.add_metric([name, "reactions"], len(candidates.serving.index.reaction_ids))
        size = describe.index_bytes(candidates)
        if size is not None:
            memory.add_metric([name], size)
    yield entries
    yield memory


class Metrics:
    def __init__(self, state: Callable[[], tuple[Runtime | None, Admin | None]], admission: Admission) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "chitchat_http_requests", "HTTP requests", ["route", "method", "status"], registry=self.registry
        )
        self.latency = Histogram(
            "chitchat_http_request_seconds",
            "HTTP request latency",
            ["route", "status"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self._series: dict[tuple[str, str, int], tuple[Counter, Histogram]] = {}  # observe()'s, by its labels
        self.answers = Counter(
            "chitchat_answers", "Replies by the strategy that answered", ["source"], registry=self.registry
        )
        # Every source from the start, at 0: a series born at its first answer hides that answer from rate().
        for source in get_args(Strategy):
            self.answers.labels(source)
        self.probes_paced = Counter(
            "chitchat_probes_paced",
            "Health probes that waited their turn: their connection had probed within the last second",
            registry=self.registry,
        )
        self.registry.register(EngineCollector(state, admission))

    def observe(self, route: str, method: str, status: int, seconds: float) -> None:
        # labels() costs several µs a call (a lock, the values checked and joined); under a flood every
        # refusal pays it twice. The series are few (route templates x httptools' methods x statuses).
        series = self._series.get((route, method, status))
        if series is None:
            series = self.requests.labels(route, method, str(status)), self.latency.labels(route, str(status))
            self._series[route, method, status] = series
        series[0].inc()
        series[1].observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
