"""`bench.profile` at one client, this tree against another, taking turns.

    python -m bench.profile_ab BEFORE_TREE [--rounds 6] [--seconds 6]

On a machine whose speed drifts between runs minutes apart, two separate
`bench.profile` runs compare the machine as much as the code. This starts
both trees' services at once (each on its own Redis database, both on this
tree's artifacts unless `--before-artifacts` names the other's), then
alternates short one-client wrk runs between them, swapping the order every
round, and prints each run and the medians of rps,
`overhead_ms_per_request` and the in-app time in no stage. BEFORE_TREE is a
checkout of the other commit, e.g. `git worktree add /tmp/before 3daee07`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from app.engine.kernels import cpu
from bench.latency import free_port
from bench.load import ROOT, contexts, stop, write_bodies
from bench.profile import profile_run

REDIS = "redis://127.0.0.1:6379/{db}"


def serve(tree: Path, db: int, artifacts: Path) -> tuple[subprocess.Popen[bytes], int]:
    """The service of `tree`, on its own release bundle, once /readyz answers 200."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHITCHAT_")}
    env |= {
        "CHITCHAT_ARTIFACTS_DIR": str(artifacts),
        "CHITCHAT_BUNDLE_DIR": str(tree / "models" / "release" / "chitchat"),
        "CHITCHAT_REDIS_URL": REDIS.format(db=db),
        "CHITCHAT_ORT_SPIN_ALONE": "1",
    }
    uvicorn = str(Path(sys.executable).parent / "uvicorn")
    command = [uvicorn, "app.main:create_app", "--factory", "--port", str(port), "--no-access-log"]
    server = subprocess.Popen(
        command, cwd=tree, env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    started = time.perf_counter()
    while time.perf_counter() - started < 300:
        if server.poll() is not None:
            raise SystemExit(f"{tree}: the service exited with {server.returncode}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                return server, port
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    stop(server)
    raise SystemExit(f"{tree}: not ready in 300 s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before", type=Path, help="a checkout of the commit to compare against")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--seconds", type=int, default=6, help="per run")
    parser.add_argument("--artifacts", type=Path, default=ROOT / "artifacts")
    parser.add_argument(
        "--before-artifacts",
        type=Path,
        default=None,
        help="the tree before's (its own index version); default: --artifacts",
    )
    args = parser.parse_args()

    trees = {"before": args.before.resolve(), "after": ROOT}
    artifacts = {"before": args.before_artifacts or args.artifacts, "after": args.artifacts}
    servers = {name: serve(tree, 13 + i, artifacts[name]) for i, (name, tree) in enumerate(trees.items())}
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    try:
        with tempfile.TemporaryDirectory() as scratch:
            bodies = write_bodies(Path(scratch) / "bodies.txt", contexts()[:5000])
            nonce = os.urandom(3).hex()
            for name, (_, port) in servers.items():  # warm-up, unmeasured
                profile_run(f"http://127.0.0.1:{port}", port, 4, 4, bodies, f"w{name}{nonce}")
            for r in range(args.rounds):
                for name in list(trees) if r % 2 == 0 else list(trees)[::-1]:
                    port = servers[name][1]
                    run = profile_run(f"http://127.0.0.1:{port}", port, 1, args.seconds, bodies, f"r{r}{name}{nonce}")
                    runs[name].append(
                        {
                            "rps": run["rps"],
                            "overhead_ms": run["overhead_ms_per_request"],
                            "no_stage_ms": run["unattributed_in_app_ms"],
                        }
                    )
                    print(name, runs[name][-1], flush=True)
    finally:
        for server, _ in servers.values():
            stop(server)
    info = cpu()
    print(f"\n{info['model']}, {os.cpu_count()} cores, VNNI: {info['vnni']}; {args.rounds} rounds of {args.seconds} s")
    for name, rows in runs.items():
        medians = {key: round(statistics.median(row[key] for row in rows), 3) for key in rows[0]}
        ranges = {key: (min(row[key] for row in rows), max(row[key] for row in rows)) for key in rows[0]}
        print(f"{name}: medians {medians}; ranges {ranges}")


if __name__ == "__main__":
    main()
