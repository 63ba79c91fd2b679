"""`make chaos`: faults, overload and hostile input against the running service.

    python -m bench.chaos                      # every scenario -> reports/chaos.md, reports/chaos.json
    python -m bench.chaos --soak-minutes 10    # ... with the full 10-minute soak (about 20 minutes in all)
    python -m bench.chaos --only 1,3,11,16,19,22,23,24,25,26,27,28,29 --quick --sample 2000 --out /tmp/chaos-quick  # CI

Each scenario starts what it needs (a redis-server on a free port, the
service on the release bundle and a private copy of its index, the load
generator in its own process), injects its fault, and reports its figures
and whether they meet its bar. Scenarios that inject nothing into the
service (7, 9, 12, 13) share one service and one Redis.

Scenarios 16-21 run three service processes on three ports, sharing one
Redis and one artifacts folder, as replicas behind a load balancer do; 22
runs one process, then three replicas.

Scenarios 23-26 (bench/chaos/admission.py): unauthenticated admin
bodies and fresh exclude_ids beside load, a pointer write that fails (a
failpoint, core/failpoints.py) and rollback, upload, rollback on three replicas.

Scenarios 27-28 (bench/chaos/holding.py) hold the service without asking it for work:
48 bodies that never arrive, and a /readyz flood, each beside load and session turns.

Scenario 29 (bench/chaos/session_flood.py) floods new anonymous session ids
against a state Redis run with docker-compose.yml's settings, and reindexes
once the sessions are at their bound (so it serves the sample).

Scenario 22 serves two sets, each with its own shipped encoder: it needs two
bundles under the services' CHITCHAT_ENCODERS_DIR (default models/release/),
and reports n/a with the reason when there is one. --encoders-dir points its
services at another folder of bundles (the suite's own CHITCHAT_ variables
never reach a service), e.g. one of symlinks to two built bundles.

Two indexes are served. The full one is the release bundle's under
--artifacts (`make index`). The scenarios that reindex (3, 4, 8, 15-18, 20, 22) serve a
sample of it (--sample N candidates, built here in seconds from its stored
vectors): an append rebuilds every candidate's graph, ~30 s for the full
~100k even on an idle machine, so "3 reindexes in 2 minutes" would time the
build and the suite would not fit in 15 minutes. Their rows name the index
they ran on. --sample 0 runs them on the full index too. Without a full
index (CI) everything runs on a sample encoded from the chitchat corpus.

The default soak is 3 minutes with a reindex every 45 s, not the full 10
with one every 2 minutes (--soak-minutes 10); its row says which it ran.
Estimated on 2 cores: about 26 minutes for all scenarios (25.8 with the 12-layer default), 6.5 for the CI subset.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.chaos import (
    admission,
    encoders,
    holding,
    load_faults,
    redis_faults,
    reindex_faults,
    replicas,
    security,
    session_flood,
    sessions,
)
from bench.chaos.context import QUICK, Context, Durations
from bench.chaos.harness import link_or_copy
from core.bundle import RELEASE_BUNDLE, BundleManifest, open_bundle

Scenario = tuple[str, str, Callable[[Context], dict[str, Any]]]
# These reindex: they serve the sampled index (see the docstring).
ON_SAMPLE = frozenset({3, 4, 8, 15, 16, 17, 18, 20, 22, 24, 25, 26, 29})
SCENARIOS: dict[int, Scenario] = {
    1: (
        "Redis kill -9 under mixed load, restarted later",
        "0 5xx, >= 99% 200, p99 < 300 ms; sessions work <= 5 s after the restart; no turn lost after",
        redis_faults.redis_killed,
    ),
    2: (
        "Redis SIGSTOP for 10 s under load",
        "no request > 600 ms; /livez < 100 ms throughout",
        redis_faults.redis_frozen,
    ),
    3: (
        "3 reindexes in 2 minutes under load",
        "0 5xx; each response names one version and its reply is that version's",
        reindex_faults.reindex_at_peak,
    ),
    4: (
        "bad reindex: corrupt upload, build killed, write fails",
        "old version keeps serving; the job says why; nothing partial visible",
        reindex_faults.bad_reindexes,
    ),
    5: (
        "two reindexes at once",
        "the second refused with a clear error; peak RSS <= 2.2x steady",
        reindex_faults.two_at_once,
    ),
    6: (
        "200 connections against the in-flight limit",
        "excess gets 429 with Retry-After in < 50 ms; no request > 5 s; RSS flat",
        load_faults.too_many_clients,
    ),
    7: (
        "hostile bodies",
        "413 or 422 naming the field, in < 100 ms (set names and filters too); a filter that admits nothing: 404",
        load_faults.hostile_bodies,
    ),
    8: ("schemathesis, all checks, admin token", "0 failures", security.schema_fuzz),
    9: (
        "admin routes x bad credentials",
        "401 everywhere; constant-time comparison; no token = admin off",
        security.admin_credentials,
    ),
    10: (
        "one client at 5x a per-client limit",
        "429; rotating X-Forwarded-For does not bypass it",
        security.per_client_limit,
    ),
    11: (
        "cancellation storm, then checked requests",
        "0 foreign, lost or out-of-order session turns; 0 repeats in the window",
        sessions.cancellation_storm,
    ),
    12: ("hostile session ids", "bounded, distinct keys; no session reads another's", security.hostile_session_ids),
    13: ("steady load at concurrency 4", "thread count stable; p99 <= 3x the one-client p50", load_faults.steady_load),
    14: (
        "SIGTERM under load",
        "in-flight requests finish; 0 resets; /readyz 503 before ready and while draining",
        load_faults.sigterm_under_load,
    ),
    15: (
        "soak at 20 rps with reindexes (in full: 10 minutes, one every 2; the row says what ran)",
        "RSS growth < 10%; FDs and Redis clients flat",
        reindex_faults.soak,
    ),
    16: (
        "3 replicas: one starts while another's reindex runs",
        "the job succeeds; every replica serves the new version within 10 s of its swap",
        replicas.replica_starts_mid_reindex,
    ),
    17: (
        "3 replicas: Redis paused 3 s as a job publishes its version",
        "the job reports succeeded or failed truthfully; all replicas on one version within 10 s of Redis returning",
        replicas.redis_paused_at_publish,
    ),
    18: (
        "3 replicas: rollback and reindex sent together from two replicas, 5 times",
        "one wins, the other gets 409; then all serve one version, the one /admin/index names",
        replicas.rollback_races_reindex,
    ),
    19: (
        "3 replicas: each session's turns sent to them in turn, 30% cancelled",
        "0 lost, 0 foreign, 0 out-of-order turns",
        replicas.session_across_replicas,
    ),
    20: (
        "3 replicas: the cache Redis at maxmemory under unique contexts",
        "0 5xx; no session turn, candidate or job evicted; cache hit rate reported",
        replicas.redis_at_maxmemory,
    ),
    21: (
        "3 replicas: update messages naming ../../etc, a missing version, no JSON",
        "ignored with a log line each; versions unchanged; nothing outside the indexes folder read",
        replicas.hostile_update_messages,
    ),
    22: (
        "an English and a Korean set, each with its own encoder, under load: one process, then 3 replicas",
        "0 5xx; every answer's ids from the asked set, which it echoes with its version; /info names each "
        "set's encoder on every replica; >= 98% of probes found (n/a with one encoder shipped)",
        encoders.two_sets_two_encoders,
    ),
    23: (
        "8 clients posting 32 MiB admin bodies with no token, without pause "
        "(a process and autogroup at nice 19), beside /reply load",
        "each refused unread (401, 429 or the connection closed); RSS peak <= +64 MB; 0 5xx; "
        "the others' p99 <= 2x their own alone",
        admission.unauthenticated_bodies,
    ),
    24: (
        "4 clients: /reply with a selective filter and 256 fresh exclude_ids each, beside /reply load",
        "0 5xx; the others' p99 <= 1.5x theirs beside the same requests without exclude_ids",
        admission.fresh_exclude_ids,
    ),
    25: (
        "3 replicas under load: the pointer write fails (ENOSPC) in a reindex, then in a rollback",
        "both say they failed; every replica serves what it served; after a restart the store is the version "
        "it names; the next upload loses no record; 0 5xx",
        admission.failed_pointer_writes,
    ),
    26: (
        "3 replicas under load: upload, rollback, upload, rollback",
        "the second rollback serves what served before the second upload, not the version rolled back from",
        admission.rollback_upload_rollback,
    ),
    27: (
        "48 sockets each sending /reply's headers and one byte of its body, beside /reply load",
        "the others all 200, 0 5xx, no session turn lost; each idle body 408 at the body deadline; "
        "the others' p99 <= 2x their own alone",
        holding.idle_bodies,
    ),
    28: (
        "a 20 s /readyz flood from 400 sockets while a session sends 40 turns, beside /reply load",
        "no /readyz says Redis down; all 40 turns 200 and stored, none lost elsewhere; 0 5xx; "
        "the others' p99 <= 2x their own alone",
        holding.readyz_flood,
    ),
    29: (
        "4 clients opening a new session with a 1,000-character Korean turn on every request, "
        "against compose's state Redis settings, beside /reply load and sessions under way",
        "0 5xx; new sessions 429 past CHITCHAT_SESSION_MAX_COUNT; the sessions under way never refused, 0 lost; "
        "admin and a reindex job work; the default bounds within half of compose's maxmemory; "
        "the others' p99 <= 1.5x theirs beside the same turns storing nothing (as contexts, then 422)",
        session_flood.new_session_flood,
    ),
}


def sample_artifacts(full: Path | None, root: Path, n: int, manifest: BundleManifest) -> tuple[Path, str]:
    """An artifacts dir holding an index of n candidates (every reaction kept) for the release bundle.

    From the full index when there is one: its version is linked in so that the build reuses its stored
    vectors (seconds: only the graph is built), then dropped. Otherwise n chitchat train candidates are
    encoded (CI: about 10 s for 2,000). Returns the dir and what it holds, for the report."""
    from core.encoder import Encoder
    from core.store import IndexStore
    from index.build import build_version, corpus_candidates

    store = IndexStore(root / "indexes")
    full_store = IndexStore(full / "indexes") if full else None
    full_version = full_store.latest_for(manifest.checksum) if full_store else None
    rng = random.Random(0)
    if full_store and full_version:
        records = full_store.records(full_version)
        reactions = [c for c in records if c.kind == "reaction"]
        replies = [c for c in records if c.kind != "reaction"]
        chosen = sorted(rng.sample(range(len(replies)), min(n, len(replies))))
        candidates = [replies[i] for i in chosen] + reactions
        shutil.copytree(full_store.path(full_version), store.path(full_version), copy_function=link_or_copy)
        source = f"sample of {len(chosen)} of the {len(replies)} candidates of {full_version}"
    else:
        pool = corpus_candidates(manifest.max_context_turns)
        candidates = [pool[i] for i in sorted(rng.sample(range(len(pool)), min(n, len(pool))))]
        source = f"sample of {len(candidates)} chitchat train candidates, encoded here (no full index)"
    built = build_version(
        candidates, Encoder(RELEASE_BUNDLE, manifest), manifest.checksum, store, "chaos sample", progress=False
    )
    if full_version:
        shutil.rmtree(store.path(full_version))  # links or copies: the full index is untouched
    store.set_current(built.version)
    return root, f"{source} ({built.replies} replies)"


def full_index(artifacts: Path, checksum: str) -> tuple[Path, str] | None:
    from core.store import IndexStore

    store = IndexStore(artifacts / "indexes")
    version = store.latest_for(checksum)
    if version is None:
        return None
    return artifacts, f"full index {version} ({store.manifest(version).replies} replies)"


def markdown(report: dict[str, Any]) -> str:
    lines = [
        f"`{report['command']}` on {report['cores']} cores, {report['seconds'] / 60:.1f} "
        "minutes. Figures per scenario in reports/chaos.json.",
        "",
        *(f"- {kind} index: {label}" for kind, label in report["indexes"].items()),
        "",
        "| # | scenario | bar | measured | pass | s |",
        "|---|---|---|---|---|---|",
    ]
    for r in report["scenarios"]:
        shown = {k: v for k, v in r.items() if k not in ("id", "scenario", "bar", "pass", "seconds")}
        measured = "; ".join(f"{k}: {json.dumps(v) if isinstance(v, dict | list) else v}" for k, v in shown.items())
        verdict = {True: "yes", False: "**no**", None: "n/a"}[r["pass"]]
        lines.append(f"| {r['id']} | {r['scenario']} | {r['bar']} | {measured[:700]} | {verdict} | {r['seconds']} |")
    return "\n".join(lines) + "\n"


def write(out: Path, report: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "chaos.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    (out / "chaos.md").write_text(markdown(report))


def main() -> None:
    parser = _parser()
    args = parser.parse_args()
    chosen = [int(n) for n in args.only.split(",")] if args.only else sorted(SCENARIOS)
    unknown = sorted(set(chosen) - set(SCENARIOS))
    if unknown:
        parser.error(f"no scenario {unknown}")
    if not (RELEASE_BUNDLE / "manifest.json").is_file():
        raise SystemExit(f"[chaos] no release bundle at {RELEASE_BUNDLE}: `make release` first")
    manifest = open_bundle(RELEASE_BUNDLE)
    durations = QUICK if args.quick else Durations()
    if args.soak_minutes:
        durations = dataclasses.replace(durations, soak=args.soak_minutes * 60)
    full = full_index(args.artifacts.resolve(), manifest.checksum)
    report: dict[str, Any] = {
        "command": " ".join(["python -m bench.chaos", *sys.argv[1:]]),
        "cores": os.cpu_count(),
        "quick": args.quick,
        "durations": dataclasses.asdict(durations) | {"soak_reindex_every": durations.soak_reindex_every},
        "indexes": {},
        "seconds": 0.0,
        "scenarios": [],
    }
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="chaos-") as work:
        sample = None
        if (args.sample and any(n in ON_SAMPLE for n in chosen)) or full is None:
            t0 = time.perf_counter()
            sample = sample_artifacts(full[0] if full else None, Path(work) / "sample", args.sample or 10_000, manifest)
            print(f"[chaos] {sample[1]}, built in {time.perf_counter() - t0:.1f} s", flush=True)
        labels = {k: v[1] for k, v in (("full", full), ("sample", sample)) if v}
        report["indexes"] = labels
        ctx = Context(
            Path(work), full[0] if full else None, sample[0] if sample else None, manifest.checksum, durations, labels
        )
        ctx.encoders_dir = args.encoders_dir.resolve() if args.encoders_dir else None
        ctx.latency_bars = not args.correctness_only
        try:
            for number in chosen:
                row = _run_scenario(ctx, number, started)
                report["scenarios"].append(row)
                report["seconds"] = round(time.perf_counter() - started, 1)
                write(args.out, report)  # as it goes: a suite cut short still leaves its figures
        finally:
            ctx.close()
    report["seconds"] = round(time.perf_counter() - started, 1)
    write(args.out, report)
    print((args.out / "chaos.md").read_text())
    print("[chaos] seconds per scenario: " + ", ".join(f"{r['id']}: {r['seconds']}" for r in report["scenarios"]))
    failed = [r["id"] for r in report["scenarios"] if r["pass"] is False]
    for r in report["scenarios"]:
        if r["pass"] is False:  # the whole row: the table cuts its figures short
            print(f"[chaos] scenario {r['id']} failed: {json.dumps(r, default=str)}")
    raise SystemExit(f"[chaos] failed: {failed}" if failed else 0)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", help="comma-separated scenario numbers")
    parser.add_argument("--quick", action="store_true", help="shorter loads, for CI")
    parser.add_argument("--artifacts", type=Path, default=Path("artifacts"), help="holds the release bundle's index")
    parser.add_argument(
        "--sample",
        type=int,
        default=10_000,
        help="candidates in the index the reindexing scenarios (3, 4, 8, 15) serve; 0: the full index (default 10000)",
    )
    parser.add_argument("--soak-minutes", type=float, help="scenario 15's length (default 3; 1 with --quick)")
    parser.add_argument(
        "--correctness-only",
        action="store_true",
        help="a missed latency bar is reported, not failed (CI, on a shared machine): correctness still gates",
    )
    parser.add_argument("--out", type=Path, default=Path("reports"))
    parser.add_argument(
        "--encoders-dir",
        type=Path,
        help="scenario 22's services' CHITCHAT_ENCODERS_DIR: the bundles a set may name (default: models/release/)",
    )
    return parser


def _run_scenario(ctx: Context, number: int, started: float) -> dict[str, Any]:
    """Scenario `number`'s row: its figures, or the error that broke it (a failed scenario: the suite
    goes on), and the seconds it took. `started`: the suite's start, for the running total it prints."""
    name, bar, run = SCENARIOS[number]
    ctx.on_sample = number in ON_SAMPLE
    print(f"[chaos] {number}. {name} ...", flush=True)
    t0 = time.perf_counter()
    try:
        figures = run(ctx)
    except Exception as error:  # a scenario that breaks is a failed scenario, and the suite goes on
        figures = {
            "error": f"{type(error).__name__}: {error}",
            "trace": traceback.format_exc()[-800:],
            "pass": False,
        }
    elapsed = time.perf_counter() - t0
    row = {"id": number, "scenario": name, "bar": bar, **figures, "seconds": round(elapsed, 1)}
    row.setdefault("index", ctx.index_label())  # every row names the index it ran on
    verdict = {True: "pass", False: "FAIL", None: "n/a"}[row["pass"]]
    total = (time.perf_counter() - started) / 60
    print(f"[chaos] {number}. {verdict} in {elapsed:.1f} s ({total:.1f} min so far): {row}", flush=True)
    return row


if __name__ == "__main__":
    main()
