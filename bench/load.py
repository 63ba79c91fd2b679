"""`make bench-load`: the service against a naive one, under wrk, on loopback.

    python -m bench.load [--duration 20] [--clients 1 32] [--bundle DIR] [--artifacts DIR] [--spin]
                         [--modes cold session stateless]

Starts the service on a bundle (default: the release bundle; any bundle with
an index under --artifacts, so the bench runs before a release exists) and
that index (about 96k chitchat replies), then the naive service
(`bench/naive.py`: sentence-transformers in PyTorch, FAISS exact search, one
FastAPI route) on the same index version's replies, one after the other, and
drives each with wrk (`bench/load.lua`) at each client count. Every request
is a multi-turn context from the held-out conversations, and the script ends
its last turn with a tag no other request carries (run, thread, counter), so
however many requests a run sends, neither the context nor the last
utterance repeats and nothing is served from a cache. Also measured for the
service: seconds from process start to /readyz 200 with the artifacts
present, and resident memory after the load. Writes reports/load.md and
reports/load.json.

Three modes (`--modes`):

- cold: the above; no turn was seen before, so every request encodes its whole window;
- session: each wrk thread holds one connection and plays held-out conversations turn by turn
  through `session_id` (bench/conversation.lua): the user's lines are the conversation's own, the
  bot's are the service's answers;
- stateless: the same conversations, the client sending the growing context (its lines and the
  answers it got, the newest 10) with every request.

A bundle with a combiner serves per turn; it is also run served the joined way
(CHITCHAT_JOINED_CONTEXT=1, "project-joined") in the same run, so the two ways compare on one
CPU. The naive services take cold and stateless requests (they encode the joined window each time).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from app.config import Settings
from bench.service import cpu_description, free_port, wait_ready
from core.bundle import RELEASE_BUNDLE, open_bundle
from core.store import IndexStore
from index.corpus import load_pairs

ROOT = Path(__file__).resolve().parents[1]
WARMUP = 500  # contexts for an unmeasured first run, which pays for lazy initialisation
# The API takes at most 1000 characters a turn; load.lua appends a tag of up to ~30 to the last one.
MAX_TURN_CHARS = 960


def contexts(max_turns: int = 3) -> list[list[str]]:
    """Distinct multi-turn contexts from the held-out splits, shuffled once (seed 0)."""
    import random

    seen: set[str] = set()
    unique = []
    for split in ("test", "validation"):
        for pair in load_pairs(split, max_turns):  # type: ignore[arg-type]
            turns = [t[:MAX_TURN_CHARS] for t in pair.context]
            key = "\x1f".join(turns)
            if len(turns) >= 2 and key not in seen:
                seen.add(key)
                unique.append(turns)
    random.Random(0).shuffle(unique)
    return unique


def start(command: list[str], port: int, env: dict[str, str]) -> tuple[subprocess.Popen[bytes], float]:
    """Starts a server; returns it and the seconds until /readyz answered 200."""
    started = time.perf_counter()
    server = subprocess.Popen(command, cwd=ROOT, env=env, start_new_session=True, stdout=subprocess.DEVNULL)
    wait_ready(f"http://127.0.0.1:{port}/readyz", server, timeout_s=900, every_s=0.1)
    return server, time.perf_counter() - started


def stop(server: subprocess.Popen[bytes]) -> None:
    if server.poll() is None:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)


def rss_mb(pid: int) -> float:
    """Resident memory of a process and its children (uvicorn runs in-process; make would not)."""
    total = 0
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            text = status.read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
        if int(fields.get("Tgid", "0").strip() or 0) == pid or fields.get("PPid", "").strip() == str(pid):
            total += int(fields.get("VmRSS", "0 kB").split()[0] or 0)
    return total / 1024


# A server without /metrics (the naive ones) gets this long to finish what a run left queued.
SETTLE_S = 5.0


def settle(port: int, timeout_s: float = 60.0) -> None:
    """Waits until the server has answered what the run before left in flight. A run that starts on
    that backlog is refused at first (429, at once, as often as the client asks again): a joined
    session run at one client once read 689 such answers of its 1,357 requests, after a 32-client
    run. The project's /metrics says when it is done (`chitchat_in_flight`)."""
    url = f"http://127.0.0.1:{port}/metrics"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            answer = httpx.get(url, timeout=5)
        except httpx.HTTPError:
            answer = None
        if answer is None or answer.status_code != 200 or "chitchat_in_flight" not in answer.text:
            time.sleep(SETTLE_S)
            return
        if re.search(r"^chitchat_in_flight 0(\.0)?$", answer.text, re.MULTILINE):
            return
        time.sleep(0.2)


