"""Scenarios 16-21: three service processes on one Redis and one artifacts folder, as
replicas behind a load balancer are, with faults in what they share."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
from typing import Any

import httpx

from bench.chaos.context import SESSION_TURNS, Context, check_sessions, stored_sessions
from bench.chaos.harness import RedisServer, Service, rows, summary, traffic, wait_for
from core.store import IndexStore

CONVERGE_BAR_S = 10.0


def fresh_candidates(tag: str, n: int) -> list[dict[str, str]]:
    """New candidates: a reindex that encodes n queries and n replies, so it runs long enough to be caught."""
    return [
        {
            "query": f"replica question {tag} {i} about {i % 89}?",
            "reply": f"replica answer {tag} {i}",
            "id": f"{tag}-{i}",
        }
        for i in range(n)
    ]


def pointer(service: Service) -> str | None:
    return IndexStore(service.artifacts / "indexes").current()


def converged(replicas: list[Service], timeout_s: float) -> tuple[float | None, list[str | None]]:
    """Seconds until every replica serves the pointer's version (None if not within timeout_s), and what each serves."""
    started = time.time()
    while True:
        versions = [r.version() for r in replicas]
        target = pointer(replicas[0])
        if target is not None and all(v == target for v in versions):
            return round(time.time() - started, 2), versions
        if time.time() - started > timeout_s:
            return None, versions
        time.sleep(0.1)


def submit(service: Service, records: list[dict[str, str]]) -> dict[str, Any]:
    response = service.admin("POST", "/admin/candidates", json=records)
    if response.status_code != 202:
        raise RuntimeError(f"upload refused: {response.status_code} {response.text[:200]}")
    return dict(response.json())


def replica_starts_mid_reindex(ctx: Context) -> dict[str, Any]:
    """Two replicas serve; one reindexes; a third starts 3 s into the job. Its start once failed the job (it
    read the job's owner as dead) and deleted the job's staging directory."""
    n = ctx.durations.replica_upload
    with ctx.redis() as redis, ctx.replicas("s16", redis, count=2) as replicas:
        first = replicas[0]
        job = submit(first, fresh_candidates("s16", n))
        time.sleep(3)
        late = Service(first.artifacts, redis.url, dict(replicas[0].env))
        late.start(wait=False)
        try:
            # Whether the late replica was ready (its start's job check and staging cleanup done) before the job
            # ended: else the scenario tested nothing.
            ready_while_running = False
            while True:
                state = first.admin("GET", f"/admin/jobs/{job['job_id']}").json()
                if state["state"] not in ("queued", "running"):
                    break
                ready_while_running = ready_while_running or late.version() not in (None, "None")
                time.sleep(0.2)
            done = first.wait_job(job["job_id"])
            swapped_at = float(done.get("updated_at", time.time()))
            late.wait_ready()
            everyone = [*replicas, late]
            seconds, versions = converged(everyone, 60)
            after_swap = round(time.time() - swapped_at, 2) if seconds is not None else None
            staging = [p.name for p in (first.artifacts / "indexes").iterdir() if p.name.startswith(".staging")]
        finally:
            late.stop()
    figures = {
        "uploaded": n,
        "late_replica_ready_while_the_job_ran": ready_while_running,
        "job": f"{done['state']}: {done.get('error')}" if done["state"] != "succeeded" else "succeeded",
        "job_seconds": round(float(done.get("updated_at", 0)) - float(done.get("created_at", 0)), 1),
        "versions": versions,
        "all_on_new_version": all(v == done.get("version") for v in versions),
        "converged_s_after_swap": after_swap,
        "staging_left": len(staging),
    }
    # Converged at all (within the wait) is correctness; within CONVERGE_BAR_S, speed.
    correct = done["state"] == "succeeded" and ready_while_running and figures["all_on_new_version"]
    correct = correct and after_swap is not None
    timely = after_swap is not None and after_swap <= CONVERGE_BAR_S
    return {**figures, "latency_bars_met": timely, "pass": ctx.verdict(correct, timely)}


def redis_paused_at_publish(ctx: Context) -> dict[str, Any]:
    """Redis SIGSTOPped for 3 s the moment a job moves the pointer, when its next step is the publish (and
    then 10 ms and 100 ms later). Whatever the job then says must be true: succeeded means its version is
    the pointer's, failed means the one before still is."""
    runs = []
    with ctx.redis() as redis, ctx.replicas("s17", redis) as replicas:
        first = replicas[0]
        for i, delay in enumerate((0.0, 0.01, 0.1)):
            before = pointer(first)
            job = submit(first, fresh_candidates(f"s17r{i}", 200))
            wait_for(lambda b=before: pointer(first) != b, 120, 0.0005)  # the swap just moved it
            time.sleep(delay)
            redis.pause()
            time.sleep(3)
            redis.resume()
            back = time.time()
            done = first.wait_job(job["job_id"], timeout_s=180)
            seconds, versions = converged(replicas, 30)
            now = pointer(first)
            truthful = (done["state"] == "succeeded" and now == done.get("version")) or (
                done["state"] == "failed" and now == before
            )
            runs.append(
                {
                    "paused_after_pointer_moved_s": delay,
                    "job": done["state"],
                    "after_swap": (done.get("report") or {}).get("after_swap"),
                    "error": done.get("error"),
                    "truthful": truthful,
                    "converged_s_after_redis_back": round(time.time() - back, 2) if seconds is not None else None,
                    "versions": sorted(set(map(str, versions))),
                }
            )
    passed = all(
        r["truthful"]
        and r["converged_s_after_redis_back"] is not None
        and r["converged_s_after_redis_back"] <= CONVERGE_BAR_S
        for r in runs
    )
    return {"runs": runs, "pass": passed}


