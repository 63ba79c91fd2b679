"""The one settings class. Every variable reads from CHITCHAT_<NAME>."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from core.bundle import RELEASE_BUNDLE, RELEASE_REACTIONS, RELEASE_ROOT


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CHITCHAT_", env_file=".env", extra="ignore")

    # Index versions, the candidate store and jobs; trained bundles land here too.
    artifacts_dir: Path = Path("artifacts")
    # The default encoder: the bundle of every set that names none. Another bundle (a fresh
    # `make train`, say) becomes the default by pointing this at its directory.
    bundle_dir: Path = RELEASE_BUNDLE
    # The bundles a set may name as its encoder (`?encoder=` on its first upload), each a
    # directory here, named by it; the default encoder is always one of them, by its own name.
    encoders_dir: Path = RELEASE_ROOT
    # The reaction model: an encoder of its own, tuned to read a turn's mood, whose classifier
    # answers every set's low-confidence turns from the last turn (docs/reactions.md). None
    # (CHITCHAT_REACTIONS_DIR=""): each encoder's own head over its context vectors.
    reactions_dir: Path | None = RELEASE_REACTIONS

    # Unset: in-process session store and cache, the single-machine default. Sessions, the
    # candidate store, jobs and the reindex lock live here: an instance that never evicts.
    redis_url: str | None = None
    # The embedding cache's Redis: an instance with a maxmemory and an LRU eviction policy
    # (docker-compose.yml runs both). Unset: the cache shares redis_url, which then must
    # have the room for it, since state must never be evicted to make some.
    cache_redis_url: str | None = None
    # Every Redis call gives up after this, and the failure bypasses Redis, sessions
    # included. On a busy event loop the timer also counts the loop's own lag: at 50 ms
    # a healthy Redis times out under the chaos suite's cancellation storm, and the bypass loses
    # session turns. A frozen Redis costs one request this much per bypass window.
    redis_timeout_ms: int = Field(default=250, ge=1, le=5000)
    # After a Redis failure that survived a reconnect, skip Redis for this long
    # instead of paying the timeout per call; then try it again.
    redis_retry_after_s: float = Field(default=2.0, ge=0.1, le=600)
    # Connections each Redis client's pool opens at most. With all in use, a call waits up to
    # redis_pool_wait_ms for one to come back: a busy pool is not a dead Redis, and is never
    # bypassed. Past the wait a cache call is a miss, and a session turn is 429, not stored.
    redis_max_connections: int = Field(default=100, ge=1, le=10_000)
    redis_pool_wait_ms: int = Field(default=1000, ge=1, le=60_000)
    # /readyz pings Redis at most this often, one ping at a time; the calls in between (a load
    # balancer's probes, or a flood of them) get the last answer. 0: every call waits for a ping
    # of its own, still one at a time.
    readyz_redis_cache_s: float = Field(default=1.0, ge=0.0, le=60.0)
    # Answers a second shared by the connections that probe (/livez, /healthz, /readyz) more than once
    # a second; the rest wait their turn (app/probes.py). A load balancer probing once a second or less
    # per connection never waits. 100: a flood of them costs the loop ~2% of a core, which answers
    # some thousands of probes a second.
    probe_rate_per_s: float = Field(default=100.0, gt=0.0, le=100_000.0)

    session_ttl_s: int = Field(default=3600, ge=1)
    # Sessions the in-process store keeps without Redis; past it a new one is refused (429).
    session_local_entries: int = Field(default=100_000, ge=1)
    # ... and no new one once they hold this many MiB: sessions are open to anyone, and turns may be long.
    session_local_mb: int = Field(default=128, ge=1, le=65_536)
    # Turns kept per session (user and bot turns both count).
    session_max_turns: int = Field(default=10, ge=1, le=100)
    # A session never gets any of the bot's last N replies again.
    session_no_repeat: int = Field(default=5, ge=0, le=50)
    # Sessions stored at once: in Redis, every replica's together; without it, this process's (and no
    # more than session_local_entries). At it a new session id is refused with 429 until a stored one
    # expires (session_ttl_s after its last turn); the sessions stored keep every turn.
    session_max_count: int = Field(default=20_000, ge=1)
    # Bytes of turns one session keeps (compact UTF-8 JSON: ~3 a Hangul syllable); past it its oldest
    # turns go first, as past session_max_turns. At least a 1,000-character turn and its reply, at
    # their longest. With session_max_count, what sessions may take of the state Redis: 20,000 x
    # 16 KiB, ~330 MiB with their keys, of docker-compose.yml's 1 GiB.
    session_max_bytes: int = Field(default=16_384, ge=12_288, le=1 << 20)

    # In-process LRU in front of Redis: the hottest chat turns are few.
    cache_local_entries: int = Field(default=20_000, ge=0)
    # ... and at most this many MiB of vectors (a context's poly vectors are 24 kB).
    cache_local_mb: int = Field(default=64, ge=1, le=65_536)
    cache_ttl_s: int = Field(default=86_400, ge=1)

    # 0 = one thread per core. The encoder runs one batch at a time, so all
    # cores go to one batch's matrix multiplications.
    ort_intra_op_threads: int = Field(default=0, ge=0, le=64)
    # Whether onnxruntime's pool threads spin between the ops of a run instead
    # of sleeping; they stop when the run returns either way. On: a lone query
    # skips ~100 thread wake-ups, a few ms less at low traffic. Off: at
    # saturation the event loop and searches keep those cycles, and the service
    # serves more requests/s (`python -m bench.load --spin`; docs/experiments.md).
    ort_spin: bool = False
    # With ort_spin off, a batch of one request (low traffic) may run on a second session
    # that spins within a run, faster for one context on some CPUs and not on others
    # (docs/experiments.md), while batches of several keep sleeping threads. At load both
    # are timed on this CPU and the faster serves lone requests (/info says which).
    # Costs a second copy of the encoder's session in memory.
    ort_spin_alone: bool = True
    # A single-query HNSW search is too small to gain from OpenMP threads.
    faiss_threads: int = Field(default=1, ge=1, le=64)
    # Searches and reranks run in this many threads (FAISS releases the GIL).
    search_threads: int = Field(default=2, ge=1, le=64)
    # Requests waiting for the encoder (or for a search) beyond this get 429 rather than a long queue.
    max_pending: int = Field(default=64, ge=1)
    # Requests on /reply and /similar at once, beyond which a new one gets 429 before its
    # body is read. Each sends one job to the encoder queue, so at max_pending the queue's
    # own refusal, which comes only after the body is parsed, is left as a backstop. 32: an admitted
    # request queues behind the others, and under the chaos flood of the in-flight limit on 2 cores
    # the slowest stays within the scenario's bar (none over 5 s) at 32 and not at 64
    # (docs/experiments.md).
    max_in_flight: int = Field(default=32, ge=1)
    # A request body (but an admin route's) must have arrived whole this long after the request
    # began to be read, or the answer is 408 and the connection closes: a request is counted
    # against max_in_flight only once its body is in, so without a deadline a slow body held a
    # socket and its buffer for good. docker/nginx.conf's client_body_timeout is the same figure.
    body_read_timeout_s: float = Field(default=10.0, gt=0.0, le=600.0)
    # Request bodies (but admin ones, which admin_max_bodies_in_flight bounds) being read at once;
    # past it a request is 429, its body unread. Bounds what slow clients hold: each at most its
    # route's limit (1.5 MB for /similar) for at most body_read_timeout_s.
    max_bodies_reading: int = Field(default=128, ge=1, le=100_000)
    # Encoder batches: at most this many tokens, and an idle server waits at most
    # this long for other requests to join (`bench.load` measures the trade).
    batch_max_tokens: int = Field(default=4096, ge=64)
    batch_max_wait_ms: float = Field(default=0.0, ge=0.0, le=100.0)

    # Share of turns, the least confident by the bundle's confidence model,
    # answered with a reaction rather than a retrieved reply. A product call:
    # a retrieved reply that is off topic misleads, a reaction only stalls.
    reaction_share: float = Field(default=0.10, ge=0.0, le=1.0)
    # ... held over the last this-many reply-matching turns of an index version, since a
    # threshold fitted on chitchat holds that share on chitchat only (a set of 1k
    # uploaded replies scores lower: more turns would fall below it). 0: the fitted
    # threshold alone. Until 20 turns are in, the threshold the version's own stored replies
    # give decides (`index/confidence_quantiles.py`).
    reaction_share_window: int = Field(default=2000, ge=0, le=1_000_000)

    # Every replica looks this often at the pointer file (indexes/CURRENT) and serves the version it
    # names; a Redis message makes it look at once. A missed message costs at most this long.
    index_poll_s: float = Field(default=2.0, ge=0.1, le=60.0)

    # Serve every bundle the joined way (the window encoded as one text), even one with a combiner,
    # which otherwise serves per turn: each turn encoded once, its vector kept (core/context.py).
    # A bundle so served takes the calibration it has for that way (its manifest's `joined`).
    joined_context: bool = False

    max_body_bytes: int = Field(default=64 * 1024, ge=1024)
    default_k: int = Field(default=5, ge=1, le=50)
    # FAISS hits the poly head rescores (no shipped bundle has one: docs/experiments.md).
    rerank_depth: int = Field(default=50, ge=1, le=200)
    # Whether a request that does not say (`rerank` absent) is reranked by the poly head.
    # Off: a rerank is on by default only if it adds at least a point of R@1 both in
    # domain and out of it, and no head measured so far has (docs/experiments.md, "Poly
    # rerank on by default"); neither shipped bundle has one.
    # Off also spares every request the poly outputs, their cache and the rescoring.
    rerank_by_default: bool = False
    # Query similarity answers only on a near copy of a stored query: its threshold is near 1 (or,
    # as the release's calibration found it worth nothing, above 1). On, the last turn is encoded
    # only when a stored query equals it once normalised, or when a request sets its own query
    # threshold or leaves reply matching out; so most requests encode one text, not two (the last
    # turn is ~30% of the tokens a /reply encodes). On 3,000 held-out contexts no answer changes
    # (reply, source or any candidate): `python -m bench.exact_query`, reports/exact_query.md.
    query_similarity_exact_only: bool = True

    # After SIGTERM the service keeps serving this long with /readyz at 503, so a load
    # balancer takes it out before the listener closes; then it drains (uvicorn's
    # --timeout-graceful-shutdown). A container's stop grace period must cover both.
    shutdown_delay_s: float = Field(default=2.0, ge=0.0, le=60.0)

    log_level: Literal["debug", "info", "warning", "error"] = "info"
    # One JSON line per request (request id, status, duration, strategy, index version).
    access_log: bool = True
    # Debugging only: also log the conversation's text. Off, no text reaches the logs.
    log_text: bool = False

    # Admin routes are disabled unless this is set (an empty value counts as unset).
    admin_token: SecretStr | None = None
    # Candidate uploads: ~100 bytes a record, so 32 MiB holds the 200k-record limit.
    admin_max_body_bytes: int = Field(default=32 * 1024 * 1024, ge=1024)
    # Admin requests with a body being read at once (each up to admin_max_body_bytes); past it, 429.
    admin_max_bodies_in_flight: int = Field(default=2, ge=1, le=64)
    admin_max_records: int = Field(default=200_000, ge=1)
    # Candidate sets (the default one included) and their candidates together. The chitchat set of
    # 96k replies holds 125 MB of FAISS indexes in every replica, so the limits bound its memory.
    max_sets: int = Field(default=16, ge=1, le=1000)
    max_total_candidates: int = Field(default=1_000_000, ge=1)
    # Index builds of every set in this process at once, by estimate (~4.4 kB a candidate: 0.4 GB for
    # the chitchat 96k); a job that does not fit waits, and one larger than this runs alone.
    reindex_memory_mb: int = Field(default=1024, ge=64, le=1 << 20)

    @field_validator("reactions_dir", mode="before")
    @classmethod
    def _empty_is_none(cls, value: object) -> object:
        return None if value == "" else value  # an environment variable cannot say None

    @property
    def bundles_root(self) -> Path:
        return self.artifacts_dir / "bundles"

    @property
    def indexes_root(self) -> Path:
        return self.artifacts_dir / "indexes"


@lru_cache
def get_settings() -> Settings:
    return Settings()
