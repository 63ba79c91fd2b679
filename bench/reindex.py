"""Live reindex of the full candidate set: how long it takes, and what it does
to /reply latency while it runs.

Starts its own server (admin enabled, a real Redis on 127.0.0.1:6379, db 14)
on a scratch copy of artifacts/ (bundles linked, the serving index version
hard-linked: versions are immutable), then:

1. steady state: a closed-loop client sends held-out contexts to /reply;
2. uploads the ~100k chitchat train candidates in `replace` mode and keeps
   the same client running until the job finishes.

    python -m bench.reindex            # texts the serving version already embedded (reused)
    python -m bench.reindex --fresh    # every text new: all ~100k are encoded
    python -m bench.reindex --idle     # no /reply traffic during the reindex
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import redis

from bench.service import free_port, start_server, test_contexts, wait_ready
from core.bundle import RELEASE_BUNDLE, read_manifest
from core.store import IndexStore
from index.build import corpus_candidates

TOKEN = "bench-token"
REDIS_URL = "redis://127.0.0.1:6379/14"


def scratch_artifacts(source: Path) -> Path:
    root = Path(tempfile.mkdtemp(prefix="reindex-bench-"))
    store = IndexStore(source / "indexes")
    version = store.latest_for(read_manifest(RELEASE_BUNDLE).checksum)
    assert version is not None, "no index for the release bundle: run `make index`"
    shutil.copytree(store.path(version), root / "indexes" / version, copy_function=os.link)
    IndexStore(root / "indexes").set_current(version)
    return root


async def client_loop(url: str, contexts: list[list[str]], stop: asyncio.Event) -> tuple[list[float], int, set[str]]:
    latencies, errors, versions = [], 0, set()
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        i = 0
        while not stop.is_set():
            started = time.perf_counter()
            response = await client.post("/reply", json={"context": contexts[i % len(contexts)]})
            latencies.append((time.perf_counter() - started) * 1000)
            if response.status_code != 200:
                errors += 1
            else:
                versions.add(response.json()["index_version"])
            i += 1
    return latencies, errors, versions


async def measure(url: str, records: list[dict[str, Any]], steady_s: float, idle: bool) -> dict[str, Any]:
    # Distinct contexts from the test split; the embedding cache sees each once per pass.
    contexts = test_contexts(5000, 3, seed=1)
    stop = asyncio.Event()
    steady_task = asyncio.create_task(client_loop(url, contexts[:2500], stop))
    await asyncio.sleep(steady_s)
    stop.set()
    steady, _, _ = await steady_task

    stop = asyncio.Event()
    if idle:
        stop.set()  # the reindex alone, for its duration without competing traffic
    during_task = asyncio.create_task(client_loop(url, contexts[2500:], stop))
    headers = {"authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(base_url=url, timeout=120) as admin:
        started = time.perf_counter()
        response = await admin.post("/admin/candidates?mode=replace", json=records, headers=headers)
        response.raise_for_status()
        job_id = response.json()["job_id"]
        stages: dict[str, float] = {"upload": 0.0}  # stage -> when it was first seen
        while True:
            job = (await admin.get(f"/admin/jobs/{job_id}", headers=headers)).json()
            stages.setdefault(job["stage"], time.perf_counter() - started)
            if job["state"] in ("succeeded", "failed"):
                break
            await asyncio.sleep(0.25)
        wall = time.perf_counter() - started
    stop.set()
    during, errors, versions = await during_task
    return {
        "steady": np.array(steady),
        "during": np.array(during),
        "errors": errors,
        "versions": versions,
        "job": job,
        "wall_s": wall,
        "stages": stages,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--artifacts", type=Path, default=Path("artifacts"))
    parser.add_argument("--fresh", action="store_true", help="make every text new, so nothing is reused")
    parser.add_argument("--steady-seconds", type=float, default=20)
    parser.add_argument("--idle", action="store_true", help="no /reply traffic during the reindex")
    args = parser.parse_args()

    redis.Redis.from_url(REDIS_URL).flushdb()
    root = scratch_artifacts(args.artifacts)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {
        **os.environ,
        "CHITCHAT_ARTIFACTS_DIR": str(root),
        "CHITCHAT_ADMIN_TOKEN": TOKEN,
        "CHITCHAT_REDIS_URL": REDIS_URL,
        # Both phases must measure the same thing: uncached requests. The
        # client cycles through its contexts, so cached embeddings would make
        # the longer "during" phase look faster than steady state.
        "CHITCHAT_CACHE_LOCAL_ENTRIES": "0",
        "CHITCHAT_CACHE_TTL_S": "1",
    }
    server = start_server(port, "--no-access-log", env=env)
    try:
        wait_ready(f"{url}/readyz", server, every_s=0.5)
        bundle = httpx.get(f"{url}/info").json()["model"]
        suffix = " (v2)" if args.fresh else ""
        records = [
            {"reply": c.reply + suffix, **({"query": c.query + suffix} if c.query else {})}
            for c in corpus_candidates(bundle["max_context_turns"])
        ]
        print(f"bundle {bundle['name']} ({bundle['layers']} layers), {len(records)} candidates, fresh={args.fresh}")
        result = asyncio.run(measure(url, records, args.steady_seconds, args.idle))
    finally:
        server.terminate()
        server.wait(timeout=30)
        shutil.rmtree(root, ignore_errors=True)

    job = result["job"]
    marks = [*sorted(result["stages"].items(), key=lambda kv: kv[1]), ("end", result["wall_s"])]
    timeline = ", ".join(f"{stage} {later - at:.1f} s" for (stage, at), (_, later) in itertools.pairwise(marks))
    print(f"stages (as polled every 0.25 s): {timeline}")
    steady_p50, steady_p99 = np.percentile(result["steady"], [50, 99])
    during_p50, during_p99 = np.percentile(result["during"], [50, 99]) if len(result["during"]) > 1 else (0.0, 0.0)
    print(f"job {job['state']}: {job['counts']} error={job['error']}")
    print(f"reindex: {result['wall_s']:.1f} s from upload to swap ({job['counts'].get('encoded', '?')} texts encoded)")
    print(f"/reply steady:         n={len(result['steady'])} p50={steady_p50:.2f} ms p99={steady_p99:.2f} ms")
    print(f"/reply during reindex: n={len(result['during'])} p50={during_p50:.2f} ms p99={during_p99:.2f} ms")
    print(
        f"p99 during / steady: {during_p99 / steady_p99:.2f}x; errors during: {result['errors']}; "
        f"versions seen: {sorted(result['versions'])}"
    )


if __name__ == "__main__":
    main()
