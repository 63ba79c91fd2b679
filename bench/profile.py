"""`make bench-profile`: what each stage of a `/reply` costs, at 1 and 32 clients.

    python -m bench.profile [--duration 20] [--clients 1 32] [--redis URL] [--artifacts DIR] [--sample N]
                            [--mode cold|session|stateless]

Serves the release bundle on its index (built by `make index`), drives it
with wrk and `bench/load.lua` (every request a unique multi-turn context, so
nothing comes from the embedding cache), or, with `--mode session` or
`stateless`, with `bench/conversation.lua` as `bench.load` does (held-out
conversations played turn by turn: a per-turn bundle encodes only the new
message), and reads `chitchat_stage_seconds`
from /metrics before and after each run. Each stage's milliseconds per
request is its seconds added up over the run, divided by the requests
answered; `encode` is per encoder batch, so at 32 clients it is the batch's
cost shared by the requests in it.

`overhead_ms_per_request` at 1 client is the wall time a request takes, seen
from the client (the run's seconds over its requests: one client sends the
next as the last returns), less the onnxruntime (`encode`) and FAISS
(`search_queries`, `search_replies`) stages: the Python, HTTP and Redis
around the model. Writes reports/profile.md and reports/profile.json, with
the CPU and whether it has VNNI. `--sample N` serves N candidates drawn from
that index instead (the search stages at 11k against 97k).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from bench import reports
from bench.load import ROOT, contexts, conversations, rss_mb, start, stop, write_bodies, write_conversations, wrk
from bench.service import free_port
from core.bundle import RELEASE_BUNDLE, BundleManifest, open_bundle
from core.machine import cpu
from core.store import IndexStore

MODEL_STAGES = ("encode", "search_queries", "search_replies")  # onnxruntime and FAISS; the rest is overhead
WARMUP_S = 5  # an unmeasured run first: lazy initialisation and onnxruntime's arena growth


def stage_totals(url: str) -> tuple[dict[str, tuple[float, float]], float, float]:
    """({stage: (observations, seconds)}, /reply requests answered 200, their seconds in the app) from /metrics."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    stages: dict[str, list[float]] = {}
    answered = in_app = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith("chitchat_stage_seconds_") and sample.name.endswith(("_count", "_sum")):
                pair = stages.setdefault(sample.labels["stage"], [0.0, 0.0])
                pair[0 if sample.name.endswith("_count") else 1] = sample.value
            elif sample.name == "chitchat_http_requests_total" and sample.labels.get("route") == "/reply":
                answered += sample.value if sample.labels.get("status") == "200" else 0
            elif sample.name == "chitchat_http_request_seconds_sum" and sample.labels.get("route") == "/reply":
                in_app += sample.value if sample.labels.get("status") == "200" else 0
    return {stage: (count, total) for stage, (count, total) in stages.items()}, answered, in_app


def profile_run(
    url: str, port: int, clients: int, duration: int, bodies: Path, tag: str, mode: str = "cold"
) -> dict[str, Any]:
    before, answered_before, in_app_before = stage_totals(url)
    figures = wrk(port, clients, duration, bodies, tag, mode)
    after, answered_after, in_app_after = stage_totals(url)
    answered = answered_after - answered_before
    in_app_ms = 1000 * (in_app_after - in_app_before) / answered
    per_request = {
        stage: round(1000 * (after[stage][1] - before.get(stage, (0, 0))[1]) / answered, 3) for stage in after
    }
    calls = {stage: round((after[stage][0] - before.get(stage, (0, 0))[0]) / answered, 2) for stage in after}
    wall_ms = 1000 * clients / figures["rps"]  # each client waits for its answer before sending again
    model_ms = sum(per_request.get(s, 0.0) for s in MODEL_STAGES)
    run = {
        "clients": clients,
        **figures,
        "answered": int(answered),
        "wall_ms_per_request": round(wall_ms, 3),
        # From the request-log middleware's start to its end: what the app spent, HTTP parsing aside.
        "in_app_ms_per_request": round(in_app_ms, 3),
        "stage_ms_per_request": per_request,
        "stage_calls_per_request": calls,
        "model_ms_per_request": round(model_ms, 3),
        # The server's whole time per request at this load (its 2 cores' wall over the requests).
        "server_ms_per_request": round(1000 / figures["rps"], 3),
    }
    if clients == 1:  # stages run one after another only with one client
        run["overhead_ms_per_request"] = round(wall_ms - model_ms, 3)
        run["unattributed_in_app_ms"] = round(in_app_ms - sum(per_request.values()), 3)
    return run


