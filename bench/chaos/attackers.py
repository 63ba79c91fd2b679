"""The attack beside scenarios 23 and 24, in a process of its own.

    python -m bench.chaos.attackers --url URL --kind admin-bodies --threads 8 --nice 19 --out attacks.jsonl

Each thread sends its kind of request without pause until SIGTERM; one JSON
line per request (status, or the exception's name, and latency) is written as
it goes.

Why a process of its own, and why `--nice`: on a deployment the attacker's
client runs on the attacker's machine, and what the service spends on the
attack is what the bar is about. Here everything shares two cores, and 23's
client spends about 6 ms of its own CPU on each 32 MiB POST, nearly all of it
user time (alone: 375 user and 26 system ticks in 4 s, ~150 POSTs a second). At
nice 19 alone that did not yield: the kernel's autogroups share
the cores between sessions first, and a thread's nice orders it only within its
session's group. The service runs in a session of its own, and the attacker ran
in the harness's, so the group got half the machine and the attacker took 0.81
core-s/s, 0.39 of it from the service (1.50 -> 1.11; p99 ratio 1.97x to 2.78x).
It now starts in a session of its own and lowers its own autogroup to its nice:
then it took 0.45, mostly what was idle, the service kept 1.43 and the ratio read
1.06x (reports/chaos.md has the run since).

Scenario 24's attack is `/reply` requests, whose cost is the service's, so it
runs at nice 0, in a group of the same weight as the service's; its control (`filtered`) is the same requests
without `exclude_ids`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import httpx

ADMIN_BODY_BYTES = 32 * 2**20  # the largest admin upload the service accepts
RARE = 200  # scenario 24's candidates with the tag its filter asks for


def rare_candidates() -> list[dict[str, Any]]:
    """The tagged candidates scenario 24 uploads; its attack asks for them by their tag."""
    return [
        {"query": f"what about the rare thing {i}?", "reply": f"the rare answer {i}", "id": f"rare-{i}"}
        | {"tags": ["rare"]}
        for i in range(RARE)
    ]


def admin_bodies(url: str, seed: int) -> Callable[[httpx.Client], int]:
    """Scenario 23's attack: a 32 MiB upload with no token."""
    body = b'{"reply": "x"}\n' * (ADMIN_BODY_BYTES // 15)
    headers = {"content-type": "application/x-ndjson"}
    return lambda client: client.post(f"{url}/admin/candidates", content=body, headers=headers).status_code


def _filtered(url: str, seed: int, excluded: int) -> Callable[[httpx.Client], int]:
    lines = [c["query"] for c in rare_candidates()]  # not the replies: one that repeats the context is never served
    rng = random.Random(seed)

    def send(client: httpx.Client) -> int:
        body: dict[str, Any] = {"context": [rng.choice(lines)], "filter": {"tags_any": ["rare"]}}
        if excluded:
            body["exclude_ids"] = [uuid.uuid4().hex for _ in range(excluded)]
        return client.post(f"{url}/reply", json=body).status_code

    return send


def exclude_ids(url: str, seed: int) -> Callable[[httpx.Client], int]:
    """Scenario 24's attack: a selective filter and 256 made-up ids to exclude, fresh each time."""
    return _filtered(url, seed, 256)


def filtered(url: str, seed: int) -> Callable[[httpx.Client], int]:
    """Scenario 24's control: the same requests without `exclude_ids`, what any caller may send."""
    return _filtered(url, seed, 0)


KINDS = {"admin-bodies": admin_bodies, "exclude-ids": exclude_ids, "filtered": filtered}


def attacker(send: Callable[[httpx.Client], int], stop: threading.Event, out: IO[str], lock: threading.Lock) -> None:
    with httpx.Client(timeout=30) as client:
        while not stop.is_set():
            started = time.perf_counter()
            try:
                status: int | str = send(client)
            except httpx.HTTPError as error:  # the server closed the connection on an unread body
                status = type(error).__name__
            row = {"status": status, "latency_ms": round((time.perf_counter() - started) * 1000, 2)}
            with lock:
                out.write(json.dumps(row) + "\n")
                out.flush()  # the harness reads the first line as "the attack is under way"


def lower_priority(nice: int) -> None:
    """This process `nice` levels down, and its autogroup with it: started in a session of its own
    (harness.spawn_client), the autogroup is its own, and the scheduler shares the cores between
    autogroups first; a thread's nice orders it only within its group. Not permitted, or no
    autogroups: the threads' own nice is all there is."""
    os.nice(nice)
    if nice:
        with contextlib.suppress(OSError):
            Path("/proc/self/autogroup").write_text(f"{nice}\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", required=True)
    parser.add_argument("--kind", choices=sorted(KINDS), required=True)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--nice", type=int, default=0, help="added to this process's niceness")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    lower_priority(args.nice)
    stop, lock = threading.Event(), threading.Lock()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with args.out.open("w") as out:
        threads = [
            threading.Thread(target=attacker, args=(KINDS[args.kind](args.url, args.seed + i), stop, out, lock))
            for i in range(args.threads)
        ]
        for t in threads:
            t.start()
        while not stop.wait(0.2):
            pass
        for t in threads:
            t.join()


if __name__ == "__main__":
    main()
