"""What the chaos scenarios drive: a redis-server of their own, the service in
a process of its own, and the load generator (`traffic.py`) in a third."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import redis

from bench.service import free_port

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "chaos-admin-token"


def wait_for(probe: Any, timeout_s: float, every_s: float = 0.05) -> float:
    """Seconds until probe() is true; raises TimeoutError."""
    started = time.perf_counter()
    while time.perf_counter() - started < timeout_s:
        try:
            if probe():
                return time.perf_counter() - started
        except Exception:  # a probe that cannot connect yet is a no
            pass
        time.sleep(every_s)
    raise TimeoutError(f"not true after {timeout_s}s: {probe}")


class RedisServer:
    def __init__(self, *args: str) -> None:
        self.port = free_port()
        self.args = list(args)  # e.g. "--maxmemory", "2mb", "--maxmemory-policy", "allkeys-lru"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, socket_timeout=2)

    def start(self) -> None:
        command = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        command += self.args
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL)
        wait_for(lambda: self.client().ping(), 10)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()

    def pause(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)

    def clients(self) -> int:
        return int(self.client().info("clients")["connected_clients"])

    def evicted(self) -> int:
        return int(self.client().info("stats")["evicted_keys"])


@dataclass
class Service:
    artifacts: Path
    redis_url: str | None
    env: dict[str, str] = field(default_factory=dict)
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None
    log: Path | None = None
    preexec: Any = None  # e.g. to set a resource limit in the child

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, wait: bool = True) -> float:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CHITCHAT_")}
        # The scenario's own settings win over these defaults (scenario 9 turns admin off).
        env.update(
            {
                "CHITCHAT_ARTIFACTS_DIR": str(self.artifacts),
                "CHITCHAT_ADMIN_TOKEN": TOKEN,
                "CHITCHAT_LOG_LEVEL": "warning",
                **({"CHITCHAT_REDIS_URL": self.redis_url} if self.redis_url else {}),
                **self.env,
            }
        )
        command = [sys.executable, "-m", "uvicorn", "app.main:create_app", "--factory", "--host", "127.0.0.1"]
        command += ["--port", str(self.port), "--no-access-log", "--timeout-graceful-shutdown", "20"]
        self.log = self.artifacts.parent / f"service-{self.port}.log"
        started = time.perf_counter()
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                command, cwd=ROOT, env=env, stdout=log, stderr=log, start_new_session=True, preexec_fn=self.preexec
            )
        if wait:
            self.wait_ready()
        return time.perf_counter() - started

    def wait_ready(self, timeout_s: float = 120) -> float:
        return wait_for(lambda: httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200, timeout_s, 0.1)

    def signal(self, sig: signal.Signals) -> None:
        assert self.process is not None
        self.process.send_signal(sig)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=40)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def status(self) -> dict[str, int]:
        """Resident memory (kB), threads and open file descriptors of the server process."""
        assert self.process is not None
        fields = dict(
            line.split(":", 1)
            for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines()
            if ":" in line
        )
        fds = len(os.listdir(f"/proc/{self.process.pid}/fd"))
        return {"rss_kb": int(fields["VmRSS"].split()[0]), "threads": int(fields["Threads"]), "fds": fds}

    def version(self) -> str | None:
        """The index version this replica serves, or None if it does not answer."""
        try:
            return str(httpx.get(f"{self.url}/readyz", timeout=5).json().get("index_version"))
        except (httpx.HTTPError, ValueError):
            return None

    def metric(self, name: str) -> float:
        for line in httpx.get(f"{self.url}/metrics", timeout=10).text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        raise RuntimeError(f"no {name} in /metrics")

    def cache_kb(self) -> int:
        """The in-process embedding cache, in kB, from the service's metrics."""
        for line in httpx.get(f"{self.url}/metrics", timeout=10).text.splitlines():
            if line.startswith("chitchat_cache_local_bytes "):
                return int(float(line.split()[1]) / 1024)
        raise RuntimeError("no chitchat_cache_local_bytes in /metrics")

    def admin(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        headers = {"authorization": f"Bearer {TOKEN}", **kwargs.pop("headers", {})}
        return httpx.request(method, f"{self.url}{path}", headers=headers, timeout=60, **kwargs)

    def wait_job(self, job_id: str, timeout_s: float = 600) -> dict[str, Any]:
        """The job once it succeeded or failed, or as it last stood after timeout_s (then `timed_out`);
        `waited_s` either way."""
        job: dict[str, Any] = {"id": job_id, "state": "unknown"}
        started = time.perf_counter()
        while True:
            with contextlib.suppress(httpx.HTTPError, ValueError):  # a slow answer under load: ask again
                job = self.admin("GET", f"/admin/jobs/{job_id}").json()
            if job.get("state") in ("succeeded", "failed"):
                break
            if time.perf_counter() - started >= timeout_s:
                job["timed_out"] = True
                break
            time.sleep(0.25)
        job["waited_s"] = round(time.perf_counter() - started, 1)
        return job


def link_or_copy(source: str, target: str) -> None:
    """Index files are immutable: a hard link costs nothing; across filesystems (a /tmp of its own), a copy."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def chaos_artifacts(source: Path, target: Path, bundle_checksum: str) -> Path:
    """A private artifacts dir holding the index version built for the bundle (hard links: versions are immutable)."""
    from core.store import IndexStore

    store = IndexStore(source / "indexes")
    version = store.latest_for(bundle_checksum)
    if version is None:
        raise SystemExit(f"no index for the release bundle under {source}: run `make index` first")
    shutil.rmtree(target, ignore_errors=True)
    (target / "indexes").mkdir(parents=True)
    shutil.copytree(store.path(version), target / "indexes" / version, copy_function=link_or_copy)
    (target / "indexes" / "CURRENT").write_text(version + "\n")
    return target


def spawn_client(command: list[str]) -> subprocess.Popen[bytes]:
    """A load or attack client in a session of its own, as the service is. The kernel's autogroups share
    the cores between sessions first, so each client and the service compete as two programs, whatever
    else the harness's session runs; an attacker also lowers its own group (attackers.py)."""
    return subprocess.Popen(command, cwd=ROOT, start_new_session=True)


def traffic(url: str | list[str], out: Path, **options: Any) -> subprocess.Popen[bytes]:
    """`bench.chaos.traffic` against one service, or several replicas (a list of URLs)."""
    urls = [url] if isinstance(url, str) else url
    command = [sys.executable, "-m", "bench.chaos.traffic", "--url", *urls, "--out", str(out)]
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        command += [flag, *(str(v) for v in value)] if isinstance(value, list | tuple) else [flag, str(value)]
    return spawn_client(command)


def flood(url: str, out: Path, seconds: float, connections: int) -> subprocess.Popen[bytes]:
    """`bench.chaos.flood`: many connections on a client that times the server, not itself."""
    command = [sys.executable, "-m", "bench.chaos.flood", "--url", url, "--out", str(out)]
    command += ["--seconds", str(seconds), "--connections", str(connections)]
    return spawn_client(command)


def attack(url: str, out: Path, kind: str, threads: int, nice: int) -> subprocess.Popen[bytes]:
    """`bench.chaos.attackers`: `threads` attackers of one kind until terminated, at `nice`."""
    command = [sys.executable, "-m", "bench.chaos.attackers", "--url", url, "--out", str(out), "--kind", kind]
    command += ["--threads", str(threads), "--nice", str(nice)]
    return spawn_client(command)


def rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def summary(results: list[dict[str, Any]]) -> dict[str, Any]:
    answered = [r for r in results if isinstance(r["status"], int)]
    latencies = np.array([r["latency_ms"] for r in answered]) if answered else np.zeros(1)
    return {
        "requests": len(results),
        "ok_200": sum(r["status"] == 200 for r in results),
        "share_200": round(sum(r["status"] == 200 for r in results) / max(1, len(results)), 4),
        "status_5xx": sum(isinstance(r["status"], int) and r["status"] >= 500 for r in results),
        "status_429": sum(r["status"] == 429 for r in results),
        "transport_errors": sum(not isinstance(r["status"], int) and r["status"] != "cancelled" for r in results),
        "p50_ms": round(float(np.percentile(latencies, 50)), 1),
        "p99_ms": round(float(np.percentile(latencies, 99)), 1),
        "max_ms": round(float(latencies.max()), 1),
    }
