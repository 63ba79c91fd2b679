"""/reply latency against the served bundle and index, end to end over HTTP.

Starts its own uvicorn on a free loopback port with the artifacts in
artifacts/, replays contexts from held-out (test split) chitchat
conversations, and prints p50/p90/p99. Each context is sent once, so the
embedding cache is cold for nearly every request: the figure is the
uncached cost. A second pass repeats the same contexts (all cached).

    python -m bench.latency [--requests 1000] [--concurrency 1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import time
from pathlib import Path

import httpx
import numpy as np

from bench.service import free_port, start_server, test_contexts, wait_ready


async def run(url: str, contexts: list[list[str]], concurrency: int) -> tuple[np.ndarray, float, dict[str, int]]:
    latencies: list[float] = []
    sources: dict[str, int] = {}
    queue: asyncio.Queue[list[str]] = asyncio.Queue()
    for c in contexts:
        queue.put_nowait(c)

    async def worker(client: httpx.AsyncClient) -> None:
        while not queue.empty():
            context = queue.get_nowait()
            started = time.perf_counter()
            response = await client.post("/reply", json={"context": context})
            latencies.append((time.perf_counter() - started) * 1000)
            response.raise_for_status()
            source = response.json()["source"]
            sources[source] = sources.get(source, 0) + 1

    started = time.perf_counter()
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
    return np.array(latencies), time.perf_counter() - started, sources


def summary(label: str, ms: np.ndarray, seconds: float) -> str:
    p50, p90, p99 = np.percentile(ms, [50, 90, 99])
    return (
        f"{label:<28} n={len(ms):<5} p50={p50:6.2f} ms  p90={p90:6.2f} ms  p99={p99:6.2f} ms  "
        f"throughput={len(ms) / seconds:6.1f} req/s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--url", help="measure a running server instead of starting one")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()

    server: subprocess.Popen[bytes] | None = None
    url = args.url
    if url is None:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        server = start_server(port, "--no-access-log")
    try:
        wait_ready(f"{url}/readyz", server, every_s=0.5)
        info = httpx.get(f"{url}/info").json()
        model, index = info["model"], info["index"]
        print(f"bundle {model['name']} ({model['layers']} layers, {model['quantization']})")
        print(f"index  {index['version']}: {index['replies']} replies, {index['queries']} queries, ann {index['ann']}")
        print(f"cpu    {os.cpu_count()} cores, concurrency {args.concurrency}")

        contexts = test_contexts(args.requests + args.warmup, model["max_context_turns"])
        warmup, measured = contexts[: args.warmup], contexts[args.warmup :]
        asyncio.run(run(url, warmup, 1))
        cold, cold_s, sources = asyncio.run(run(url, measured, args.concurrency))
        warm, warm_s, _ = asyncio.run(run(url, measured, args.concurrency))
        print(summary("/reply, uncached contexts", cold, cold_s))
        print(summary("/reply, cached embeddings", warm, warm_s))
        print(f"sources: {sources}")
        if args.json:

            def percentiles(ms: np.ndarray) -> dict[str, float]:
                p50, p90, p99 = np.percentile(ms, [50, 90, 99]).round(3).tolist()
                return {"p50": p50, "p90": p90, "p99": p99}

            figures = {
                "bundle": model["name"],
                "index_version": index["version"],
                "concurrency": args.concurrency,
                "uncached_ms": percentiles(cold),
                "cached_ms": percentiles(warm),
                "sources": sources,
            }
            args.json.write_text(json.dumps(figures, indent=2) + "\n")
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=10)


if __name__ == "__main__":
    main()