def rollback_races_reindex(ctx: Context) -> dict[str, Any]:
    """A rollback on one replica and an upload on another, sent at the same instant, 5 times."""
    rounds = []
    with ctx.redis() as redis, ctx.replicas("s18", redis) as replicas:
        a, b, c = replicas
        for i in range(5):
            base = submit(c, fresh_candidates(f"s18-base{i}", 20))  # so that a rollback has somewhere to go
            c.wait_job(base["job_id"])
            converged(replicas, 30)
            start = threading.Barrier(2)
            answers: dict[str, httpx.Response] = {}
            calls = {
                "rollback": lambda: a.admin("POST", "/admin/rollback"),
                "upload": lambda i=i: b.admin("POST", "/admin/candidates", json=fresh_candidates(f"s18r{i}", 50)),
            }
            threads = [threading.Thread(target=_at_once, args=(start, answers, *item)) for item in calls.items()]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            codes = {name: r.status_code for name, r in answers.items()}
            refusals = {name: r.json()["error"]["message"][:80] for name, r in answers.items() if r.status_code == 409}
            if codes["upload"] == 202:
                b.wait_job(answers["upload"].json()["job_id"])
            seconds, versions = converged(replicas, 30)
            named = {r.admin("GET", "/admin/index").json()["current"] for r in replicas}
            rounds.append(
                {
                    "codes": codes,
                    "refusals": refusals,
                    "one_won": sorted(codes.values()) in ([200, 409], [202, 409], [200, 202]),
                    "converged_s": seconds,
                    "same_version": len(set(versions)) == 1 and named == set(versions) == {pointer(a)},
                }
            )
    both = sum(sorted(r["codes"].values()) == [200, 202] for r in rounds)
    passed = all(r["one_won"] and r["same_version"] for r in rounds) and any(409 in r["codes"].values() for r in rounds)
    # Both may succeed when one finished before the other began (a rollback of a small index takes
    # milliseconds): that is a serial order, not a race lost, and the row counts it apart.
    return {"rounds": rounds, "both_succeeded_in_turn": both, "pass": passed}


def _at_once(start: threading.Barrier, answers: dict[str, httpx.Response], name: str, call: Any) -> None:
    start.wait()
    answers[name] = call()


def session_across_replicas(ctx: Context) -> dict[str, Any]:
    """Each session's messages go to the 3 replicas in turn; 30% of requests give up after 5-30 ms."""
    d = ctx.durations
    with ctx.redis() as redis, ctx.replicas("s19", redis) as replicas:
        out = ctx.work / "s19.jsonl"
        traffic(
            [r.url for r in replicas],
            out,
            requests=d.storm_checked // 2,
            clients=12,
            session_share=1.0,
            sessions_per_client=2,
            turns_per_session=SESSION_TURNS,
            timeout_ms=(5, 30),
            cancel_share=0.3,
            tag="s19",
            seconds=3600,
        ).wait()
        results = rows(out)
        stored = stored_sessions(redis, "chaos-s19")
    figures = {"load": summary(results), **check_sessions(results, stored)}
    figures["cancelled"] = sum(r["status"] == "cancelled" for r in results)
    passed = (
        figures["foreign_turns"] == 0
        and figures["lost_turns"] == 0
        and figures["out_of_order"] == 0
        and figures["trimmed_unchecked"] == 0
        and figures["load"]["status_5xx"] == 0
        and figures["turns_checked"] > 0
    )
    return {**figures, "pass": passed}


def _fill(cache: RedisServer) -> None:
    """Filler vectors in `cache` until it evicts: a cache Redis at its maxmemory.

    The service shares only short texts asked for twice (app/engine/cache.py), far too few
    to fill 16 MB within the run, so the run starts where a long-lived cache Redis would be."""
    client = cache.client()
    vector = bytes(4 * 384)  # a context vector's size
    i = 0
    while cache.evicted() == 0:
        with client.pipeline(transaction=False) as pipe:
            for _ in range(500):
                pipe.set(f"emb:filler:{i}", vector)
                i += 1
            pipe.execute()