def wrk(port: int, clients: int, duration: int, bodies: Path, tag: str, mode: str = "cold") -> dict[str, Any]:
    """mode: "cold" (bench/load.lua, one thread), or "session" / "stateless" (bench/conversation.lua,
    a thread a client, so that each plays its conversations in order). Starts once the server has
    settled (`settle`); rps counts the answers (2xx) only: a refusal is no answer, and a fast one."""
    settle(port)
    if mode == "cold":
        threads, script, extra = 1, "load.lua", [str(bodies), tag]
    else:
        threads, script, extra = clients, "conversation.lua", [str(bodies), mode, tag, str(clients)]
    command = [
        "wrk",
        f"-t{threads}",
        f"-c{clients}",
        f"-d{duration}s",
        "--timeout",
        "10s",
        "-s",
        str(ROOT / "bench" / script),
        f"http://127.0.0.1:{port}",
        "--",
        *extra,
    ]
    output = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    figures = json.loads(output.strip().splitlines()[-1])
    seconds = figures["duration_us"] / 1e6
    return {
        "rps": round((figures["requests"] - figures["non_2xx"]) / seconds, 1),
        "p50_ms": round(figures["p50_us"] / 1000, 2),
        "p99_ms": round(figures["p99_us"] / 1000, 2),
        "max_ms": round(figures["max_us"] / 1000, 2),
        "errors": figures["errors"],
        "non_2xx": figures["non_2xx"],  # of the errors, answers other than 2xx (the rest: socket errors, timeouts)
        "requests": figures["requests"],
    }


def conversations() -> list[list[str]]:
    """The held-out conversations' user lines (their turns at even positions), shuffled once (seed 1)."""
    import random

    from index.corpus import load_conversations, split_of

    held_out = [c for c in load_conversations() if split_of(c.id) in ("test", "validation")]
    played = [[t[:MAX_TURN_CHARS] for t in c.turns[::2]] for c in held_out]
    played = [c for c in played if len(c) >= 2]
    random.Random(1).shuffle(played)
    return played


def write_conversations(path: Path, chosen: list[list[str]]) -> Path:
    """One conversation a line: its user lines JSON-escaped (no tab survives escaping), tab-separated."""
    path.write_text("".join("\t".join(json.dumps(t)[1:-1] for t in c) + "\n" for c in chosen))
    return path


def write_bodies(path: Path, chosen: list[list[str]]) -> Path:
    """One body a line, cut open inside its last turn: load.lua closes it with the request's own tag."""
    lines = []
    for context in chosen:
        body = json.dumps({"context": context})
        assert body.endswith('"]}'), body
        lines.append(body[: -len('"]}')] + "\n")
    path.write_text("".join(lines))
    return path


