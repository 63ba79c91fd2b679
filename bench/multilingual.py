"""The multilingual bundles against the English student: Korean through the live API, speed, reindex.

    python -m bench.multilingual [--bundles artifacts/bundles/multilingual-e5-chitchat-int8 ...]

1. Korean: our own sets (tests/data/korean_chitchat.jsonl, 60 conversations,
   and bench/data/korean_dev.jsonl, 300; written for these checks, never
   trained on) are uploaded through the admin API of a service that starts
   with no index: their 360 replies are its only candidates. /reply is
   asked for each context (k = 10): how often the right reply comes first,
   and in the top 10. A real Korean candidate set is larger, so this is an
   easier task than a held-out one; it compares bundles, it is no
   stand-in for a held-out score.
2. Speed: single-query encoder p50 on 200 held-out contexts of up to 3
   turns, a seeded sample as `make bench` draws (with onnxruntime's idle
   threads sleeping, the service's default, and spinning), and the seconds
   an index build of the same 5,000 chitchat candidates takes, for each bundle.

Writes reports/multilingual.md and reports/multilingual.json. English
retrieval quality of every bundle is in `make eval`'s table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench.latency import cpu_description, free_port, test_contexts
from core.bundle import RELEASE_BUNDLE, open_bundle
from core.encoder import Encoder
from core.store import IndexStore
from index.build import build_version, corpus_candidates

ROOT = Path(__file__).resolve().parents[1]
KOREAN = (ROOT / "tests" / "data" / "korean_chitchat.jsonl", ROOT / "bench" / "data" / "korean_dev.jsonl")
BUNDLES = (
    Path("artifacts/bundles/multilingual-e5-chitchat-int8"),
    Path("artifacts/bundles/multilingual-e5-small-int8"),
    RELEASE_BUNDLE,
)
TOKEN = "multilingual-bench"


def korean_through_the_api(bundle: Path, work: Path) -> dict[str, Any]:
    rows = [json.loads(line) for path in KOREAN for line in path.read_text().splitlines() if line.strip()]
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHITCHAT_")}
    env.update(CHITCHAT_ARTIFACTS_DIR=str(work), CHITCHAT_BUNDLE_DIR=str(bundle), CHITCHAT_ADMIN_TOKEN=TOKEN)
    command = [sys.executable, "-m", "uvicorn", "app.main:create_app", "--factory", "--port", str(port)]
    server = subprocess.Popen([*command, "--log-level", "warning"], cwd=ROOT, env=env)
    url, auth = f"http://127.0.0.1:{port}", {"authorization": f"Bearer {TOKEN}"}
    try:
        for _ in range(600):  # until the model is loaded: /readyz then names the missing index
            try:
                if httpx.get(f"{url}/readyz", timeout=1).json().get("problem") not in (None, "loading"):
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        records = [{"reply": r["reply"], "id": f"ko-{i}"} for i, r in enumerate(rows)]
        job = httpx.post(f"{url}/admin/candidates?mode=replace", json=records, headers=auth, timeout=60).json()
        for _ in range(600):
            state = httpx.get(f"{url}/admin/jobs/{job['job_id']}", headers=auth).json()
            if state["state"] in ("succeeded", "failed"):
                break
            time.sleep(0.2)
        assert state["state"] == "succeeded", state
        first = top10 = echoed = 0
        for row in rows:
            answer = httpx.post(f"{url}/reply", json={"context": row["context"], "k": 10}, timeout=30).json()
            texts = [c["text"] for c in answer["candidates"]]
            first += answer["reply"] == row["reply"]
            top10 += row["reply"] in texts
            echoed += answer["reply"] in row["context"]
    finally:
        server.terminate()
        server.wait(timeout=30)
    n = len(rows)
    return {"conversations": n, "r_at_1": round(first / n, 3), "r_at_10": round(top10 / n, 3), "echoed": echoed}


def label(bundle: Path) -> str:
    """The bundle's name and its weights' bits: `models.multilingual --eight-bit` keeps the name.
    Bundles from before the manifest said so have 8-bit weights."""
    manifest = open_bundle(bundle)
    return f"{manifest.name} ({manifest.training.get('weight_bits', 8)}-bit weights)"


def single_query_p50(encoder: Encoder, contexts: list[str]) -> float:
    """Median ms for one context at a time, after 20 to warm up."""
    for text in contexts[:20]:
        encoder.encode([text], "context")
    times = []
    for text in contexts[20:]:
        started = time.perf_counter()
        encoder.encode([text], "context")
        times.append((time.perf_counter() - started) * 1000)
    return round(float(np.median(times)), 2)


def speed(bundle: Path, work: Path, candidates: int) -> dict[str, Any]:
    manifest = open_bundle(bundle)
    encoder = Encoder(bundle, manifest)  # as the service runs it by default: CHITCHAT_ORT_SPIN off
    # A seeded sample across the held-out conversations, as `make bench` draws: the first
    # pairs of the split are a handful of conversations' openings, shorter than most contexts.
    contexts = [encoder.join_context(turns) for turns in test_contexts(220, manifest.max_context_turns)]
    p50 = single_query_p50(encoder, contexts)
    p50_spinning = single_query_p50(Encoder(bundle, manifest, spin=True), contexts)
    chosen = corpus_candidates(manifest.max_context_turns)[:candidates]
    started = time.perf_counter()
    built = build_version(chosen, encoder, manifest.checksum, IndexStore(work / "indexes"), "bench", progress=False)
    seconds = time.perf_counter() - started
    return {
        "bundle": label(bundle),
        "layers": manifest.num_layers,
        "quantization": manifest.quantization,
        "single_query_p50_ms": p50,
        "single_query_p50_ms_spinning": p50_spinning,
        "index_build_s": round(seconds, 1),
        "texts_per_s": round(built.encoded / seconds, 1),
        "size_mb": round(sum(f.stat().st_size for f in bundle.iterdir()) / 2**20, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bundles", type=Path, nargs="+", default=[b for b in BUNDLES if b.is_dir()])
    parser.add_argument("--candidates", type=int, default=5000)
    parser.add_argument("--out", type=Path, default=ROOT / "reports")
    args = parser.parse_args()
    report: dict[str, Any] = {"cpu": cpu_description(), "korean": {}, "speed": []}
    for bundle in args.bundles:
        with tempfile.TemporaryDirectory() as work:
            report["korean"][label(bundle)] = korean_through_the_api(bundle, Path(work))
        with tempfile.TemporaryDirectory() as work:
            report["speed"].append(speed(bundle, Path(work), args.candidates))
        print(json.dumps(report, indent=1), flush=True)
    lines = [
        "Korean through the live API: 360 conversations of our own (tests/data/korean_chitchat.jsonl and "
        "bench/data/korean_dev.jsonl) uploaded as the only candidates of a fresh service, /reply asked for each "
        "context with k = 10.",
        "",
        "| bundle | right reply first | in the top 10 | answered with the user's own line |",
        "|---|---|---|---|",
    ]
    for name, k in report["korean"].items():
        lines.append(f"| {name} | {k['r_at_1']:.3f} | {k['r_at_10']:.3f} | {k['echoed']} |")
    lines += [
        "",
        f"Speed on {report['cpu']}: single 3-turn context through the encoder (p50), as the service runs"
        " it by default and with CHITCHAT_ORT_SPIN=1, and an index build"
        f" of the same {args.candidates:,} chitchat candidates.",
        "",
        "| bundle | layers | graph | size | single query p50 | p50, spinning | index build | texts/s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in report["speed"]:
        lines.append(
            f"| {s['bundle']} | {s['layers']} | {s['quantization']} | {s['size_mb']} MB | {s['single_query_p50_ms']} ms"
            f" | {s['single_query_p50_ms_spinning']} ms | {s['index_build_s']} s | {s['texts_per_s']} |"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "multilingual.json").write_text(json.dumps(report, indent=2) + "\n")
    (args.out / "multilingual.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
