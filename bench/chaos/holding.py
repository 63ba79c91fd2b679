"""Scenarios 27-28: sockets that hold the service without asking it for work, beside clients that do.

27: 48 sockets each send a `/reply`'s headers and one byte of its body, and wait. Were a request
counted before its body is in, with no deadline, they would hold all 32 in-flight slots and every
other `/reply` and `/similar` would be 429 until they closed: a request counts once its body is in,
and a body has CHITCHAT_BODY_READ_TIMEOUT_S to arrive.

28: 400 sockets on `/readyz` for 20 s, while a session sends 40 turns. Were every call to ping
Redis, the pool would run out of connections, the guard would take that for Redis failing, and
turns would be answered 200 and not stored: /readyz pings once at a time and a busy pool is waited
for.

Both run the others' load alone first, then beside the holders (bench/chaos/holders.py, a process of
its own at nice 19, as 23's attacker: its own CPU is not the service's), in one service on one Redis.
The bars are the suite's: 0 5xx, every session turn answered 200 stored, and the others' p99 beside
the holders within P99_RATIO_BAR of their own alone in the same run.

At nice 19 on 2 shared cores the flood gets what the others leave. Unpaced, the loop would answer
thousands of probes a second and nothing else: a connection that probes again within a second
waits its turn (app/probes.py), and the flood gets ~100 answers a second.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from app.config import Settings
from bench.chaos.context import SESSION_TURNS, Context, check_sessions, stored_sessions
from bench.chaos.harness import ROOT, Service, rows, summary, traffic, wait_for

IDLE_BODIES = 48  # more than the default in-flight limit (32)
FLOOD_CONNECTIONS = 400
FLOOD_S = 20.0
SESSION_MESSAGES = 40
HOLDER_NICE = 19
P99_RATIO_BAR = 2.0  # as 23's: the others and the holders' client share the service's two cores
# The body deadline as the service runs it: no CHITCHAT_ variable of the suite reaches a service.
BODY_DEADLINE_S = float(Settings.model_fields["body_read_timeout_s"].default)
LATE_S = 2.0  # a 408 may come this long after the deadline: the loop's lag under the others' load


def holders(
    service: Service, out: Path, kind: str, connections: int, seconds: float | None = None
) -> subprocess.Popen[bytes]:
    """`bench.chaos.holders` in a session of its own (see harness.spawn_client), at HOLDER_NICE."""
    command = [sys.executable, "-m", "bench.chaos.holders", "--url", service.url, "--out", str(out), "--kind", kind]
    command += ["--connections", str(connections), "--nice", str(HOLDER_NICE)]
    command += ["--seconds", str(seconds)] if seconds is not None else []
    return subprocess.Popen(command, cwd=ROOT, start_new_session=True)


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def _connected(path: Path) -> bool:
    return any(r.get("event") == "connected" for r in _lines(path))


def _ratio(during: dict[str, Any], alone: dict[str, Any]) -> float:
    return round(float(during["p99_ms"]) / max(float(alone["p99_ms"]), 1e-3), 2)


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def idle_bodies(ctx: Context) -> dict[str, Any]:
    """27: the others' /reply (half of them session turns) alone, then beside 48 idle bodies for at
    least the body deadline and a bit: every other request is answered 200 and every turn stored,
    and each idle body gets 408 at its deadline, without ever holding an in-flight slot."""
    window = max(ctx.durations.admission_load, BODY_DEADLINE_S + LATE_S)
    common = {"clients": 4, "turns_per_session": SESSION_TURNS}
    with ctx.redis() as redis, ctx.service("s27", redis) as service:
        alone = ctx.work / "s27-alone.jsonl"
        traffic(service.url, alone, seconds=ctx.durations.admission_load, tag="s27a", **common).wait()
        idle, beside = ctx.work / "s27-idle.jsonl", ctx.work / "s27-beside.jsonl"
        holder = holders(service, idle, "idle-bodies", IDLE_BODIES)
        try:
            wait_for(lambda: _connected(idle), 30)
            load = traffic(service.url, beside, seconds=window, tag="s27b", **common)
            in_flight = []
            while load.poll() is None:
                in_flight.append(service.metric("chitchat_in_flight"))
                time.sleep(0.5)
            # Every idle body answered once, at its deadline counted from its byte (or never: the figures say).
            with contextlib.suppress(TimeoutError):
                wait_for(lambda: sum(r.get("status") == 408 for r in _lines(idle)) >= IDLE_BODIES, BODY_DEADLINE_S + 5)
        finally:
            _stop(holder)
        results = rows(alone) + rows(beside)
        sessions = check_sessions(results, stored_sessions(redis, "chaos-s27"))
    answers = [r for r in _lines(idle) if "status" in r]
    statuses: dict[str, int] = {}
    for r in answers:
        statuses[str(r["status"])] = statuses.get(str(r["status"]), 0) + 1
    timed_out = [r["seconds"] for r in answers if r["status"] == 408]
    figures: dict[str, Any] = {
        "index": ctx.index_label(),
        "alone": summary(rows(alone)),
        "beside_idle_bodies": summary(rows(beside)),
        "idle_bodies": IDLE_BODIES,
        "idle_answers": statuses,
        "idle_408_after_s": [min(timed_out, default=None), max(timed_out, default=None)],
        "body_deadline_s": BODY_DEADLINE_S,
        "in_flight_max": max(in_flight, default=None),
        "sessions": sessions,
    }
    figures["p99_ratio"] = _ratio(figures["beside_idle_bodies"], figures["alone"])
    during = figures["beside_idle_bodies"]
    correct = (
        figures["alone"]["status_5xx"] == during["status_5xx"] == 0
        and during["requests"] > 0
        and during["ok_200"] == during["requests"]  # none refused: the idle bodies hold no slot
        and sessions["lost_turns"] == 0
        and sessions["trimmed_unchecked"] == 0
        and sessions["turns_checked"] > 0
        and set(statuses) == {"408"}
        and len(timed_out) >= IDLE_BODIES
        and all(BODY_DEADLINE_S - 0.5 <= s <= BODY_DEADLINE_S + LATE_S for s in timed_out)
    )
    timely = figures["p99_ratio"] <= P99_RATIO_BAR
    return {**figures, "latency_bars_met": timely, "pass": ctx.verdict(correct, timely)}


def readyz_flood(ctx: Context) -> dict[str, Any]:
    """28: the others' /reply alone, then a 20 s /readyz flood from 400 sockets while one session
    sends 40 turns and the others keep on: no /readyz says Redis is down (it is up throughout), every
    turn answered is stored, 0 5xx."""
    with ctx.redis() as redis, ctx.service("s28", redis) as service:
        alone = ctx.work / "s28-alone.jsonl"
        common = {"clients": 4, "turns_per_session": SESSION_TURNS}
        traffic(service.url, alone, seconds=ctx.durations.admission_load, tag="s28a", **common).wait()
        flood_out = ctx.work / "s28-readyz.jsonl"
        flood = holders(service, flood_out, "readyz", FLOOD_CONNECTIONS, FLOOD_S)
        session, beside = ctx.work / "s28-session.jsonl", ctx.work / "s28-beside.jsonl"
        try:
            wait_for(lambda: _connected(flood_out), 30)
            flooding_from = time.time()
            turns = traffic(
                service.url,
                session,
                requests=SESSION_MESSAGES,
                clients=1,
                session_share=1.0,
                sessions_per_client=1,
                turns_per_session=SESSION_MESSAGES,
                seconds=600,
                tag="s28s",
            )
            load = traffic(
                service.url, beside, seconds=min(ctx.durations.admission_load, FLOOD_S - 2), tag="s28b", **common
            )
            turns.wait()
            load.wait()
            flood.wait(FLOOD_S + 60)
        finally:
            _stop(flood)
        pinged_directly = bool(redis.client().ping())
        session_rows = rows(session)
        the_session = check_sessions(session_rows, stored_sessions(redis, "chaos-s28s"))
        sessions = check_sessions(rows(alone) + rows(beside) + session_rows, stored_sessions(redis, "chaos-s28"))
    report = next((r for r in _lines(flood_out) if r.get("event") == "summary"), {})
    flood_ends = flooding_from + FLOOD_S
    figures: dict[str, Any] = {
        "index": ctx.index_label(),
        "alone": summary(rows(alone)),
        "beside_flood": summary(rows(beside)),
        "session": summary(session_rows),
        "session_turns_in_flood": sum(r["t"] < flood_ends for r in session_rows),
        "the_session": the_session,
        "sessions": sessions,
        "readyz": {k: v for k, v in report.items() if k != "event"},
        "redis_ping_after": pinged_directly,
    }
    figures["p99_ratio"] = _ratio(figures["beside_flood"], figures["alone"])
    said = report.get("redis", {})
    correct = (
        bool(report)
        and report.get("requests", 0) > 0
        and said.get("down", 0) == 0
        and set(report.get("statuses", {})) == {"200"}
        and figures["session"]["ok_200"] == SESSION_MESSAGES
        and the_session["turns_checked"] == SESSION_MESSAGES
        and the_session["lost_turns"] == sessions["lost_turns"] == 0
        and sessions["trimmed_unchecked"] == 0
        and figures["session"]["status_5xx"] == figures["beside_flood"]["status_5xx"] == 0
        and figures["alone"]["status_5xx"] == 0
    )
    timely = figures["p99_ratio"] <= P99_RATIO_BAR
    return {**figures, "latency_bars_met": timely, "pass": ctx.verdict(correct, timely)}
