"""Scenarios 3, 4, 5, 15: reindexes at peak, reindexes that fail, two at once, and a soak."""

from __future__ import annotations

import resource
import shutil
import signal
import statistics
import threading
import time
from typing import Any

from app.reindex.jobs import FINISHING_GRACE_S, LOCK_TTL_S
from bench.chaos.context import Context
from bench.chaos.harness import Service, rows, summary, traffic, wait_for
from core.store import IndexStore


def appendix(tag: str, n: int = 20) -> list[dict[str, str]]:
    """A small upload of new candidates: a reindex that reuses every stored vector and encodes these."""
    return [
        {"query": f"chaos question {tag} {i}?", "reply": f"chaos answer {tag} {i}", "id": f"{tag}-{i}"}
        for i in range(n)
    ]


def replies_of(service: Service, version: str) -> set[str]:
    return set(IndexStore(service.artifacts / "indexes").tables(version).reply_texts)


def reindex_at_peak(ctx: Context) -> dict[str, Any]:
    """Reindexes at a quarter, a half and three quarters of the window; each must be done before the window ends.
    Served on the sampled index (`Context.on_sample`): an append rebuilds every candidate's graph, ~30 s for
    the full ~100k even idle, so 3 in 2 minutes under load would measure the build, not the swap."""
    window = ctx.durations.reindex_window
    with ctx.redis() as redis, ctx.service("s3", redis) as service:
        known = {service.admin("GET", "/admin/index").json()["current"]}
        texts = {v: replies_of(service, v) for v in known}
        reactions = set((service.admin("GET", "/info").json()["model"]["reactions"] or {}).get("labels", []))
        out = ctx.work / "s3.jsonl"
        start = time.time()
        load = traffic(service.url, out, seconds=window, clients=8, tag="s3")
        jobs = []
        for i in range(3):
            time.sleep(max(0.0, start + (i + 1) * window / 4 - time.time()))
            submitted = time.time() - start
            job = service.admin("POST", "/admin/candidates", json=appendix(f"s3r{i}")).json()
            if "job_id" not in job:
                jobs.append({"state": f"refused: {job}", "submitted_at_s": round(submitted, 1)})
                continue
            finished = service.wait_job(job["job_id"], timeout_s=max(1.0, start + window - time.time()))
            finished["submitted_at_s"] = round(submitted, 1)
            jobs.append(finished)
            if finished.get("version"):
                texts[finished["version"]] = replies_of(service, finished["version"])  # before a prune removes it
        load.wait()
        results = rows(out)
    answered = [r for r in results if r["status"] == 200]
    versions = {r["index_version"] for r in answered}
    unknown = sum(r["index_version"] not in texts for r in answered)
    foreign = sum(
        r["index_version"] in texts and r["reply"] not in texts[r["index_version"]] and r["reply"] not in reactions
        for r in answered
        if r["source"] != "reaction"
    )
    figures = summary(results)
    figures.update(
        index=ctx.index_label(),
        window_s=window,
        reindexes_succeeded=sum(j["state"] == "succeeded" for j in jobs),
        reindex_seconds=[j.get("waited_s") for j in jobs],
        reindex_submitted_at_s=[j.get("submitted_at_s") for j in jobs],
        versions_served=len(versions),
        replies_not_in_their_version=foreign,
        responses_naming_an_unknown_version=unknown,
    )
    passed = figures["status_5xx"] == 0 and foreign == 0 and unknown == 0 and figures["reindexes_succeeded"] == 3
    return {**figures, "pass": passed}


