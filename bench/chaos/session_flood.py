"""Scenario 29: a flood of new anonymous session ids against a state Redis run with
docker-compose.yml's own settings (its maxmemory and policy, read from the file).

Each new session id keeps its turns for an hour in a Redis that never evicts:
unbounded, one client would fill compose's 1 GiB, after which every write
fails, and admin, jobs and the lock answer 503. The service stores at most
CHITCHAT_SESSION_MAX_COUNT sessions of at most CHITCHAT_SESSION_MAX_BYTES
each, and refuses a new one with 429 past the count.
The scenario runs the service with a count small enough for the flood to
reach within the window, and checks the other bars: the sessions under way
lose no turn and are never refused, admin and the reindex lock still work,
nothing is 5xx, and the others' p99 beside the flood holds against their p99
beside the same turns when they store nothing: sent as plain contexts while
the sessions fill up, refused at once (422) once they are at their bound. It
also reports what a flooded session costs Redis, and what the default bounds
come to against compose's maxmemory (the bar: within half of it).

The flood runs in a process of its own (this module's `main`), as scenario 24's
attack does (bench/chaos/attackers.py): its requests' cost is the service's.

    python -m bench.chaos.session_flood --url URL --kind sessions --threads 4 --out flood.jsonl
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import httpx
import yaml

from app.config import Settings
from app.engine.sessions import INDEX_KEY
from bench.chaos.context import Context, check_sessions, stored_sessions
from bench.chaos.harness import ROOT, RedisServer, Service, rows, spawn_client, summary, traffic, wait_for
from bench.chaos.replicas import fresh_candidates, submit

# Sessions the service stores in this scenario, per second of a load window: about what the flood opens
# in two windows on 2 cores (it opened ~45 a second beside the load), so they fill up while the others'
# load runs, and the flood reaches the bound soon after.
BOUND_PER_LOAD_S = 100
FLOODERS = 4
# The others' p99 beside new sessions, against their p99 beside the same turns that store nothing: sent
# as plain contexts while the sessions fill up, refused at once (422) once they are at their bound.
# What storing, then refusing, new sessions adds, apart from what four more clients cost two cores.
P99_RATIO_BAR = 1.5
# Each load client's sessions, per second of a load window. The service keeps SESSION_ENTRIES entries (50
# turns) of a session: too few sessions and a fast machine's ~1,700 session turns trim some unchecked.
SESSIONS_PER_LOAD_S = 4
HANGUL = "가나다라마바사아자차카타파하거너더러머버서어저처커터퍼허"


def message(n: int) -> str:
    """A turn at its 1,000-character limit, all Hangul (three bytes a syllable stored; six escaped,
    as before), and unlike every other one, so none is a cache hit."""
    prefix = f"{n} "
    return prefix + "".join(HANGUL[(i * 7 + n) % len(HANGUL)] for i in range(1000 - len(prefix)))


def compose_redis_args(compose: Path = ROOT / "docker-compose.yml") -> list[str]:
    """The state Redis's own flags in docker-compose.yml (maxmemory, policy, persistence)."""
    command = yaml.safe_load(compose.read_text())["services"]["redis"]["command"]
    assert command[0] == "redis-server", command
    return [str(arg) for arg in command[1:]]


def flooder(url: str, kind: str, seed: int, stop: threading.Event, out: IO[str], lock: threading.Lock) -> None:
    n = seed * 1_000_000
    with httpx.Client(timeout=30) as client:
        while not stop.is_set():
            n += 1
            body: dict[str, Any] = (
                {"context": [message(n)]}
                if kind == "contexts"
                else {"session_id": f"flood-{uuid.uuid4().hex}", "message": message(n)}
            )
            if kind == "refused":
                body["k"] = 0  # 422 once the body is read: refused at once, nothing stored
            started = time.perf_counter()
            try:
                response = client.post(f"{url}/reply", json=body)
                status: int | str = response.status_code
                refused_session = status == 429 and "session" in response.text
            except httpx.HTTPError as error:
                status, refused_session = type(error).__name__, False
            row = {"status": status, "latency_ms": round((time.perf_counter() - started) * 1000, 2)}
            row["refused_session"] = refused_session
            with lock:
                out.write(json.dumps(row) + "\n")
                out.flush()  # the harness reads the first line as "the flood is under way"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", required=True)
    parser.add_argument("--kind", choices=["sessions", "contexts", "refused"], required=True)
    parser.add_argument("--threads", type=int, default=FLOODERS)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    stop, lock = threading.Event(), threading.Lock()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with args.out.open("w") as out:
        threads = [
            threading.Thread(target=flooder, args=(args.url, args.kind, i + 1, stop, out, lock))
            for i in range(args.threads)
        ]
        for t in threads:
            t.start()
        while not stop.wait(0.2):
            pass
        for t in threads:
            t.join()


def _flood(url: str, out: Path, kind: str) -> Any:
    command = [sys.executable, "-m", "bench.chaos.session_flood", "--url", url, "--kind", kind, "--out", str(out)]
    return spawn_client(command)


