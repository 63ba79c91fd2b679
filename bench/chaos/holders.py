"""The clients of scenarios 27 and 28, in a process of their own: many sockets that hold the service
without asking it for any work.

    python -m bench.chaos.holders --url URL --kind idle-bodies --connections 48 --out idle.jsonl
    python -m bench.chaos.holders --url URL --kind readyz --connections 400 --seconds 20 --out readyz.jsonl

`idle-bodies`: each connection sends a `POST /reply`'s headers, declaring a body of 1,000 bytes, and
one byte of it, then waits for the answer (the service's body deadline: 408) and starts again on a
fresh connection, until SIGTERM or --seconds. One JSON line per answer: its status (or "closed"),
and the seconds since the byte was sent.

`readyz`: each connection sends `GET /readyz` on one keep-alive connection as soon as the last is
answered, for --seconds. One JSON line at the end: answers by status and by the `redis` they
report, transport errors, and latency percentiles (kept here: a row per answer would be ~100k lines).

Either way the first line, `{"event": "connected", ...}`, says when every connection is open (and,
for idle bodies, has sent its byte). Raw sockets, as `flood.py`'s, so that the client's own cost per
request stays small; `--nice` lowers this process's autogroup, as `attackers.py` does and for the
same reason: what the service spends on the attack is what the bars are about.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import signal
import time
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlsplit

import numpy as np

from bench.chaos.attackers import lower_priority
from bench.chaos.flood import response

DECLARED_BYTES = 1000
REDIS_FIELD = re.compile(rb'"redis":\s*"(\w+)"')


def _emit(out: IO[str], row: dict[str, Any]) -> None:
    out.write(json.dumps(row) + "\n")
    out.flush()


async def idle_body(host: str, port: int, stop: asyncio.Event, out: IO[str], opened: asyncio.Queue[None]) -> None:
    head = (
        f"POST /reply HTTP/1.1\r\nhost: {host}:{port}\r\ncontent-type: application/json\r\n"
        f"content-length: {DECLARED_BYTES}\r\n\r\n{{"
    ).encode()
    first = True
    while not stop.is_set():
        try:
            reader, writer = await asyncio.open_connection(host, port)
        except OSError as error:  # refused: say so, and try again
            _emit(out, {"status": type(error).__name__, "seconds": 0.0, "t": time.time()})
            await asyncio.sleep(0.1)
            continue
        try:
            writer.write(head)
            await writer.drain()
            sent = time.perf_counter()
            if first:
                opened.put_nowait(None)
                first = False
            waiting = asyncio.ensure_future(response(reader))
            stopping = asyncio.ensure_future(stop.wait())
            await asyncio.wait({waiting, stopping}, return_when=asyncio.FIRST_COMPLETED)
            stopping.cancel()
            if not waiting.done():
                waiting.cancel()
                return
            try:
                status: int | str = waiting.result()[0]
            except (OSError, asyncio.IncompleteReadError) as error:
                status = "closed" if isinstance(error, asyncio.IncompleteReadError) else type(error).__name__
            _emit(out, {"status": status, "seconds": round(time.perf_counter() - sent, 3), "t": time.time()})
        finally:
            writer.close()


async def readyz(
    host: str, port: int, until: float, stop: asyncio.Event, tally: dict[str, Any], opened: asyncio.Queue[None]
) -> None:
    request = f"GET /readyz HTTP/1.1\r\nhost: {host}:{port}\r\n\r\n".encode()
    reader, writer = await asyncio.open_connection(host, port)
    opened.put_nowait(None)
    try:
        while time.time() < until and not stop.is_set():
            started = time.perf_counter()
            try:
                writer.write(request)
                status, _, body = await asyncio.wait_for(response(reader), 30)
            except (TimeoutError, OSError, asyncio.IncompleteReadError) as error:
                name = type(error).__name__
                tally["errors"][name] = tally["errors"].get(name, 0) + 1
                writer.close()
                reader, writer = await asyncio.open_connection(host, port)
                continue
            tally["latencies"].append(time.perf_counter() - started)
            tally["statuses"][str(status)] = tally["statuses"].get(str(status), 0) + 1
            found = REDIS_FIELD.search(body)
            said = found.group(1).decode() if found else "none"
            tally["redis"][said] = tally["redis"].get(said, 0) + 1
    finally:
        writer.close()


async def run(args: argparse.Namespace, out: IO[str]) -> None:
    parts = urlsplit(args.url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    opened: asyncio.Queue[None] = asyncio.Queue()
    until = time.time() + args.seconds
    tally: dict[str, Any] = {"statuses": {}, "redis": {}, "errors": {}, "latencies": []}
    if args.kind == "idle-bodies":
        tasks = [asyncio.ensure_future(idle_body(host, port, stop, out, opened)) for _ in range(args.connections)]
    else:
        tasks = [asyncio.ensure_future(readyz(host, port, until, stop, tally, opened)) for _ in range(args.connections)]
    for _ in range(args.connections):
        await opened.get()
    _emit(out, {"event": "connected", "connections": args.connections, "t": time.time()})
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), max(0.0, until - time.time()))
    stop.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    if args.kind == "readyz":
        latencies = np.array(tally.pop("latencies") or [0.0]) * 1000
        _emit(
            out,
            {
                "event": "summary",
                "requests": sum(tally["statuses"].values()),
                **tally,
                "p50_ms": round(float(np.percentile(latencies, 50)), 2),
                "p99_ms": round(float(np.percentile(latencies, 99)), 2),
                "max_ms": round(float(latencies.max()), 2),
            },
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", required=True)
    parser.add_argument("--kind", choices=["idle-bodies", "readyz"], required=True)
    parser.add_argument("--connections", type=int, default=48)
    parser.add_argument("--seconds", type=float, default=3600, help="idle bodies: until SIGTERM, or this long")
    parser.add_argument("--nice", type=int, default=0, help="added to this process's niceness")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    lower_priority(args.nice)
    with args.out.open("w") as out:
        asyncio.run(run(args, out))


if __name__ == "__main__":
    main()
