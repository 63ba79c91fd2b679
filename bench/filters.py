"""`make bench-filters`: filtered search on the chitchat index at 1%, 10% and 50% selectivity.

    python -m bench.filters [--requests 300] [--artifacts DIR] [--out reports/filters]

Copies the index `make index` built (links, not bytes) into a scratch store and
rebuilds it with every distinct reply tagged `p1`, `p10` and `p50` by a hash of
its text (nested: a `p1` reply is also `p10` and `p50`), reusing the stored
vectors, so only the graphs are built again. Then:

- recall@10 of the filtered search (`filters.search`, as `/reply` runs it) against
  exact inner-product search over the same admitted rows' stored vectors, for
  2,000 held-out test contexts, on the replies (context side) and on the
  stored queries (their last turn), with the unfiltered search beside it;
- the search alone, p50 per query on this process's threads;
- `/reply` at 1 client through a live server on that index: unique contexts
  (nothing from the cache), the four cases interleaved request by request so
  that drift in the machine hits them alike; p50 each, and its ratio to the
  unfiltered p50 of the same run.

Writes reports/filters.{md,json} with the CPU.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import faiss
import httpx
import numpy as np

from bench import reports
from bench.load import ROOT, contexts, start, stop
from bench.service import free_port
from core import ann
from core.bundle import RELEASE_BUNDLE, open_bundle
from core.encoder import Encoder
from core.filters import Admitted, Filter, Side, admitted, search
from core.machine import cpu
from core.records import Candidate
from core.store import IndexStore, IndexVersion
from core.text import normalize
from index.build import build_version

SHARES = {"p1": 0.01, "p10": 0.10, "p50": 0.50}
PROBES = 2000
K = 10


def share_of(text: str) -> float:
    """A stable number in [0, 1) per reply text: every record of one reply gets the same tags."""
    return int(hashlib.sha1(normalize(text).encode()).hexdigest()[:8], 16) / 16**8


def tagged(records: list[Candidate]) -> list[Candidate]:
    out = []
    for c in records:
        if c.kind == "reaction":
            out.append(c)
            continue
        u = share_of(c.reply)
        tags = tuple(tag for tag, share in SHARES.items() if u < share)
        out.append(Candidate(c.reply, c.query, c.id, c.metadata, c.kind, c.language, tags))
    return out


def tagged_store(source: IndexStore, version: str, scratch: Path, encoder: Encoder) -> tuple[IndexStore, str]:
    store = IndexStore(scratch / "indexes")
    shutil.copytree(source.path(version), store.path(version), copy_function=os.link)
    built = build_version(
        tagged(source.records(version)), encoder, encoder.manifest.checksum, store, "bench.filters", progress=False
    )
    shutil.rmtree(store.path(version))
    store.set_current(built.version)
    return store, built.version


def exact_top(stored: np.ndarray, probes: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """[P, K] the exact top K of each probe [P, D] among `rows` of stored [N, D], in chunks of probes."""
    admitted_vectors = stored[rows]  # [S, D]
    out = []
    for first in range(0, len(probes), 100):
        scores = probes[first : first + 100] @ admitted_vectors.T  # [C, S]
        top = np.argpartition(-scores, min(K, len(rows) - 1), axis=1)[:, :K]  # [C, K] unordered
        out.append(rows[top])
    return np.concatenate(out)


def recall(
    version: IndexVersion, side: Side, stored: np.ndarray, probes: np.ndarray, only: Admitted | None
) -> tuple[float, float]:
    """(recall@10 against exact search over the admitted rows, p50 ms of one search as /reply runs it)."""
    rows = np.flatnonzero(only.of(side).mask) if only is not None else np.arange(len(stored))
    truth = exact_top(stored, probes, rows)  # [P, K]
    if only is not None:
        search(version, side, probes[:1], K, only)  # a filter's first search builds what it keeps
    found, times = [], []
    for probe in probes:
        started = time.perf_counter()
        _, hit = search(version, side, probe[None, :], K, only)
        times.append((time.perf_counter() - started) * 1000)
        found.append(hit[0])
    hits = sum(len(set(f.tolist()) & set(t.tolist())) for f, t in zip(found, truth, strict=True))
    return hits / truth.size, float(np.median(times))


def path(admitted_rows: int) -> str:
    """Which search a filter admitting this many rows gets (`filters.search`)."""
    return "exact scan of a copy" if admitted_rows < ann.FILTERED_EXACT_BELOW else "graph/inverted file, widened"


def search_figures(version: IndexVersion, encoder: Encoder) -> list[dict[str, Any]]:
    held_out = contexts()[:PROBES]
    context_probes = encoder.encode([encoder.join_context(c) for c in held_out], "context")  # [P, D]
    query_probes = encoder.encode([c[-1] for c in held_out], version.manifest.query_side)  # [P, D]
    sides: dict[Side, tuple[np.ndarray, np.ndarray]] = {
        "replies": (ann.vectors_of(version.reply_index), context_probes),
        "queries": (ann.vectors_of(version.query_index), query_probes),
    }
    rows = []
    for tag in (None, *SHARES):
        only = admitted(version, Filter(tags_any=frozenset({tag}))) if tag else None
        for side, (stored, probes) in sides.items():
            r, p50 = recall(version, side, stored, probes, only)
            rows.append(
                {
                    "filter": f"tags_any [{tag}]" if tag else "none",
                    "side": side,
                    "admitted": only.of(side).count if only is not None else len(stored),
                    "of": len(stored),
                    "path": path(only.of(side).count) if only is not None else "unfiltered",
                    "recall_at_10": round(r, 4),
                    "search_p50_ms": round(p50, 3),
                }
            )
    return rows


def reply_latency(artifacts: Path, bundle: Path, requests: int) -> dict[str, dict[str, float]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHITCHAT_")}
    env |= {"CHITCHAT_BUNDLE_DIR": str(bundle), "CHITCHAT_ARTIFACTS_DIR": str(artifacts)}
    port = free_port()
    command = [str(Path(sys.executable).parent / "uvicorn"), "app.main:create_app", "--factory"]
    server, _ = start([*command, "--port", str(port), "--no-access-log"], port, env)
    cases: dict[str, dict[str, Any]] = {"none": {}} | {tag: {"filter": {"tags_any": [tag]}} for tag in SHARES}
    times: dict[str, list[float]] = {case: [] for case in cases}
    pool = contexts()[PROBES:]  # not the recall probes; each sent once, so nothing comes from the cache
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            for i, context in enumerate(pool[: 40 + requests * len(cases)]):
                case = list(cases)[i % len(cases)]
                started = time.perf_counter()
                response = client.post("/reply", json={"context": context, **cases[case]})
                elapsed = (time.perf_counter() - started) * 1000
                response.raise_for_status()
                if i >= 40:  # the first few warm the process up
                    times[case].append(elapsed)
    finally:
        stop(server)
    base = float(np.median(times["none"]))
    return {
        case: {
            "p50_ms": round(float(np.median(t)), 2),
            "p99_ms": round(float(np.percentile(t, 99)), 2),
            "requests": len(t),
            "p50_vs_unfiltered": round(float(np.median(t)) / base, 3),
        }
        for case, t in times.items()
    }


def markdown(report: dict[str, Any]) -> str:
    c = report["cpu"]
    lines = [
        f"`{report['command']}` on {c['model']}, {c['cores']} cores, VNNI: {c['vnni']}.",
        "",
        f"- index: {report['index']}",
        "- recall@10 against exact inner-product search over the same admitted rows (their stored 8-bit vectors);"
        f" {PROBES} held-out contexts; bar >= 0.95",
        "",
        "| filter | side | admitted | search | recall@10 | search p50 ms |",
        "|---|---|---|---|---|---|",
    ]
    for r in report["search"]:
        lines.append(
            f"| {r['filter']} | {r['side']} | {r['admitted']:,} of {r['of']:,} | {r['path']} | {r['recall_at_10']} "
            f"| {r['search_p50_ms']} |"
        )
    lines += [
        "",
        "`/reply` at 1 client, unique contexts, the cases interleaved; bar: p50 <= 1.5x unfiltered",
        "",
        "| filter | p50 ms | p99 ms | requests | p50 / unfiltered |",
        "|---|---|---|---|---|",
    ]
    for case, r in report["reply"].items():
        name = "none" if case == "none" else f"tags_any [{case}] ({SHARES[case]:.0%})"
        lines.append(f"| {name} | {r['p50_ms']} | {r['p99_ms']} | {r['requests']} | {r['p50_vs_unfiltered']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=300, help="/reply calls per case")
    parser.add_argument("--bundle", type=Path, default=RELEASE_BUNDLE)
    parser.add_argument("--artifacts", type=Path, default=ROOT / "artifacts")
    parser.add_argument("--out", type=Path, default=ROOT / "reports" / "filters")
    args = parser.parse_args()

    manifest = open_bundle(args.bundle)
    source = IndexStore(args.artifacts / "indexes")
    version = source.latest_for(manifest.checksum)
    if version is None:
        raise SystemExit(f"no index for {args.bundle} under {args.artifacts}: run `make index` first")
    encoder = Encoder(args.bundle, manifest)
    faiss.omp_set_num_threads(1)  # as the service searches (`faiss_threads`)
    with tempfile.TemporaryDirectory() as scratch:
        started = time.perf_counter()
        store, built = tagged_store(source, version, Path(scratch), encoder)
        print(f"[filters] tagged copy {built} built in {time.perf_counter() - started:.0f}s", file=sys.stderr)
        loaded = store.load(built)
        search = search_figures(loaded, encoder)
        del loaded
        reply = reply_latency(Path(scratch), args.bundle, args.requests)
        report = {
            "command": "python -m bench.filters " + " ".join(sys.argv[1:]),
            "cpu": {**cpu(), "cores": os.cpu_count()},
            "index": f"{version} ({source.manifest(version).replies} replies), tagged as {built}",
            "search": search,
            "reply": reply,
        }
    reports.write(args.out, report, markdown(report))


if __name__ == "__main__":
    main()