def _sessions_per_client(ctx: Context) -> int:
    return SESSIONS_PER_LOAD_S * int(ctx.durations.admission_load)


def _load(ctx: Context, service: Service, out: Path, offset: int) -> Any:
    """4 clients, half their requests to sessions of their own that every phase continues (the message
    numbers go on from `offset`). The sessions all open before the first phase (`_open_sessions`), and
    each gets ~8 messages over the six phases on 2 cores (1,078 in 128 sessions, quick), far fewer than
    the 50 turns the service keeps, so every turn is checked, on a machine several times as fast too."""
    return traffic(
        service.url,
        out,
        seconds=ctx.durations.admission_load,
        clients=4,
        sessions_per_client=_sessions_per_client(ctx),
        session_share=0.5,
        tag="s29",
        message_offset=offset,
        seed=offset,  # plain contexts of their own in each phase: none a cache hit from one before
    )


def _open_sessions(ctx: Context, service: Service, out: Path) -> Any:
    """One message to each of the load's sessions, before any flood: every one is under way when the
    bound fills. Left to the load, a slow machine's first phase can miss a few (a client's first
    messages go one to each, but half its requests are plain contexts), and a session whose first
    message comes at the bound is new, so its 429 would be the bound working, not a session pushed out."""
    sessions = _sessions_per_client(ctx)
    return traffic(
        service.url,
        out,
        seconds=300,
        requests=4 * sessions,
        clients=4,
        sessions_per_client=sessions,
        session_share=1.0,
        tag="s29",
        message_offset=0,
    )


def _beside(
    ctx: Context, service: Service, name: str, kind: str, offset: int, then: Callable[[Path], Any] | None = None
) -> tuple[Path, Path, Any]:
    """The others' load beside a flood of `kind`, from its first answer on: (their rows, the flood's, and
    what `then` returned, run with the flood still on once the load is over)."""
    flood, load = ctx.work / f"s29-{name}-flood.jsonl", ctx.work / f"s29-{name}.jsonl"
    process = _flood(service.url, flood, kind)
    try:
        wait_for(lambda: flood.is_file() and flood.stat().st_size > 0, 60)
        _load(ctx, service, load, offset).wait()
        after = then(flood) if then else None
    finally:
        process.terminate()
        process.wait(60)
    return load, flood, after


def _ratio(during: dict[str, Any], before: dict[str, Any]) -> float:
    return round(float(during["p99_ms"]) / max(float(before["p99_ms"]), 1e-3), 2)


def _is_5xx(row: dict[str, Any]) -> bool:
    return isinstance(row["status"], int) and row["status"] >= 500


