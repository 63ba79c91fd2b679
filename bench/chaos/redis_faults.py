"""Scenarios 1-2: Redis killed, and Redis frozen, under load."""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx

from bench.chaos.context import SESSION_TURNS, Context, check_sessions, stored_sessions
from bench.chaos.harness import rows, summary, traffic, wait_for


def redis_killed(ctx: Context) -> dict[str, Any]:
    d = ctx.durations
    with ctx.redis() as redis, ctx.service("s1", redis) as service:
        out = ctx.work / "s1.jsonl"
        # Sessions are retired after SESSION_TURNS messages, within what the service keeps: every turn is checkable.
        load = traffic(
            service.url, out, seconds=d.redis_kill_load, clients=8, turns_per_session=SESSION_TURNS, tag="s1"
        )
        time.sleep(d.redis_kill_at)
        redis.kill()
        time.sleep(d.redis_down)
        redis.start()
        restarted = time.time()

        def working_again() -> bool:
            """A session turn written now is read back: sessions (and so the cache) work."""
            probe = f"probe-{time.monotonic_ns()}"
            body = {"session_id": probe, "message": f"[{probe} m0] hello"}
            if httpx.post(f"{service.url}/reply", json=body, timeout=5).status_code != 200:
                return False
            return bool(redis.client().exists(f"session:{probe}"))

        recovered_s = wait_for(working_again, 30, 0.1)
        load.wait()
        results = rows(out)
        sessions = check_sessions(
            [r for r in results if r.get("session", "").startswith("chaos-s1")],
            stored_sessions(redis, "chaos-s1"),
            after=restarted + recovered_s,
        )
    figures = summary(results)
    figures.update(recovered_after_restart_s=round(recovered_s, 2), sessions_after_recovery=sessions)
    correct = (
        figures["status_5xx"] == 0
        and figures["share_200"] >= 0.99
        and sessions["lost_turns"] == 0
        and sessions["trimmed_unchecked"] == 0
        and sessions["turns_checked"] > 0
    )
    timely = figures["p99_ms"] < 300 and recovered_s <= 5
    return {**figures, "latency_bars_met": timely, "pass": ctx.verdict(correct, timely)}


def redis_frozen(ctx: Context) -> dict[str, Any]:
    d = ctx.durations
    with ctx.redis() as redis, ctx.service("s2", redis) as service:
        out = ctx.work / "s2.jsonl"
        load = traffic(service.url, out, seconds=d.redis_pause + 10, clients=8, tag="s2")
        live: list[float] = []
        stop = threading.Event()

        def probe_liveness() -> None:
            with httpx.Client(base_url=service.url, timeout=5) as client:
                while not stop.is_set():
                    started = time.perf_counter()
                    client.get("/livez")
                    live.append((time.perf_counter() - started) * 1000)
                    time.sleep(0.1)

        prober = threading.Thread(target=probe_liveness)
        time.sleep(3)
        prober.start()
        redis.pause()  # SIGSTOP: connections stay open, nothing answers
        time.sleep(d.redis_pause)
        redis.resume()
        load.wait()
        stop.set()
        prober.join()
    figures = summary(rows(out))
    figures.update(livez_max_ms=round(max(live), 1), livez_probes=len(live))
    passed = figures["status_5xx"] == 0 and figures["max_ms"] <= 600 and figures["livez_max_ms"] < 100
    return {**figures, "pass": passed}
