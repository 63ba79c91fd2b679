"""What every scenario gets: where to work, how long to run, a Redis and a
fresh service (or the one shared by scenarios that leave it as they found it),
and how to read the sessions the service stored."""

from __future__ import annotations

import itertools
import json
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.chaos.harness import RedisServer, Service, chaos_artifacts

# Entries a session keeps in the chaos runs (user and bot turns both count; the
# setting's maximum): 50 user turns. Load that checks sessions retires each
# session well before that (`SESSION_TURNS`), so no turn it sent is trimmed and
# every one can be checked; `check_sessions` still tells trimmed from lost.
SESSION_ENTRIES = 100
SESSION_TURNS = 45
# ... and bytes of them (the setting's maximum), so that no long turn trims one the check must see.
SESSION_BYTES = 1 << 20


@dataclass(frozen=True)
class Durations:
    """Seconds (or requests) each timed scenario runs; `QUICK` is the CI subset's."""

    redis_kill_load: float = 60
    redis_kill_at: float = 20
    redis_down: float = 20
    redis_pause: float = 10
    reindex_window: float = 120
    storm_cancelled: int = 1000
    storm_checked: int = 10_000
    storm_turns: int = 10  # a session's messages in the storm ...
    checked_turns: int = 35  # ... and in the checked run: 45 at most, within SESSION_TURNS
    steady_one: float = 10
    steady: float = 20
    overload: float = 15
    schema_fuzz: float = 60
    # The full soak is 10 minutes with a reindex every 2 minutes; that does not fit in
    # the suite's 15 with the rest, so the default is shorter (--soak-minutes 10 for the full one).
    soak: float = 180
    replica_upload: int = 20_000  # scenario 16's new candidates: a job long enough to start a replica into
    maxmemory_load: float = 60  # scenario 20's window
    encoders_load: float = 30  # scenario 22's load, once on one process and once on three replicas
    admission_load: float = 20  # 23's and 24's load, alone and then attacked; 25's and 26's is 3x this

    @property
    def soak_reindex_every(self) -> float:
        """Every 2 minutes, as in the full soak, or a quarter of a shorter soak (3 reindexes)."""
        return min(120.0, self.soak / 4)


QUICK = Durations(
    redis_kill_load=30,
    redis_kill_at=8,
    redis_down=8,
    reindex_window=45,
    storm_cancelled=300,
    storm_checked=1500,
    storm_turns=5,
    checked_turns=40,
    steady_one=5,
    steady=10,
    overload=8,
    schema_fuzz=20,
    soak=60,
    replica_upload=10_000,
    maxmemory_load=20,
    encoders_load=10,
    admission_load=8,
)


@dataclass
class Context:
    work: Path  # scratch space for this run
    full: Path | None  # the artifacts dir holding the release bundle's full index, if there is one
    sample: Path | None  # an artifacts dir holding a sampled index (`__main__.sample_artifacts`), if built
    checksum: str  # the served bundle's
    durations: Durations
    labels: dict[str, str] = field(default_factory=dict)  # "full"/"sample" -> what that index is, for the report
    on_sample: bool = False  # set per scenario: which index its services serve
    # Where scenario 22's services find the encoders a set may name (CHITCHAT_ENCODERS_DIR): the
    # services never inherit the suite's own CHITCHAT_ variables. None: the service's default.
    encoders_dir: Path | None = None
    # Whether a missed latency bar fails a scenario. `--correctness-only` (CI, on a machine it shares)
    # turns that off: 5xx, lost, foreign or out-of-order turns and wrong versions still fail, and each
    # row says whether its latency bars were met, beside the figures.
    latency_bars: bool = True
    _shared: tuple[RedisServer, Service] | None = None

    def verdict(self, correct: bool, timely: bool) -> bool:
        return correct and (timely or not self.latency_bars)

    def source(self, sampled: bool | None = None) -> tuple[Path, str]:
        """The artifacts dir a service gets, and its label; the sample when asked for or when it is all there is."""
        want_sample = self.on_sample if sampled is None else sampled
        kind = "sample" if (want_sample and self.sample) or self.full is None else "full"
        source = self.sample if kind == "sample" else self.full
        assert source is not None
        return source, kind

    def index_label(self, sampled: bool | None = None) -> str:
        return self.labels[self.source(sampled)[1]]

    def artifacts(self, name: str, sampled: bool | None = None) -> Path:
        return chaos_artifacts(self.source(sampled)[0], self.work / name / "artifacts", self.checksum)

    def make_service(self, name: str, redis: RedisServer | None, sampled: bool | None = None, **env: str) -> Service:
        """Not started. Sessions keep SESSION_ENTRIES entries, so the suite can check what it sent."""
        return Service(
            self.artifacts(name, sampled),
            redis.url if redis else None,
            {
                "CHITCHAT_SESSION_MAX_TURNS": str(SESSION_ENTRIES),
                "CHITCHAT_SESSION_MAX_BYTES": str(SESSION_BYTES),
                **env,
            },
        )

    @contextmanager
    def service(
        self, name: str, redis: RedisServer | None, sampled: bool | None = None, **env: str
    ) -> Iterator[Service]:
        """A fresh service on a private copy of the artifacts, stopped and removed afterwards."""
        service = self.make_service(name, redis, sampled, **env)
        try:
            service.start()
            yield service
        finally:
            service.stop()
            shutil.rmtree(self.work / name, ignore_errors=True)

    @contextmanager
    def replicas(
        self, name: str, redis: RedisServer, count: int = 3, sampled: bool | None = None, **env: str
    ) -> Iterator[list[Service]]:
        """`count` services on one Redis and one artifacts folder, as replicas behind a load balancer
        are, each on a port of its own; started together, stopped and removed afterwards."""
        artifacts = self.artifacts(name, sampled)
        settings = {
            "CHITCHAT_SESSION_MAX_TURNS": str(SESSION_ENTRIES),
            "CHITCHAT_SESSION_MAX_BYTES": str(SESSION_BYTES),
            **env,
        }
        services = [Service(artifacts, redis.url, dict(settings)) for _ in range(count)]
        try:
            for service in services:
                service.start(wait=False)
            for service in services:
                service.wait_ready()
            yield services
        finally:
            for service in services:
                service.stop()
            shutil.rmtree(self.work / name, ignore_errors=True)

    def shared(self) -> tuple[RedisServer, Service]:
        """One Redis and one service on the full index, started on first use, for the scenarios that
        inject nothing into them (hostile bodies and ids, bad credentials, steady load): a start saved each."""
        if self._shared is None:
            redis = RedisServer()
            redis.start()
            service = self.make_service("shared", redis, sampled=False)
            try:
                service.start()
            except BaseException:
                service.stop()
                redis.kill()
                raise
            self._shared = (redis, service)
        return self._shared

    def close(self) -> None:
        if self._shared is not None:
            redis, service = self._shared
            service.stop()
            redis.kill()
            self._shared = None

    @contextmanager
    def redis(self, *args: str) -> Iterator[RedisServer]:
        server = RedisServer(*args)
        server.start()
        try:
            yield server
        finally:
            if server.process is not None and server.process.poll() is None:
                server.resume()  # a paused server must be running to die cleanly
            server.kill()