def bad_reindexes(ctx: Context) -> dict[str, Any]:
    figures: dict[str, Any] = {"index": ctx.index_label()}
    with ctx.redis() as redis:
        service = ctx.make_service("s4ab", redis)
        try:
            service.start()
            # (a) a corrupt upload: refused whole, nothing changes
            before = service.admin("GET", "/admin/index").json()
            corrupt = service.admin(
                "POST",
                "/admin/candidates",
                content=b'{"reply": "a"}\n{oops',
                headers={"content-type": "application/x-ndjson"},
            )
            figures["corrupt_upload_status"] = corrupt.status_code
            figures["corrupt_upload_unchanged"] = service.admin("GET", "/admin/index").json() == before

            # (b) the build killed halfway: kill -9 while it encodes, then restart
            fresh = [{"reply": f"fresh reply number {i} about {i % 97} things", "id": f"k{i}"} for i in range(20_000)]
            job = service.admin("POST", "/admin/candidates", json=fresh).json()
            wait_for(lambda: service.admin("GET", f"/admin/jobs/{job['job_id']}").json()["stage"] == "encode", 60)
            time.sleep(1)
            service.signal(signal.SIGKILL)
            assert service.process is not None
            service.process.wait()
            service.start()
            after = service.admin("GET", "/admin/index").json()
            # The dead job's lock runs out within its TTL (no process renews it); then the job reads failed.
            restarted = time.perf_counter()
            killed = service.wait_job(job["job_id"], timeout_s=LOCK_TTL_S + FINISHING_GRACE_S + 10)
            staging = [p.name for p in (service.artifacts / "indexes").iterdir() if p.name.startswith(".staging")]
            figures.update(
                killed_build_old_version_serving=after["current"] == before["current"],
                killed_build_versions_unchanged=after["versions"] == before["versions"],
                killed_build_job=f"{killed['state']}: {killed.get('error')}",
                killed_build_failed_s_after_restart=round(time.perf_counter() - restarted, 1),
                killed_build_staging_left=len(staging),
            )
        finally:
            service.stop()
            shutil.rmtree(ctx.work / "s4ab", ignore_errors=True)

        # (c) a write that fails: a file size limit stands in for a full disk, half the served
        # version's largest file, so the new version (the same files, 20 candidates more) cannot be written
        service = ctx.make_service("s4c", redis)
        served = IndexStore(service.artifacts / "indexes")
        largest = max(f.stat().st_size for f in served.path(served.current() or "").iterdir() if f.is_file())
        limit = max(64 * 1024, largest // 2)

        def small_files() -> None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))  # Python ignores SIGXFSZ: writes fail EFBIG

        service.preexec = small_files
        try:
            service.start()
            before = service.admin("GET", "/admin/index").json()["current"]
            job = service.admin("POST", "/admin/candidates", json=appendix("s4c")).json()
            failed = service.wait_job(job["job_id"], timeout_s=300)
            staging = [p.name for p in (service.artifacts / "indexes").iterdir() if p.name.startswith(".staging")]
            figures.update(
                full_disk_file_limit_mb=round(limit / 2**20, 1),
                full_disk_job=f"{failed['state']}: {failed.get('error')}",
                full_disk_old_version_serving=service.admin("GET", "/admin/index").json()["current"] == before,
                full_disk_staging_left=len(staging),
            )
        finally:
            service.stop()
            shutil.rmtree(ctx.work / "s4c", ignore_errors=True)
    passed = (
        figures["corrupt_upload_status"] == 422
        and figures["corrupt_upload_unchanged"]
        and figures["killed_build_old_version_serving"]
        and figures["killed_build_versions_unchanged"]
        and figures["killed_build_job"].startswith("failed")
        and figures["killed_build_staging_left"] == 0
        and figures["full_disk_job"].startswith("failed")
        and figures["full_disk_old_version_serving"]
        and figures["full_disk_staging_left"] == 0
    )
    return {**figures, "pass": passed}


def two_at_once(ctx: Context) -> dict[str, Any]:
    with ctx.redis() as redis, ctx.service("s5", redis) as service:
        readings = []
        for _ in range(5):
            readings.append(service.status()["rss_kb"])
            time.sleep(0.2)
        steady = statistics.median(readings)
        peak = steady
        stop = threading.Event()

        def sample() -> None:
            nonlocal peak
            while not stop.is_set():
                peak = max(peak, service.status()["rss_kb"])
                time.sleep(0.1)

        sampler = threading.Thread(target=sample)
        sampler.start()
        first = service.admin("POST", "/admin/candidates", json=appendix("s5a")).json()
        second = service.admin("POST", "/admin/candidates", json=appendix("s5b"))
        finished = service.wait_job(first["job_id"])
        stop.set()
        sampler.join()
    error = second.json().get("error", {})
    figures = {
        "index": ctx.index_label(),
        "first_job_seconds": finished.get("waited_s"),
        "second_status": second.status_code,
        "second_error": f"{error.get('kind')}: {error.get('message')}",
        "first_job": finished["state"],
        "steady_rss_mb": round(steady / 1024, 1),
        "peak_rss_mb": round(peak / 1024, 1),
        "peak_over_steady": round(peak / steady, 2),
    }
    passed = second.status_code == 409 and finished["state"] == "succeeded" and peak / steady <= 2.2
    return {**figures, "pass": passed}


