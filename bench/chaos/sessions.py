"""Scenario 11: a storm of cancelled requests, then checked ones; the sessions must come out whole and in order."""

from __future__ import annotations

from typing import Any

from bench.chaos.context import SESSION_TURNS, Context, check_sessions, stored_sessions
from bench.chaos.harness import rows, summary, traffic


def cancellation_storm(ctx: Context) -> dict[str, Any]:
    d = ctx.durations
    with ctx.redis() as redis, ctx.service("s11", redis) as service:
        storm, checked = ctx.work / "s11-storm.jsonl", ctx.work / "s11-checked.jsonl"
        # Impatient clients first, then patient ones, which continue the storm's sessions (ids s0, s1, ...
        # in the same order) and so race whatever the storm left in flight. A session gets at most
        # storm_turns + checked_turns messages, fewer than the service keeps, so every turn is checked.
        assert d.storm_turns + d.checked_turns <= SESSION_TURNS
        common = {"clients": 16, "session_share": 1.0, "sessions_per_client": 2, "tag": "s11", "seconds": 3600}
        traffic(
            service.url,
            storm,
            requests=d.storm_cancelled,
            timeout_ms=(5, 30),
            turns_per_session=d.storm_turns,
            **common,
        ).wait()
        traffic(
            service.url,
            checked,
            requests=d.storm_checked,
            seed=1,
            message_offset=100_000,
            turns_per_session=d.checked_turns,
            **common,
        ).wait()
        results = rows(storm) + rows(checked)
        stored = stored_sessions(redis, "chaos-s11")
    figures = {
        "storm": summary(rows(storm)),
        "checked": summary(rows(checked)),
        **check_sessions(results, stored),
    }
    passed = (
        figures["foreign_turns"] == 0
        and figures["lost_turns"] == 0
        and figures["trimmed_unchecked"] == 0
        and figures["out_of_order"] == 0
        and figures["repeats"] == 0
        and figures["checked"]["status_5xx"] == 0
        and figures["turns_checked"] > 0
    )
    return {**figures, "pass": passed}