def markdown(report: dict[str, Any]) -> str:
    runs = report["runs"]
    stages = sorted({s for run in runs for s in run["stage_ms_per_request"]})
    cpu_line = f"{report['cpu']['model']}, {report['cpu']['cores']} cores, VNNI: {report['cpu']['vnni']}"
    lines = [
        f"`{report['command']}` on {cpu_line}.",
        "",
        f"- index: {report['index']}",
        f"- Redis: {report['redis'] or 'none (in-process sessions and cache)'}",
        f"- mode: {report.get('mode', 'cold')} (`bench.load`'s modes)",
        f"- overhead_ms_per_request at 1 client: **{report['overhead_ms_per_request']}** "
        "(bar <= 2.0: the wall time per request less encode and the FAISS searches)",
        "",
        "| ms per request | " + " | ".join(f"{r['clients']} client(s)" for r in runs) + " |",
        "|---|" + "---|" * len(runs),
        "| wall (client) | " + " | ".join(str(r["wall_ms_per_request"]) for r in runs) + " |",
        "| p50 / p99 (client) | " + " | ".join(f"{r['p50_ms']} / {r['p99_ms']}" for r in runs) + " |",
        "| rps | " + " | ".join(str(r["rps"]) for r in runs) + " |",
        "| server ms per request (1000 / rps) | " + " | ".join(str(r["server_ms_per_request"]) for r in runs) + " |",
        "| in the app (middleware to middleware) | " + " | ".join(str(r["in_app_ms_per_request"]) for r in runs) + " |",
    ]
    for stage in stages:
        cells = [str(r["stage_ms_per_request"].get(stage, 0.0)) for r in runs]
        lines.append(f"| {stage} | " + " | ".join(cells) + " |")
    lines += [
        "| model (encode + searches) | " + " | ".join(str(r["model_ms_per_request"]) for r in runs) + " |",
        "| overhead (wall - model), 1 client | "
        + " | ".join(str(r.get("overhead_ms_per_request", "")) for r in runs)
        + " |",
        "| in the app, in no stage, 1 client | "
        + " | ".join(str(r.get("unattributed_in_app_ms", "")) for r in runs)
        + " |",
        "",
        "At more than one client the stages overlap in time, so they add up to more than the wall time "
        "per request; `encode` there is the batch's cost shared by its requests.",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=int, default=20, help="seconds per client count")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--redis", default=None, help="e.g. redis://127.0.0.1:6379/14; default: none")
    parser.add_argument("--bundle", type=Path, default=RELEASE_BUNDLE)
    parser.add_argument("--artifacts", type=Path, default=ROOT / "artifacts")
    parser.add_argument("--out", type=Path, default=ROOT / "reports" / "profile")
    parser.add_argument("--sample", type=int, default=0, help="serve N candidates sampled from the index")
    parser.add_argument("--mode", choices=("cold", "session", "stateless"), default="cold", help="as bench.load's")
    parser.add_argument(
        "--set", action="append", default=[], metavar="NAME=VALUE", help="a service setting, e.g. ort_spin_alone=0"
    )
    args = parser.parse_args()

    bundle = open_bundle(args.bundle)
    with tempfile.TemporaryDirectory() as scratch:
        if args.sample:
            from bench.chaos.__main__ import sample_artifacts

            args.artifacts, _ = sample_artifacts(args.artifacts, Path(scratch), args.sample, bundle)
        profile(args, bundle)


def profile(args: argparse.Namespace, bundle: BundleManifest) -> None:
    store = IndexStore(args.artifacts / "indexes")
    version = store.latest_for(bundle.checksum)
    if version is None:
        raise SystemExit(f"no index for {args.bundle} under {args.artifacts}: run `make index` first")
    manifest = store.load(version).manifest
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHITCHAT_")}
    env |= {"CHITCHAT_BUNDLE_DIR": str(args.bundle), "CHITCHAT_ARTIFACTS_DIR": str(args.artifacts)}
    if args.redis:
        env["CHITCHAT_REDIS_URL"] = args.redis
    for setting in args.set:
        name, _, value = setting.partition("=")
        env[f"CHITCHAT_{name.upper()}"] = value
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [str(Path(sys.executable).parent / "uvicorn"), "app.main:create_app", "--factory"]
    command += ["--port", str(port), "--no-access-log"]
    server, _ = start(command, port, env)
    try:
        with tempfile.TemporaryDirectory() as scratch:
            warmup = write_bodies(Path(scratch) / "bodies.txt", contexts()[:5000])
            nonce = os.urandom(3).hex()
            wrk(port, 4, WARMUP_S, warmup, f"w{nonce}")
            played = conversations()
            size = len(played) // len(args.clients)  # each client count a slice: no run meets another's turns
            runs = []
            for j, clients in enumerate(args.clients):
                bodies = warmup
                if args.mode != "cold":
                    bodies = write_conversations(Path(scratch) / f"c{clients}.tsv", played[j * size : (j + 1) * size])
                runs.append(profile_run(url, port, clients, args.duration, bodies, f"c{clients}{nonce}", args.mode))
        rss = rss_mb(server.pid)
    finally:
        stop(server)
    one = next((r for r in runs if r["clients"] == 1), runs[0])
    report = {
        "command": "python -m bench.profile " + " ".join(sys.argv[1:]),
        "cpu": {**cpu(), "cores": os.cpu_count()},
        "index": f"{version} ({manifest.replies} replies, {manifest.queries} queries)",
        "redis": args.redis,
        "mode": args.mode,
        "settings": args.set,
        "overhead_ms_per_request": one.get("overhead_ms_per_request"),  # measured at 1 client only
        "rss_mb": round(rss, 1),
        "runs": runs,
    }
    reports.write(args.out, report, markdown(report))


if __name__ == "__main__":
    main()