def redis_at_maxmemory(ctx: Context) -> dict[str, Any]:
    """State in a Redis that never evicts, the embedding cache in one at a 16 MB maxmemory with LRU eviction
    (as docker-compose.yml sets them), filled to that limit, under unique contexts, 30% of them from 100
    popular ones, and sessions. The in-process cache is off, so every hit is the cache Redis's."""
    seconds = ctx.durations.maxmemory_load
    with (
        ctx.redis() as state,
        ctx.redis("--maxmemory", "16mb", "--maxmemory-policy", "allkeys-lru") as cache,
        ctx.replicas("s20", state, CHITCHAT_CACHE_REDIS_URL=cache.url, CHITCHAT_CACHE_LOCAL_ENTRIES="0") as replicas,
    ):
        _fill(cache)
        filled_evictions = cache.evicted()
        upload = submit(replicas[0], fresh_candidates("s20", 20))
        job = replicas[0].wait_job(upload["job_id"])
        stored_before = int(state.client().hlen("candidates"))
        out = ctx.work / "s20.jsonl"
        traffic(
            [r.url for r in replicas],
            out,
            seconds=seconds,
            clients=8,
            session_share=0.3,
            repeat_share=0.3,
            turns_per_session=SESSION_TURNS,
            tag="s20",
        ).wait()
        results = rows(out)
        stored = stored_sessions(state, "chaos-s20")
        hits = sum(r.metric("chitchat_cache_hits_total") for r in replicas)
        misses = sum(r.metric("chitchat_cache_misses_total") for r in replicas)
        job_after = replicas[1].admin("GET", f"/admin/jobs/{job['id']}").json()
        figures = {
            "load": summary(results),
            **check_sessions(results, stored),
            "cache_used_mb": round(int(cache.client().info("memory")["used_memory"]) / 2**20, 2),
            "cache_evicted_keys": cache.evicted() - filled_evictions,  # by the service's writes
            "state_evicted_keys": state.evicted(),
            "candidates_before": stored_before,
            "candidates_after": int(state.client().hlen("candidates")),
            "job_kept": job_after.get("state") == "succeeded",
            "cache_hit_rate": round(hits / max(1.0, hits + misses), 4),
        }
    passed = (
        figures["load"]["status_5xx"] == 0
        and figures["lost_turns"] == 0
        and figures["state_evicted_keys"] == 0
        and figures["cache_evicted_keys"] > 0  # the cache was at its limit, or the scenario proved nothing
        and figures["candidates_before"] == figures["candidates_after"]
        and figures["job_kept"]
    )
    return {**figures, "pass": passed}


def hostile_update_messages(ctx: Context) -> dict[str, Any]:
    """Messages on the update channel that name a path, a version that does not exist, and no JSON at all.
    Where strace is installed, every replica's file system calls are traced meanwhile: none may touch a
    path the messages name (`../`, `etc/passwd`)."""
    hostile = [
        json.dumps({"version": "../../etc", "origin": "chaos"}),
        json.dumps({"version": "v20990101T000000000000-abcdef", "origin": "chaos"}),
        json.dumps({"version": "/etc/passwd", "origin": "chaos"}),
        "not json",
    ]
    with ctx.redis() as redis, ctx.replicas("s21", redis) as replicas:
        before = [r.version() for r in replicas]
        traces = [ctx.work / f"s21-{i}.trace" for i in range(len(replicas))]
        tracers = []
        if shutil.which("strace"):
            for replica, trace in zip(replicas, traces, strict=True):
                assert replica.process is not None
                command = ["strace", "-f", "-qq", "-e", "trace=%file", "-p", str(replica.process.pid), "-o", str(trace)]
                tracers.append(subprocess.Popen(command, stderr=subprocess.DEVNULL))
            time.sleep(1)  # attached
        client = redis.client()
        for message in hostile:
            client.publish("index:updates", message)
        time.sleep(3)
        for tracer in tracers:
            tracer.terminate()
            tracer.wait()
        after = [r.version() for r in replicas]
        ready = [httpx.get(f"{r.url}/readyz", timeout=5).status_code for r in replicas]
        logged = "".join(r.log.read_text() for r in replicas if r.log is not None)
    calls = [line for t in traces if t.is_file() for line in t.read_text().splitlines()]
    ignored = logged.count("ignored an index update")
    figures = {
        "messages": len(hostile),
        "versions_unchanged": before == after,
        "ready": ready,
        "ignored_log_lines": ignored,
        "expected_log_lines": len(hostile) * len(replicas),
        "traced": f"{len(calls)} file system calls of {len(tracers)} replicas" if tracers else "no strace here",
        "calls_on_named_paths": sum("../" in c or "etc/passwd" in c for c in calls),
        "stats_of_the_missing_version": sum("v20990101" in c for c in calls),  # inside indexes/: the existence check
    }
    passed = (
        before == after
        and ready == [200] * len(replicas)
        and ignored == len(hostile) * len(replicas)
        and figures["calls_on_named_paths"] == 0
    )
    return {**figures, "pass": passed}