def _statuses(flood: list[dict[str, Any]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for r in flood:
        key = "429 session" if r.get("refused_session") else str(r["status"])
        counts[key] = counts.get(key, 0) + 1
    return counts


def _redis_figures(redis: RedisServer) -> dict[str, Any]:
    """What the flooded sessions cost: each one's keys (its turns and its write count) and its place in
    the index, as Redis counts them; and what the default bounds come to at that cost."""
    client = redis.client()
    flooded = [k for _, k in zip(range(100), client.scan_iter("session:flood-*", count=1000), strict=False)]
    held = int(client.zcard(INDEX_KEY))
    per_key = [int(client.memory_usage(k) or 0) + int(client.memory_usage(b"writes:" + k) or 0) for k in flooded]
    turn_bytes = [sum(len(t) for t in client.lrange(k, 0, -1)) for k in flooded]
    index_each = int(client.memory_usage(INDEX_KEY) or 0) / max(held, 1)
    per_session = sum(per_key) / max(len(per_key), 1) + index_each
    overhead = per_session - sum(turn_bytes) / max(len(turn_bytes), 1)
    defaults = Settings.model_fields
    count, cap = int(defaults["session_max_count"].default), int(defaults["session_max_bytes"].default)
    memory = client.info("memory")
    # redis-py's CLIENT SETINFO on each new connection is an ERR on Redis 7.0; OOM is what a full one says.
    errors = client.info("errorstats")
    return {
        "sessions_held": held,
        "flooded_session_bytes": round(per_session),  # one turn at its limit and its reply, keys and index
        "flooded_turn_bytes": round(sum(turn_bytes) / max(len(turn_bytes), 1)),
        "used_memory_mb": round(int(memory["used_memory"]) / 2**20, 1),
        "maxmemory_mb": round(int(memory["maxmemory"]) / 2**20, 1),
        "maxmemory_policy": memory["maxmemory_policy"],
        "oom_errors": int(errors.get("errorstat_OOM", {}).get("count", 0)),
        # Every session at its byte bound, at the default count: all sessions may ever take.
        "default_bound_mb": round(count * (cap + overhead) / 2**20, 1),
    }


def _service_figures(service: Service) -> dict[str, float]:
    """The service's own count of the sessions it refused, and of the Redis calls it gave up on: a turn
    answered while Redis is bypassed is not stored, nor counted against the bound (a 200 at the bound)."""
    wanted = {
        'chitchat_refused_total{queue="sessions"}': "sessions_refused",
        "chitchat_redis_bypass_seconds_total": "redis_bypass_s",
    }
    found: dict[str, float] = {}
    for line in httpx.get(f"{service.url}/metrics", timeout=10).text.splitlines():
        name, _, value = line.rpartition(" ")
        if name in wanted:
            found[wanted[name]] = float(value)
    return found


def _refused(flood: Path) -> bool:
    return b'"refused_session": true' in flood.read_bytes()


def new_session_flood(ctx: Context) -> dict[str, Any]:
    """The others' load alone; beside 4 clients sending 1,000-character Korean turns as plain contexts;
    beside the same turns each opening a new session, while the sessions fill up to BOUND; beside the
    same turns refused at once (422); beside new sessions refused at the bound; and alone again. Admin
    and a reindex job run at the bound with the flood on. The others' sessions open first and run throughout."""
    workdir = ctx.work / "s29-redis"
    workdir.mkdir(parents=True, exist_ok=True)
    args = compose_redis_args()
    bound = int(BOUND_PER_LOAD_S * ctx.durations.admission_load)
    loads: dict[str, Path] = {}
    floods: dict[str, Path] = {}
    with (
        ctx.redis(*args, "--dir", str(workdir)) as redis,
        ctx.service("s29", redis, CHITCHAT_SESSION_MAX_COUNT=str(bound)) as service,
    ):
        loads["open"] = ctx.work / "s29-open.jsonl"
        _open_sessions(ctx, service, loads["open"]).wait()
        loads["alone"] = ctx.work / "s29-alone.jsonl"
        _load(ctx, service, loads["alone"], 1_000).wait()
        loads["contexts"], floods["contexts"], _ = _beside(ctx, service, "contexts", "contexts", 10_000)
        loads["filling"], floods["filling"], filled_s = _beside(
            ctx, service, "filling", "sessions", 20_000, lambda flood: wait_for(lambda: _refused(flood), 300, 0.2)
        )
        filled_s += ctx.durations.admission_load  # the wait began after the load

        def admin(_: Path) -> tuple[int, dict[str, Any]]:
            jobs = service.admin("GET", "/admin/jobs").status_code
            return jobs, service.wait_job(submit(service, fresh_candidates("s29", 20))["job_id"], timeout_s=300)

        loads["refused"], floods["refused"], _ = _beside(ctx, service, "refused", "refused", 30_000)
        loads["at_bound"], floods["at_bound"], (jobs, job) = _beside(
            ctx, service, "at-bound", "sessions", 40_000, admin
        )
        loads["after"] = ctx.work / "s29-after.jsonl"
        _load(ctx, service, loads["after"], 50_000).wait()
        figures_redis = _redis_figures(redis) | _service_figures(service)
        results = [r for path in loads.values() for r in rows(path)]
        stored = stored_sessions(redis, "chaos-s29")
    filling = rows(floods["filling"])
    figures: dict[str, Any] = {
        "redis": " ".join(args),
        "bound": bound,
        # from the flood's first answer to its first refusal (the load's window, then the wait)
        "filled_s": round(filled_s, 1),
        **{name: summary(rows(path)) for name, path in loads.items()},
        "flood_statuses": {name: _statuses(rows(path)) for name, path in floods.items()},
        "flood_5xx": sum(_is_5xx(r) for path in floods.values() for r in rows(path)),
        "admin_jobs": jobs,
        "upload_job": job["state"],
        **figures_redis,
        **check_sessions(results, stored),
    }
    # A session under way refused as new: one the flood pushed out.
    figures["active_refused"] = sum(r.get("status") == 429 and "session" in r.get("error", "") for r in results)
    figures["p99_ratio_filling"] = _ratio(figures["filling"], figures["contexts"])
    figures["p99_ratio_at_bound"] = _ratio(figures["at_bound"], figures["refused"])
    checks = {
        "no_5xx": all(figures[name]["status_5xx"] == 0 for name in loads) and figures["flood_5xx"] == 0,
        "bound_reached": any(r.get("refused_session") for r in filling),
        "bound_held": figures["sessions_held"] <= bound,
        "none_under_way_refused": figures["active_refused"] == 0,
        "no_turn_lost": figures["lost_turns"] == figures["foreign_turns"] == figures["out_of_order"] == 0,
        "every_turn_checked": figures["trimmed_unchecked"] == 0 and figures["turns_checked"] > 0,
        "admin_works": figures["admin_jobs"] == 200 and figures["upload_job"] == "succeeded",
        "no_oom": figures["oom_errors"] == 0,
        "default_bound_fits": figures["default_bound_mb"] < figures["maxmemory_mb"] / 2,
    }
    figures["failed_checks"] = [name for name, ok in checks.items() if not ok]
    correct = all(checks.values())
    timely = max(figures["p99_ratio_filling"], figures["p99_ratio_at_bound"]) <= P99_RATIO_BAR
    return {**figures, "latency_bars_met": timely, "pass": ctx.verdict(correct, timely)}


if __name__ == "__main__":
    main()