def soak(ctx: Context) -> dict[str, Any]:
    """~20 rps with a reindex every `soak_reindex_every` s. Memory is compared between quiet moments, a few
    seconds after each reindex is done: during a build RSS holds its working set, which is not growth."""
    d = ctx.durations
    every = d.soak_reindex_every
    with ctx.redis() as redis, ctx.service("s15", redis) as service:
        out = ctx.work / "s15.jsonl"
        # ~20 requests a second: 4 clients, each pausing ~200 ms between requests
        load = traffic(service.url, out, seconds=d.soak, clients=4, pause_ms=190, tag="s15")
        samples: list[dict[str, int]] = []
        settled: list[dict[str, int]] = []  # a few seconds after each reindex finished
        started = time.time()
        next_reindex, running, done_at = started + every, None, None
        jobs: list[dict[str, Any]] = []

        def reading() -> dict[str, int]:
            return {**service.status(), "redis_clients": redis.clients(), "cache_kb": service.cache_kb()}

        time.sleep(min(5.0, every / 4))
        settled.append(reading())  # warm, before any reindex
        while load.poll() is None:
            samples.append(reading())
            now = time.time()
            if running is None and now >= next_reindex and now + every / 2 < started + d.soak:  # time to finish
                running = service.admin("POST", "/admin/candidates", json=appendix(f"s15r{len(jobs)}")).json()
                next_reindex += every
                if "job_id" not in running:
                    jobs.append({"state": f"refused: {running}"})
                    running = None
            if running is not None:
                job = service.admin("GET", f"/admin/jobs/{running['job_id']}").json()
                if job.get("state") in ("succeeded", "failed"):
                    jobs.append(job)
                    running, done_at = None, now
            if done_at is not None and now >= done_at + 3:
                settled.append(reading())
                done_at = None
            time.sleep(1)
        results = rows(out)
    base = settled[1] if len(settled) > 2 else settled[0]  # after the first reindex: its arenas are steady state
    rss_growth = settled[-1]["rss_kb"] / base["rss_kb"] - 1
    # Unique contexts fill the in-process embedding cache up to its bound (CHITCHAT_CACHE_LOCAL_MB):
    # growth by design, not a leak, so the bar is held against what the process holds besides it.
    rest = [s["rss_kb"] - s["cache_kb"] for s in (base, settled[-1])]
    rss_growth_less_cache = rest[1] / rest[0] - 1

    def spread(key: str, readings: list[dict[str, int]]) -> list[int]:
        return [min(s[key] for s in readings), max(s[key] for s in readings)]

    figures = summary(results)
    figures.update(
        index=ctx.index_label(),
        soak_minutes=round(d.soak / 60, 1),
        reindex_every_s=round(every),
        rps=round(len(results) / d.soak, 1),
        reindexes=[j["state"] for j in jobs],
        rss_mb_settled=[round(s["rss_kb"] / 1024, 1) for s in settled],
        rss_growth=round(rss_growth, 4),  # after the first reindex -> after the last
        cache_mb_settled=[round(s["cache_kb"] / 1024, 1) for s in settled],
        rss_growth_less_cache=round(rss_growth_less_cache, 4),
        rss_growth_from_warm=round(settled[-1]["rss_kb"] / settled[0]["rss_kb"] - 1, 4),
        fds_settled=spread("fds", settled),
        fds_any=spread("fds", samples),
        redis_clients_settled=spread("redis_clients", settled),
        redis_clients_any=spread("redis_clients", samples),
        threads=spread("threads", samples),
    )
    fd_spread = figures["fds_settled"][1] - figures["fds_settled"][0]
    client_spread = figures["redis_clients_settled"][1] - figures["redis_clients_settled"][0]
    passed = (
        rss_growth_less_cache < 0.10
        and fd_spread <= 8
        and client_spread <= 4
        and figures["status_5xx"] == 0
        and len(jobs) >= 2
        and all(j["state"] == "succeeded" for j in jobs)
    )
    return {**figures, "pass": passed}
