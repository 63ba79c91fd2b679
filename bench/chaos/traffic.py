"""The chaos suite's load generator, run in a process of its own.

    python -m bench.chaos.traffic --url URL --seconds 60 --clients 8 --out results.jsonl

Each client alternates between plain contexts (held-out chitchat turns) and
its own sessions. Session messages carry their session's marker and number
("[s3 m7] ..."), so the suite can later check from Redis that every turn is
stored, in order, in the right session. A plain context's last turn ends with
a tag no other request carries, so no request is answered from the embedding
cache (the worst case, and the same for every run), except the --repeat-share
of them that repeat one of 100 popular one-line contexts: short lines, which
are what people repeat and what the embedding cache shares across replicas.
A client's sessions each get a message before any gets a second, so all are
open after its first --sessions-per-client session messages.
With --turns-per-session N a session is retired after N messages in this run
and the client goes on with a fresh one (ids continue s0, s1, ... in
retirement order, so a second run with the same tag continues the first
run's sessions first): the service keeps a window of turns per session,
and the suite must see every turn to check it.
With --timeout-ms LOW HIGH each request gives up after a random time in that
range, as an impatient client does (with --cancel-share P, only that share of
requests). Several --url values are replicas: a session's messages go to them
in turn (message n to replica n mod count), plain contexts round-robin. One JSON line per request: start time,
latency, status (or the exception's name), and what the response named.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import time
from pathlib import Path
from typing import Any

import httpx

from app.engine.cache import SHARED_MAX_CHARS
from index.corpus import load_pairs


def turns(seed: int) -> list[list[str]]:
    pairs = load_pairs("test", 3)
    random.Random(seed).shuffle(pairs)
    return [[t[:500] for t in p.context] for p in pairs]


def popular(pool: list[list[str]], count: int = 100) -> list[list[str]]:
    """One-line contexts of the pool's short turns ("hi", "lol", "what about you?"). A joined
    multi-turn context is never repeated by real traffic, so the cache keeps it in the process."""
    short = dict.fromkeys(t for context in pool for t in context if 0 < len(t) <= SHARED_MAX_CHARS)
    return [[t] for t in list(short)[:count]]


async def client_loop(
    index: int, urls: list[str], until: float, count: int | None, args: argparse.Namespace, pool: list[list[str]]
) -> list[dict[str, Any]]:
    rng = random.Random(args.seed * 1000 + index)
    repeated = popular(pool)
    rows: list[dict[str, Any]] = []
    slots = [f"chaos-{args.tag}-c{index}-s{j}" for j in range(args.sessions_per_client)]
    next_session = len(slots)
    unopened = list(range(len(slots)))  # each slot gets its first message before any gets a second
    sent: dict[str, int] = {}  # session -> messages sent to it in this run
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    clients = [httpx.AsyncClient(base_url=url, timeout=30, limits=limits) for url in urls]
    try:
        n = 0
        while time.time() < until and (count is None or n < count):
            n += 1
            row: dict[str, Any] = {"client": index, "t": time.time()}
            if rng.random() < args.session_share:
                slot = unopened.pop(0) if unopened else rng.randrange(len(slots))
                if args.turns_per_session and sent.get(slots[slot], 0) >= args.turns_per_session:
                    slots[slot] = f"chaos-{args.tag}-c{index}-s{next_session}"  # retired: a fresh session
                    next_session += 1
                session = slots[slot]
                number = args.message_offset + sent.get(session, 0)
                sent[session] = sent.get(session, 0) + 1
                row.update(session=session, message=number)
                body = {"session_id": session, "message": f"[{session} m{number}] {rng.choice(pool)[-1]}"}
                target = number % len(clients)
            elif rng.random() < args.repeat_share:
                body = {"context": rng.choice(repeated)}  # a cache hit after the first
                target = n % len(clients)
            else:
                *earlier, last = rng.choice(pool)
                body = {"context": [*earlier, f"{last} #{args.tag}c{index}n{n}s{args.seed}"]}  # never a cache hit
                target = n % len(clients)
            client = clients[target]
            impatient = args.timeout_ms and rng.random() < args.cancel_share
            timeout = rng.uniform(*args.timeout_ms) / 1000 if impatient else None
            started = time.perf_counter()
            try:
                response = await asyncio.wait_for(client.post("/reply", json=body), timeout)
                row["status"] = response.status_code
                if response.status_code == 200:
                    answer = response.json()
                    row.update(index_version=answer["index_version"], reply=answer["reply"], source=answer["source"])
                else:
                    row["error"] = response.text[:200]
                    row["retry_after"] = response.headers.get("retry-after")
            except TimeoutError:
                row["status"] = "cancelled"  # the client gave up; the connection is dropped
                # ... with its client: a pool whose request was cancelled mid-flight can hang the next one.
                clients[target] = httpx.AsyncClient(base_url=urls[target], timeout=30, limits=limits)
                await _close_quietly(client)
            except httpx.HTTPError as error:
                row["status"] = type(error).__name__
            row["latency_ms"] = round((time.perf_counter() - started) * 1000, 2)
            rows.append(row)
            if args.pause_ms:
                await asyncio.sleep(rng.uniform(0, 2 * args.pause_ms) / 1000)
    finally:
        for client in clients:
            await client.aclose()
    return rows


async def _close_quietly(client: httpx.AsyncClient) -> None:
    with contextlib.suppress(Exception):
        await asyncio.wait_for(client.aclose(), 1)


async def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    pool = turns(args.seed)
    until = time.time() + args.seconds
    per_client = None if args.requests is None else -(-args.requests // args.clients)
    results = await asyncio.gather(
        *(client_loop(i, args.url, until, per_client, args, pool) for i in range(args.clients))
    )
    return [row for rows in results for row in rows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", required=True, nargs="+", help="one service, or several replicas")
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--requests", type=int, help="stop after this many in all (before --seconds, if sooner)")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--session-share", type=float, default=0.5)
    parser.add_argument("--sessions-per-client", type=int, default=3, help="sessions a client talks to at once")
    parser.add_argument("--turns-per-session", type=int, help="retire a session after this many messages (this run)")
    parser.add_argument("--timeout-ms", type=float, nargs=2, help="give up after a random time in [LOW, HIGH]")
    parser.add_argument("--repeat-share", type=float, default=0.0, help="share of 100 short popular lines")
    parser.add_argument("--cancel-share", type=float, default=1.0, help="share of requests --timeout-ms applies to")
    parser.add_argument("--pause-ms", type=float, default=0, help="mean pause between a client's requests")
    parser.add_argument("--tag", default="run", help="part of every session id, so runs do not share sessions")
    parser.add_argument("--message-offset", type=int, default=0, help="first message number, to continue sessions")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    rows = asyncio.run(run(args))
    args.out.write_text("".join(json.dumps(r) + "\n" for r in rows))


if __name__ == "__main__":
    main()
