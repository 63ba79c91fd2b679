"""Scenarios 23-26: what an unauthenticated caller can cost, and what a failed pointer write or a
rollback leaves behind, under load.

23 and 24 measure `/reply` at a steady load alone, then with the attack beside it, in one service:
the bar is on the others' p99, against their own p99 of the same run. 25 and 26 run three replicas
on one Redis and one artifacts folder, with load on all three throughout.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

from bench.chaos.attackers import rare_candidates
from bench.chaos.context import SESSION_ENTRIES, Context
from bench.chaos.harness import RedisServer, Service, attack, rows, summary, traffic, wait_for
from bench.chaos.replicas import converged, fresh_candidates, pointer, submit
from core.store import IndexStore
from index.candidates import REDIS_KEY, RedisCandidateStore

ATTACKERS = 8
# 23: the others' p99 with the attack beside it, against their own p99 alone, same run. The others' own
# client and the attacker's share the service's two cores, so "holds" is within 2x, not within noise.
P99_RATIO_BAR = 2.0
# 24's attack is `/reply` requests: any four more clients halve what the others get of two cores, so
# against the others alone it reads about 2x whatever the requests carry (1.81x to 2.52x in three
# runs). Item 2 is what `exclude_ids` adds: the bar holds the others' p99 beside the attack against
# their p99 beside the same requests without `exclude_ids`, in the same run.
EXCLUDE_IDS_RATIO_BAR = 1.5
RSS_GROWTH_BAR_MB = 64.0  # one 32 MiB body read whole would show as 32 MiB per attacker in flight
# 23's attacker's own cost (writing 32 MiB bodies) is not the service's: see bench/chaos/attackers.py.
BODIES_NICE = 19
TICKS = os.sysconf("SC_CLK_TCK")


def _under_attack(
    ctx: Context, service: Service, name: str, kind: str, attackers: int, nice: int, control: str | None = None
) -> dict[str, Any]:
    """The others' load alone, then beside `attackers` of the `control` kind if one is named, then
    beside as many of `kind` (bench/chaos/attackers.py), each in a process of its own at `nice`;
    RSS sampled through the attack."""
    seconds = ctx.durations.admission_load
    alone = ctx.work / f"{name}-alone.jsonl"
    cpu = [_cpu(service)]
    traffic(service.url, alone, seconds=seconds, clients=4, tag=f"{name}a").wait()
    cpu.append(_cpu(service))
    figures: dict[str, Any] = {"index": ctx.index_label(), "alone": summary(rows(alone))}
    if control is not None:
        beside, _ = _beside(ctx, service, f"{name}-control", control, attackers, nice)
        figures["beside_control"] = summary(rows(beside))
    rss = [service.status()["rss_kb"]]
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.1):
            rss.append(service.status()["rss_kb"])

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        attacked, attacks_file = _beside(ctx, service, name, kind, attackers, nice, cpu)
    finally:
        stop.set()
        sampler.join()
    during, attacks = summary(rows(attacked)), rows(attacks_file)
    statuses: dict[str, int] = {}
    for a in attacks:
        statuses[str(a["status"])] = statuses.get(str(a["status"]), 0) + 1
    figures.update(attacked=during, p99_ratio=_ratio(during, figures["alone"]))
    if control is not None:
        figures["p99_ratio_to_control"] = _ratio(during, figures["beside_control"])
    return {
        **figures,
        "attack_requests": len(attacks),
        "attack_statuses": statuses,
        "attack_5xx": sum(isinstance(a["status"], int) and a["status"] >= 500 for a in attacks),
        "attack_nice": nice,
        "rss_mb": [round(rss[0] / 1024, 1), round(max(rss) / 1024, 1)],  # before the attack, its peak
        "rss_growth_mb": round((max(rss) - rss[0]) / 1024, 1),
        # CPU seconds a second of the window, alone and attacked: the service's own, the attacker's
        # process's, and the machine's softirq (loopback delivery) and idle time. What the attack costs
        # the service, apart from what the clients on the same two cores cost.
        "service_cpu_s_per_s": [_rate(cpu[0], cpu[1], "service", seconds), _rate(cpu[2], cpu[3], "service", seconds)],
        "cpu_s_per_s": {
            window: {k: _rate(start, end, k, seconds) for k in end}
            for window, start, end in (("alone", cpu[0], cpu[1]), ("attacked", cpu[2], cpu[3]))
        },
    }


def _beside(
    ctx: Context,
    service: Service,
    name: str,
    kind: str,
    attackers: int,
    nice: int,
    cpu: list[dict[str, float]] | None = None,
) -> tuple[Path, Path]:
    """The others' load beside `attackers` of `kind` once they are under way: (its rows, theirs).
    CPU readings (`_cpu`) are appended to `cpu` as the load starts and ends."""
    attacks_file, load = ctx.work / f"{name}-attacks.jsonl", ctx.work / f"{name}-attacked.jsonl"
    attacker = attack(service.url, attacks_file, kind, attackers, nice)
    try:
        wait_for(lambda: attacks_file.is_file() and attacks_file.stat().st_size > 0, 30)  # under way
        if cpu is not None:
            cpu.append(_cpu(service, attacker.pid))
        traffic(service.url, load, seconds=ctx.durations.admission_load, clients=4, tag=f"{name}b").wait()
        if cpu is not None:
            cpu.append(_cpu(service, attacker.pid))
    finally:
        attacker.terminate()
        attacker.wait(60)
    return load, attacks_file


def _ratio(during: dict[str, Any], before: dict[str, Any]) -> float:
    return round(float(during["p99_ms"]) / max(float(before["p99_ms"]), 1e-3), 2)


def _cpu(service: Service, attacker: int | None = None) -> dict[str, float]:
    """CPU seconds so far: the service's process's and the attacker's (user and system, /proc/PID/stat),
    and the whole machine's softirq and idle time (/proc/stat)."""
    assert service.process is not None
    machine = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]  # user nice system idle iowait irq softirq
    return {
        "service": _process_s(service.process.pid),
        "attacker": _process_s(attacker) if attacker is not None else 0.0,
        "softirq": int(machine[6]) / TICKS,
        "idle": int(machine[3]) / TICKS,
    }