MARKER = re.compile(r"^\[(?P<session>[^\] ]+) m(?P<index>\d+)\]")


@dataclass
class Stored:
    """One session as Redis holds it."""

    turns: list[tuple[str, int]]  # (session marker, message number) of each user turn, in stored order
    entries: int  # list length, user and bot turns: at SESSION_ENTRIES the oldest may have been trimmed


def stored_sessions(redis: RedisServer, prefix: str = "") -> dict[str, Stored]:
    """session id -> what Redis holds for it, for the sessions whose id starts with `prefix`."""
    client = redis.client()
    found: dict[str, Stored] = {}
    for key in client.scan_iter(f"session:{prefix}*"):
        session = key.decode()[len("session:") :]
        raws = client.lrange(key, 0, -1)
        turns = []
        for raw in raws:
            item = json.loads(raw)
            match = MARKER.match(item["text"]) if item["role"] == "user" else None
            if match:
                turns.append((match["session"], int(match["index"])))
        found[session] = Stored(turns, len(raws))
    return found


def check_sessions(results: list[dict[str, Any]], stored: dict[str, Stored], after: float = 0.0) -> dict[str, int]:
    """What the stored sessions say against what the clients were answered (requests started after `after`).

    A turn answered 200 and missing from its session is lost, unless the session is full (SESSION_ENTRIES)
    and the turn is older than its oldest stored one: then the window trimmed it, and it counts as
    `trimmed_unchecked`, a turn the check could not see (the scenarios keep sessions short so that is 0)."""
    answered: dict[str, list[int]] = {}
    cancelled: dict[str, set[int]] = {}
    replies: dict[str, list[tuple[int, str]]] = {}
    for r in results:
        if "session" not in r:
            continue
        if r["status"] == 200:
            replies.setdefault(r["session"], []).append((r["message"], r["reply"]))
            if r["t"] >= after:
                answered.setdefault(r["session"], []).append(r["message"])
        elif r["status"] == "cancelled":
            cancelled.setdefault(r["session"], set()).add(r["message"])
    figures = {
        "sessions": len(answered),
        "turns_checked": 0,
        "foreign_turns": 0,
        "out_of_order": 0,
        "lost_turns": 0,
        "trimmed_unchecked": 0,
        "stored_though_cancelled": 0,
        "repeats": 0,
    }
    for session, held in stored.items():
        figures["foreign_turns"] += sum(marker != session for marker, _ in held.turns)
        numbers = [n for marker, n in held.turns if marker == session]
        figures["out_of_order"] += sum(b <= a for a, b in itertools.pairwise(numbers))  # a repeat counts too
        figures["stored_though_cancelled"] += len(set(numbers) & cancelled.get(session, set()))
    for session, numbers in answered.items():
        held = stored.get(session, Stored([], 0))
        kept = {n for marker, n in held.turns if marker == session}
        oldest = min(kept, default=None)
        for n in numbers:
            if n in kept:
                figures["turns_checked"] += 1
            elif held.entries >= SESSION_ENTRIES and oldest is not None and n < oldest:
                figures["trimmed_unchecked"] += 1
            else:
                figures["turns_checked"] += 1
                figures["lost_turns"] += 1
    for received in replies.values():
        received.sort()
        texts = [text for _, text in received]
        figures["repeats"] += sum(texts[i] in texts[max(0, i - 5) : i] for i in range(len(texts)))
    return figures
