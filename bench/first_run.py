"""A new user's first `make run`: clone, install, a first slice of the index, serve, the first
answer, then the full index the service builds behind it.

    python3 -m bench.first_run                   # clones HEAD of this repository
    python3 -m bench.first_run --worktree        # copies the working tree instead (uncommitted changes too)

Standard library only, so it runs before anything is installed. Each phase is
the Makefile's own target, timed: `make install` (the venv and the service's
packages: no torch), `make first-slice` (the replies that answer the most
contexts), then `make serve`: /readyz, the first `/reply` answered, and
/info's `first_build` until the full index serves. Times after the install are
counted from its end (the bar: the first answer within 60 s). pip's download
cache is whatever this machine has; the report says so, and names the CPU and
whether it has VNNI. Writes reports/first_run.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from bench.service import free_port, wait_ready

ROOT = Path(__file__).resolve().parents[1]
READY_TIMEOUT_S = 600
FULL_TIMEOUT_S = 1800  # the full build on a slow CPU without VNNI: ~10 minutes, more under load


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


def post(url: str, body: dict[str, object]) -> dict[str, object]:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return dict(json.loads(response.read()))


def wait_full(url: str, server: subprocess.Popen[bytes]) -> dict[str, object]:
    """/info's index once the service's build behind the first slice is done (its `first_build`)."""
    deadline = time.monotonic() + FULL_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"the server exited with {server.returncode} before the full index served")
        with urllib.request.urlopen(f"{url}/info", timeout=10) as response:
            info = json.loads(response.read())
        building = info.get("first_build") or {"state": "done"}
        if building["state"] in ("done", "dropped"):
            return {k: info["index"][k] for k in ("version", "replies", "source")}
        time.sleep(2)
    raise TimeoutError(f"the full index did not serve within {FULL_TIMEOUT_S}s")


def cpu() -> str:
    """The CPU's model and whether it has VNNI, from /proc/cpuinfo (int8 runs 2-3x apart on the two)."""
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    model = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), "?")
    return f"{model}, {'with' if 'vnni' in info else 'without'} VNNI"


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
        installed = time.perf_counter()
        slice_s = timed("first slice", ["make", "first-slice"], workdir, env)
        port = free_port()
        command = ["make", "serve", f"PORT={port}", "HOST=127.0.0.1"]
        server = subprocess.Popen(command, cwd=workdir, env=env, start_new_session=True)
        url = f"http://127.0.0.1:{port}"
        wait_ready(f"{url}/readyz", server, READY_TIMEOUT_S)
        ready_s = time.perf_counter() - installed
        answer = post(f"{url}/reply", {"context": ["hi! how was your weekend?"]})
        first_reply_s = time.perf_counter() - installed
        print(f"[first-run] first answer {first_reply_s:.1f}s after the install: {answer.get('reply')!r}", flush=True)
        full = wait_full(url, server)
        full_s = time.perf_counter() - installed
        total_s = time.perf_counter() - started
        report = {
            "source": source,
            "cpu": cpu(),
            "cores": os.cpu_count(),
            "machine": platform.machine(),
            "pip_cache": "warm" if Path.home().joinpath(".cache", "pip").is_dir() else "cold",
            "seconds": {
                "clone": round(clone_s, 1),
                "install": round(install_s, 1),
                "first_slice": round(slice_s, 1),
                "ready_after_install": round(ready_s, 1),
                "first_reply_after_install": round(first_reply_s, 1),
                "full_index_serving_after_install": round(full_s, 1),
                "total": round(total_s, 1),
            },
            "full_index": full,
            "first_reply_bar_s": 60,
            "first_reply_met": first_reply_s <= 60,
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
