"""Many connections at once, on a client light enough to time the server, run in a process of its own.

    python -m bench.chaos.flood --url URL --seconds 20 --connections 200 --out results.jsonl

Scenario 6 asks how fast the excess is refused. `traffic.py` spends about a
millisecond of CPU on each request in httpx, so at 200 connections on this
2-core machine its own event loop queues the timings: against a server that
answers every request with an instant 429, it measured a p99 of 1.2 s. This
client writes each request and parses each response on raw keep-alive sockets
(tens of microseconds each), and writes the same JSON lines as `traffic.py`.
Each request is a plain context with a unique last turn, so none is a cache hit.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from bench.chaos.traffic import turns


def request(host: str, body: dict[str, Any]) -> bytes:
    payload = json.dumps(body).encode()
    head = f"POST /reply HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\ncontent-length: {len(payload)}"
    return head.encode() + b"\r\n\r\n" + payload


async def response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 response with a Content-Length body (what the service sends): status, headers, body."""
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
    status = int(head[0].split(" ", 2)[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in head[1:] if line)}
    return status, headers, await reader.readexactly(int(headers.get("content-length", "0")))


async def connection(index: int, url: str, until: float, pool: list[list[str]], tag: str) -> list[dict[str, Any]]:
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    rows: list[dict[str, Any]] = []
    reader, writer = await asyncio.open_connection(host, port)
    n = 0
    try:
        while time.time() < until:
            *earlier, last = pool[(index * 7919 + n) % len(pool)]
            raw = request(f"{host}:{port}", {"context": [*earlier, f"{last} #{tag}c{index}n{n}"]})
            n += 1
            row: dict[str, Any] = {"client": index, "t": time.time()}
            started = time.perf_counter()
            try:
                writer.write(raw)
                status, headers, body = await response(reader)
            except (OSError, asyncio.IncompleteReadError) as error:
                row.update(status=type(error).__name__, latency_ms=round((time.perf_counter() - started) * 1000, 2))
                rows.append(row)
                writer.close()
                reader, writer = await asyncio.open_connection(host, port)  # the server hung up: a new one
                continue
            row.update(status=status, latency_ms=round((time.perf_counter() - started) * 1000, 2))
            if status == 200:
                answer = json.loads(body)
                row.update(index_version=answer["index_version"], reply=answer["reply"], source=answer["source"])
            else:
                row.update(error=body[:200].decode("utf-8", "replace"), retry_after=headers.get("retry-after"))
            rows.append(row)
            if headers.get("connection", "").lower() == "close":
                writer.close()
                reader, writer = await asyncio.open_connection(host, port)
    finally:
        writer.close()
    return rows


async def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    pool = turns(args.seed)
    until = time.time() + args.seconds
    results = await asyncio.gather(*(connection(i, args.url, until, pool, args.tag) for i in range(args.connections)))
    return [row for rows in results for row in rows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", required=True)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--connections", type=int, default=200)
    parser.add_argument("--tag", default="flood", help="part of every last turn, so runs share no cache entries")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    rows = asyncio.run(run(args))
    args.out.write_text("".join(json.dumps(r) + "\n" for r in rows))


if __name__ == "__main__":
    main()