def drive(
    service: str,
    command: list[str],
    env: dict[str, str],
    port: int,
    runs: list[tuple[str, int, Path]],
    duration: int,
    nonce: str,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """runs: (mode, clients, file of base contexts or of conversations); each run's tag differs, so no
    two cold requests are alike and no two runs share a session."""
    server, ready_s = start(command, port, env)
    rows = []
    try:
        for i, (mode, clients, bodies) in enumerate(runs):
            measured = wrk(port, clients, duration, bodies, f"{nonce}r{i}", mode)
            row = {"service": service, "mode": mode, "clients": clients, **measured}
            row["base_contexts" if mode == "cold" else "conversations"] = sum(1 for _ in bodies.open())
            print(f"[load] {row}", flush=True)
            rows.append(row)
        extra = {"ready_seconds": round(ready_s, 1), "rss_mb_after_load": round(rss_mb(server.pid), 1)}
    finally:
        stop(server)
    return rows, extra


def markdown(
    rows: list[dict[str, Any]],
    extra: dict[str, dict[str, Any]],
    cores: int,
    duration: int,
    bundle: str,
    version: str,
    spin: bool = False,
    machine: str = "",
) -> str:
    # What the served process reads: this environment is passed to it (CHITCHAT_RERANK_BY_DEFAULT).
    rerank = "rerank on by default" if Settings().rerank_by_default else "rerank off by default"
    settings = f"{rerank}, CHITCHAT_ORT_SPIN=1" if spin else rerank
    lines = [
        f"`/reply` under wrk on loopback, {machine or f'{cores} cores'}, shared by the server and wrk, {duration} s "
        f'per row. "project": this service on bundle {bundle} and index {version} ({settings}), per turn where '
        'the bundle has a combiner; "project-joined": the same served the joined way (CHITCHAT_JOINED_CONTEXT=1); '
        '"naive": MiniLM through sentence-transformers in PyTorch + FAISS exact search + one FastAPI route, on '
        'the same replies; "naive-e5": the same with the default encoder\'s weights in PyTorch. Modes: cold, '
        "every request a held-out multi-turn context whose last turn carries a tag no other request has (no "
        "turn seen before); session, each client plays held-out conversations turn by turn through "
        "`session_id`; stateless, the same sending the growing context (bench/conversation.lua).",
        "",
        "| service | mode | clients | rps | p50 | p99 | errors |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['service']} | {r.get('mode', 'cold')} | {r['clients']} | {r['rps']:.1f} | {r['p50_ms']:.1f} ms | "
            f"{r['p99_ms']:.1f} ms | {r['errors']} |"
        )
    lines += ["", "| ratio | mode | clients | rps | p50 |", "|---|---|---|---|---|"]
    for (ours, theirs, mode, clients), (rps, p50) in ratios(rows).items():
        lines.append(f"| {ours} / {theirs} | {mode} | {clients} | {rps:.2f}× | {p50:.2f}× |")
    p, naive = extra.get("project", {}), extra.get("naive", {})
    lines += [
        "",
        f"Project: ready {p.get('ready_seconds')} s after start with its artifacts present; resident memory "
        f"{p.get('rss_mb_after_load')} MB after the load. Naive: ready {naive.get('ready_seconds')} s.",
    ]
    return "\n".join(lines) + "\n"


def ratios(rows: list[dict[str, Any]]) -> dict[tuple[str, str, str, int], tuple[float, float]]:
    """(service, against, mode, clients) -> (rps ratio, p50 ratio) for the per-turn way against the
    joined one, and this service against each naive one, wherever both ran."""
    by = {(r["service"], r.get("mode", "cold"), r["clients"]): r for r in rows}
    pairs = [("project", "project-joined"), ("project", "naive"), ("project", "naive-e5")]
    out = {}
    for ours, theirs in pairs:
        for (service, mode, clients), row in by.items():
            other = by.get((theirs, mode, clients))
            if service == ours and other and other["rps"] and other["p50_ms"]:
                out[(ours, theirs, mode, clients)] = (row["rps"] / other["rps"], row["p50_ms"] / other["p50_ms"])
    # The naive services take no sessions: the project's session rows against their stateless ones.
    for theirs in ("naive", "naive-e5"):
        for (service, mode, clients), row in by.items():
            other = by.get((theirs, "stateless", clients))
            if service == "project" and mode == "session" and other and other["rps"] and other["p50_ms"]:
                key = ("project", f"{theirs} (stateless)", "session", clients)
                out[key] = (row["rps"] / other["rps"], row["p50_ms"] / other["p50_ms"])
    return out


def main() -> None:
    args = _arguments()
    if shutil.which("wrk") is None:
        sys.exit("wrk is not installed: apt-get install wrk")
    bundle_dir, artifacts = args.bundle.resolve(), args.artifacts.resolve()
    bundle = open_bundle(bundle_dir)
    store = IndexStore(artifacts / "indexes")
    version = store.latest_for(bundle.checksum)
    if version is None:
        sys.exit(
            f"no index for bundle {bundle.name} under {artifacts}: "
            f"python -m index --bundle {bundle_dir} --artifacts {artifacts}"
        )
    print(f"[load] bundle {bundle.name} ({bundle_dir}), index {version}", flush=True)
    envs = _environments(bundle_dir, artifacts, store.path(version), args.spin, args.own_head)
    pool, played = contexts(), conversations()
    nonce = os.urandom(3).hex()  # a fresh tag per invocation too, should a cache outlive a run
    rows: list[dict[str, Any]] = []
    extra: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        warmup = write_bodies(Path(tmp) / "warmup.jsonl", pool[:WARMUP])
        cold = "cold" in args.modes
        share = (len(pool) - WARMUP) // len(args.clients)
        runs: dict[str, list[tuple[str, int, Path]]] = {"cold": [], "session": [], "stateless": []}
        for i, clients in enumerate(args.clients):
            chosen = pool[WARMUP + i * share : WARMUP + (i + 1) * share]
            runs["cold"].append(("cold", clients, write_bodies(Path(tmp) / f"{clients}.jsonl", chosen)))
        # Each conversation run its own slice: no run meets a conversation another played.
        talk = [m for m in ("session", "stateless") if m in args.modes]
        slices = max(1, len(talk) * len(args.clients))
        size = len(played) // slices
        for j, (mode, clients) in enumerate((m, c) for m in talk for c in args.clients):
            chosen = played[j * size : (j + 1) * size]
            runs[mode].append((mode, clients, write_conversations(Path(tmp) / f"{mode}-{clients}.tsv", chosen)))
        # The first requests pay for lazy initialisation: a short unmeasured run on contexts of its own.
        for service, target in _services(
            bundle.query_prefix.startswith("query:"), bundle.combiner is not None, args
        ).items():
            port = free_port()
            command = [sys.executable, "-m", "uvicorn", *target, "--host", "127.0.0.1", "--port", str(port)]
            command += ["--no-access-log", "--log-level", "warning"]
            naive = service.startswith("naive")
            chosen_runs = (runs["cold"] if cold else []) + (
                runs["stateless"] if naive else runs["session"] + runs["stateless"]
            )
            measured, extra[service] = drive(
                service, command, envs[service], port, [("cold", 4, warmup), *chosen_runs], args.duration, nonce
            )
            rows += measured[1:]
    cores = os.cpu_count() or 0
    args.out.mkdir(parents=True, exist_ok=True)
    report = {
        "cpu": cpu_description(),
        "cores": cores,
        "duration_s": args.duration,
        "bundle": bundle.name,
        "bundle_dir": str(bundle_dir),
        "ort_spin": args.spin,
        "reaction_model": not args.own_head,  # False: each turn handed to a reaction read by the bundle's own head
        "index_version": version,
        "unique_requests": "cold: every request's last turn carries its own tag (bench/load.lua); session and "
        "stateless: each conversation played once a run (bench/conversation.lua)",
        "rows": rows,
        "ratios": [
            {
                "service": k[0],
                "against": k[1],
                "mode": k[2],
                "clients": k[3],
                "rps": round(v[0], 3),
                "p50": round(v[1], 3),
            }
            for k, v in ratios(rows).items()
        ],
        **extra,
    }
    (args.out / "load.json").write_text(json.dumps(report, indent=2) + "\n")
    (args.out / "load.md").write_text(
        markdown(rows, extra, cores, args.duration, bundle.name, version, args.spin, report["cpu"])
    )
    print((args.out / "load.md").read_text())


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=int, default=20)
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 32])
    parser.add_argument(
        "--bundle", type=Path, default=RELEASE_BUNDLE, help="the bundle to serve (default: the release)"
    )
    parser.add_argument("--artifacts", type=Path, default=ROOT / "artifacts", help="holds an index for the bundle")
    parser.add_argument("--skip-naive", action="store_true")
    parser.add_argument(
        "--naive",
        choices=("all", "minilm", "e5"),
        default="all",
        help="which naive services to run: MiniLM's takes minutes to encode its replies the first time",
    )
    parser.add_argument("--spin", action="store_true", help="serve with CHITCHAT_ORT_SPIN=1")
    parser.add_argument(
        "--own-head", action="store_true", help="no reaction model: the bundle's own head (CHITCHAT_REACTIONS_DIR='')"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "reports")
    parser.add_argument(
        "--modes", nargs="+", choices=("cold", "session", "stateless"), default=["cold", "session", "stateless"]
    )
    parser.add_argument("--no-joined", action="store_true", help="a bundle with a combiner: skip its joined run")
    return parser.parse_args()