def _process_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def _rate(start: dict[str, float], end: dict[str, float], key: str, seconds: float) -> float:
    return round((end[key] - start[key]) / seconds, 2)


def unauthenticated_bodies(ctx: Context) -> dict[str, Any]:
    """Scenario 23: POSTs of 32 MiB admin bodies with no token, 8 at a time without pause. The token is
    checked before any body byte is read, so RSS holds and the others' p99 with it."""
    with ctx.redis() as redis, ctx.service("s23", redis) as service:
        figures = _under_attack(ctx, service, "s23", "admin-bodies", ATTACKERS, BODIES_NICE)
    refused = all(s in ("401", "429") or not s.isdigit() for s in figures["attack_statuses"])
    correct = (
        figures["alone"]["status_5xx"] == figures["attacked"]["status_5xx"] == 0
        and figures["attack_requests"] > 0
        and refused
        and figures["rss_growth_mb"] <= RSS_GROWTH_BAR_MB
    )
    timely = figures["p99_ratio"] <= P99_RATIO_BAR
    return {**figures, "latency_bars_met": timely, "pass": ctx.verdict(correct, timely)}


def fresh_exclude_ids(ctx: Context) -> dict[str, Any]:
    """Scenario 24: `/reply` with a selective filter (200 tagged candidates) and 256 made-up
    `exclude_ids` each time. The filter's copy is keyed on its tags alone, so it is built once,
    and the others' p99 holds beside them as it does beside the same requests without the ids."""
    with ctx.redis() as redis, ctx.service("s24", redis) as service:
        job = service.wait_job(submit(service, rare_candidates())["job_id"], timeout_s=300)
        figures = _under_attack(ctx, service, "s24", "exclude-ids", ATTACKERS // 2, 0, control="filtered")
    figures["tagged_upload"] = job["state"]
    correct = (
        job["state"] == "succeeded"
        and figures["alone"]["status_5xx"] == figures["attacked"]["status_5xx"] == 0
        and figures["attack_5xx"] == 0
        and figures["attack_statuses"].get("200", 0) > 0
    )
    timely = figures["p99_ratio_to_control"] <= EXCLUDE_IDS_RATIO_BAR
    return {**figures, "latency_bars_met": timely, "pass": ctx.verdict(correct, timely)}


def _window(ctx: Context) -> float:
    """How long the load runs beside 25's and 26's steps: it ends on its own (its rows are written at
    the end), after the steps in a run that goes as expected; a longer run has steps without load."""
    return 3 * ctx.durations.admission_load


def _replicas(ctx: Context, name: str, redis: RedisServer, armed: str) -> list[Service]:
    """Three replicas on one artifacts folder; the first with CHITCHAT_FAILPOINTS=`armed`."""
    artifacts = ctx.artifacts(name)
    base = {"CHITCHAT_SESSION_MAX_TURNS": str(SESSION_ENTRIES)}
    first = {**base, "CHITCHAT_FAILPOINTS": armed}
    return [Service(artifacts, redis.url, dict(first if i == 0 else base)) for i in range(3)]


def _start(services: list[Service]) -> None:
    for s in services:
        s.start(wait=False)
    for s in services:
        s.wait_ready()


def _store_agrees(redis: RedisServer, indexes: IndexStore) -> dict[str, Any]:
    """Whether the candidate store is the pointer's version, or says it is another (then a reader goes
    to the version's own records): never the records of one version marked as another."""
    store = RedisCandidateStore(redis.client(), REDIS_KEY)
    current, marked = indexes.current(), store.version()
    ids = {c.key for c in store.all()}
    built = marked is not None and (indexes.path(marked) / "manifest.json").is_file()
    matches = {c.key for c in indexes.records(marked)} == ids if marked and built else None
    return {"pointer": current, "store_marked": marked, "store_is_marked_version": matches}


def failed_pointer_writes(ctx: Context) -> dict[str, Any]:
    """Scenario 25: on replica A the pointer write fails (ENOSPC, a failpoint) in a reindex's swap and
    then in a rollback's, under load on three replicas. Each says it failed; every replica goes on
    serving what the pointer names; after a restart the store and the served version agree, and the
    next upload keeps every record the served version had."""
    figures: dict[str, Any] = {"index": ctx.index_label()}
    with ctx.redis() as redis:
        replicas = _replicas(ctx, "s25", redis, "store.pointer=1,2")
        a, b, _ = replicas
        indexes = IndexStore(a.artifacts / "indexes")
        load = ctx.work / "s25.jsonl"
        try:
            _start(replicas)
            base = b.wait_job(submit(b, fresh_candidates("s25-base", 20))["job_id"])  # somewhere to roll back to
            converged(replicas, 30)
            served = pointer(a)
            # The load covers the two failures; it ends before the restart, which stops every replica.
            generator = traffic([r.url for r in replicas], load, seconds=_window(ctx) / 2, clients=4, tag="s25")
            try:
                failed = a.wait_job(submit(a, fresh_candidates("s25-lost", 20))["job_id"])
                after_job = converged(replicas, 15)
                rollback = a.admin("POST", "/admin/rollback")
                after_rollback = converged(replicas, 15)
            finally:
                generator.wait()
            figures.update(
                base_upload=base["state"],
                reindex_job=f"{failed['state']}: {str(failed.get('error'))[:120]}",
                rollback_status=rollback.status_code,
                rollback_error=rollback.json().get("error", {}).get("message", "")[:120],
                still_served=served,
                after_failed_reindex=after_job[1],
                after_failed_rollback=after_rollback[1],
                store_before_restart=_store_agrees(redis, indexes),
            )
            for r in replicas:
                r.stop()
            a.env.pop("CHITCHAT_FAILPOINTS")
            _start(replicas)
            _, versions = converged(replicas, 30)
            figures.update(after_restart=versions, store_after_restart=_store_agrees(redis, indexes))
            kept = {c.key for c in indexes.records(pointer(a) or "")}
            appended = b.wait_job(submit(b, fresh_candidates("s25-after", 5))["job_id"])
            converged(replicas, 30)
            now = {c.key for c in indexes.records(pointer(a) or "")}
            figures.update(next_upload=appended["state"], records_lost_by_next_upload=len(kept - now))
        finally:
            for r in replicas:
                r.stop()
    figures["load"] = summary(rows(load))
    correct = (
        figures["base_upload"] == "succeeded"
        and figures["reindex_job"].startswith("failed")
        and figures["rollback_status"] == 503  # not_ready: the volume refused; nothing changed
        and figures["after_failed_reindex"] == figures["after_failed_rollback"] == [served] * 3
        and figures["store_before_restart"]["store_is_marked_version"] is not False
        and figures["after_restart"] == [served] * 3
        and figures["store_after_restart"]["store_is_marked_version"] is not False
        and figures["next_upload"] == "succeeded"
        and figures["records_lost_by_next_upload"] == 0
        and figures["load"]["status_5xx"] == 0
    )
    return {**figures, "pass": correct}


def _roll_back(replica: Service, timeout_s: float = 15) -> None:
    """POST /admin/rollback, again while it answers 409: a job that reads succeeded may hold the
    reindex lock for its last steps (publish, prune) a moment longer."""
    deadline = time.time() + timeout_s
    while (response := replica.admin("POST", "/admin/rollback")).status_code == 409 and time.time() < deadline:
        time.sleep(0.2)
    if response.status_code != 200:
        raise RuntimeError(f"rollback: {response.status_code} {response.text[:200]}")


def rollback_upload_rollback(ctx: Context) -> dict[str, Any]:
    """Scenario 26: v1 serves; upload (v2); roll back (v1); upload (v3); roll back: v1 serves again, the
    version that served before v3, not v2, the version rolled back from. Three replicas, under load."""
    figures: dict[str, Any] = {"index": ctx.index_label()}
    load = ctx.work / "s26.jsonl"
    with ctx.redis() as redis, ctx.replicas("s26", redis) as replicas:
        a, b, c = replicas
        generator = traffic([r.url for r in replicas], load, seconds=_window(ctx), clients=4, tag="s26")
        try:
            steps: list[tuple[str, str | None]] = [("start", pointer(a))]
            b.wait_job(submit(b, fresh_candidates("s26-v1", 10))["job_id"])
            steps.append(("upload", pointer(a)))
            for i, (step, replica) in enumerate((("rollback", a), ("upload", c), ("rollback", b))):
                if step == "upload":
                    replica.wait_job(submit(replica, fresh_candidates(f"s26-{i}", 10))["job_id"])
                else:
                    _roll_back(replica)
                steps.append((step, pointer(a)))
            seconds, versions = converged(replicas, 30)
        finally:
            generator.wait()
    figures["load"] = summary(rows(load))
    # start v0, upload v1, rollback -> v0, upload v2, rollback -> v0 (what served before v2)
    names = [v for _, v in steps]
    figures.update(steps=[f"{s} -> {v}" for s, v in steps], converged_s=seconds, replicas=versions)
    correct = (
        names[2] == names[0]
        and names[4] == names[2]
        and names[4] != names[1]
        and versions == [names[4]] * 3
        and figures["load"]["status_5xx"] == 0
    )
    return {**figures, "pass": correct}
