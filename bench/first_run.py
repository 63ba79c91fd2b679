"""A new user's first `make run`: clone, install, build the index, serve, until /readyz says 200.

    python3 -m bench.first_run                   # clones HEAD of this repository
    python3 -m bench.first_run --worktree        # copies the working tree instead (uncommitted changes too)

Standard library only, so it runs before anything is installed. Each phase is
the Makefile's own target, timed: `make install` (the venv and the service's
packages: no torch), `make index` (the chitchat index for the release
bundle), then `make serve` until /readyz answers 200. pip's download cache is
whatever this machine has; the report says so. Writes reports/first_run.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
READY_TIMEOUT_S = 600


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def checkout(target: Path, worktree: bool) -> str:
    if worktree:
        listed = subprocess.run(
            ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True, check=True
        ).stdout.decode()
        for name in filter(None, listed.split("\0")):
            source = ROOT / name
            if source.is_file():
                (target / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, target / name)
        return "working tree"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(target)], check=True)
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=target, capture_output=True, text=True)
    return f"git clone at {head.stdout.strip()}"


def timed(label: str, command: list[str], cwd: Path, env: dict[str, str]) -> float:
    started = time.perf_counter()
    print(f"[first-run] {label}: {' '.join(command)}", flush=True)
    subprocess.run(command, cwd=cwd, env=env, check=True)
    seconds = time.perf_counter() - started
    print(f"[first-run] {label}: {seconds:.1f}s", flush=True)
    return seconds


def wait_ready(url: str, server: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"the server exited with {server.returncode} before it was ready")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{url} not ready after {READY_TIMEOUT_S}s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worktree", action="store_true", help="copy the working tree rather than clone HEAD")
    parser.add_argument("--out", type=Path, default=ROOT / "reports" / "first_run.json")
    parser.add_argument("--keep", action="store_true", help="keep the temporary checkout")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="chitchat-first-run-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHITCHAT_") and k != "VIRTUAL_ENV"}
    server = None
    try:
        started = time.perf_counter()
        source = checkout(workdir, args.worktree)
        clone_s = time.perf_counter() - started
        install_s = timed("install", ["make", "install"], workdir, env)
        index_s = timed("index", ["make", "index"], workdir, env)
        port = free_port()
        serve_started = time.perf_counter()
        command = ["make", "serve", f"PORT={port}", "HOST=127.0.0.1"]
        server = subprocess.Popen(command, cwd=workdir, env=env, start_new_session=True)
        wait_ready(f"http://127.0.0.1:{port}/readyz", server)
        ready_s = time.perf_counter() - serve_started
        total_s = time.perf_counter() - started
        report = {
            "source": source,
            "cores": os.cpu_count(),
            "machine": platform.machine(),
            "pip_cache": "warm" if Path.home().joinpath(".cache", "pip").is_dir() else "cold",
            "seconds": {
                "clone": round(clone_s, 1),
                "install": round(install_s, 1),
                "index": round(index_s, 1),
                "serve_to_ready": round(ready_s, 1),
                "total": round(total_s, 1),
            },
            "target_seconds": 180,
            "pass": total_s <= 180,
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")
        print(json.dumps(report, indent=2))
    finally:
        if server is not None and server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=30)
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
