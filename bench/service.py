"""What the benchmarks share: the service on a free loopback port, started and waited for, the CPU
it runs on, and held-out contexts to send it.

Standard library only at import: bench/first_run.py runs before anything is installed."""

from __future__ import annotations

import http.client
import os
import random
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(
    port: int, *options: str, env: Mapping[str, str] | None = None, quiet: bool = True
) -> subprocess.Popen[bytes]:
    """`uvicorn app.main:create_app` on 127.0.0.1:`port`, from the repository root. `options`: more of
    uvicorn's; `env`: the whole environment (default: this one's); `quiet`: its output dropped."""
    command = [sys.executable, "-m", "uvicorn", "app.main:create_app", "--factory", "--port", str(port), *options]
    output = subprocess.DEVNULL if quiet else None
    return subprocess.Popen(command, cwd=ROOT, env=None if env is None else dict(env), stdout=output, stderr=output)


def wait_ready(
    url: str, server: subprocess.Popen[bytes] | None = None, timeout_s: float = 120, every_s: float = 0.2
) -> float:
    """Seconds until `url` (a /readyz) answers 200. RuntimeError if `server` exits first, TimeoutError
    past `timeout_s`."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if server is not None and server.poll() is not None:
            raise RuntimeError(f"the server exited with {server.returncode} before it was ready")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return time.monotonic() - started
        except (OSError, http.client.HTTPException):  # not listening yet, or 503 while it loads
            pass
        time.sleep(every_s)
    raise TimeoutError(f"{url} not ready after {timeout_s:g}s")


def cpu_description() -> str:
    """The CPU model, and whether it has VNNI: int8 speed and int8 saturation both depend on it."""
    from core.machine import cpu

    found = cpu()  # what the service reports in /info, read the same way
    return f"{found['model']}, {os.cpu_count()} cores, {'with VNNI' if found['vnni'] else 'no VNNI'}"


def test_contexts(n: int, max_turns: int, seed: int = 0) -> list[list[str]]:
    """`n` held-out (test split) chitchat contexts, drawn at random."""
    from index.corpus import load_pairs

    pairs = load_pairs("test", max_turns)
    rng = random.Random(seed)
    chosen = rng.sample(pairs, min(n, len(pairs)))
    # Clients send at most 1000 characters a turn (the API limit).
    return [[turn[:1000] for turn in p.context] for p in chosen]