def _environments(
    bundle_dir: Path, artifacts: Path, index_dir: Path, spin: bool, own_head: bool = False
) -> dict[str, dict[str, str]]:
    """Each service's environment, by name: this project's, and the naive services' on the same
    index version (`index_dir`)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHITCHAT_")}  # no Redis: nothing shared
    envs = {
        "project": {
            **env,
            "CHITCHAT_BUNDLE_DIR": str(bundle_dir),
            "CHITCHAT_ARTIFACTS_DIR": str(artifacts),
            "CHITCHAT_ORT_SPIN": "1" if spin else "0",
            **({"CHITCHAT_REACTIONS_DIR": ""} if own_head else {}),
        },
        # The naive service answers from the same index version's replies (its own vectors, cached by model).
        "naive": {**env, "NAIVE_INDEX_DIR": str(index_dir), "NAIVE_CACHE_DIR": str(artifacts / "bench")},
    }
    envs["project-joined"] = {**envs["project"], "CHITCHAT_JOINED_CONTEXT": "1"}
    # ... and, for an e5 bundle, the same encoder's weights in PyTorch: like against like.
    envs["naive-e5"] = {**envs["naive"], "NAIVE_MODEL": "e5"}
    return envs


def _services(e5: bool, per_turn: bool, args: argparse.Namespace) -> dict[str, list[str]]:
    """The services to measure, by name, each with its uvicorn target: this project's (served the
    joined way too, for a bundle with a combiner), and the naive ones `--skip-naive` and `--naive`
    leave (an e5 bundle has its own naive twin too)."""
    app = ["app.main:create_app", "--factory"]
    ours = {"project": app, **({"project-joined": app} if per_turn and not args.no_joined else {})}
    services = {**ours, "naive": ["bench.naive:app"]}
    if e5:
        services["naive-e5"] = ["bench.naive:app"]
    if args.skip_naive:
        return ours
    if args.naive != "all":
        wanted = {"minilm": "naive", "e5": "naive-e5"}[args.naive]
        return {k: v for k, v in services.items() if k in ours or k == wanted}
    return services


if __name__ == "__main__":
    main()
