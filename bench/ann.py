"""Which FAISS index for ~100k stored replies: recall@10 against exact search, size, search and build time.

    python -m bench.ann [--bundle DIR]     # -> reports/ann.md, reports/ann.json

Encodes the chitchat train candidates' replies with the bundle (reply side)
and 2,000 held-out test contexts (context side) as queries, then for each
index kind tunes its search parameter to the smallest value whose recall@10
against exact fp32 search reaches the target, and measures it there: the
file size, one-query search time on one thread (p50 over the queries), and
the build time on every core.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from core import ann
from core.bundle import RELEASE_BUNDLE, open_bundle
from core.encoder import Encoder
from index.build import corpus_candidates, tables
from index.corpus import load_pairs

TARGET = ann.RECALL_TARGET


def size_mb(index: faiss.Index) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "index.faiss")
        faiss.write_index(index, path)
        return os.path.getsize(path) / 2**20


def search_p50_ms(index: faiss.Index, queries: np.ndarray) -> float:
    times = []
    for q in queries[:1000]:
        started = time.perf_counter()
        index.search(q[None, :], 10)
        times.append((time.perf_counter() - started) * 1000)
    return float(np.median(times))


def recall(index: faiss.Index, queries: np.ndarray, truth: np.ndarray) -> float:
    return ann.recall_at_k(index, queries, truth)


def ivf_sq8(vectors: np.ndarray) -> faiss.Index:
    nlist = int(4 * np.sqrt(len(vectors)))
    quantizer = faiss.IndexFlatIP(vectors.shape[1])
    index = faiss.IndexIVFScalarQuantizer(quantizer, vectors.shape[1], nlist, ann.QUANTIZER, faiss.METRIC_INNER_PRODUCT)
    index.train(vectors)
    index.add(vectors)
    return index


def ivf_pq(vectors: np.ndarray) -> faiss.Index:
    nlist = int(4 * np.sqrt(len(vectors)))
    index = faiss.index_factory(vectors.shape[1], f"IVF{nlist},PQ48x8", faiss.METRIC_INNER_PRODUCT)
    index.train(vectors)
    index.add(vectors)
    return index


def hnsw_flat(vectors: np.ndarray) -> faiss.Index:
    index = faiss.IndexHNSWFlat(vectors.shape[1], ann.HNSW_M, faiss.METRIC_INNER_PRODUCT)
    index.hnsw.efConstruction = ann.HNSW_EF_CONSTRUCTION
    index.add(vectors)
    return index


KINDS: dict[str, tuple[Callable[[np.ndarray], faiss.Index], str, tuple[int, ...]]] = {
    # name: (builder, search parameter, values tried)
    "flat fp32 (exact)": (ann.exact, "", (0,)),
    "flat sq8": (ann.flat_sq8, "", (0,)),
    f"hnsw{ann.HNSW_M} fp32": (hnsw_flat, "efSearch", ann.EF_SEARCH_CHOICES),
    f"hnsw{ann.HNSW_M} sq8": (ann.hnsw_sq8, "efSearch", ann.EF_SEARCH_CHOICES),
    "ivf sq8": (ivf_sq8, "nprobe", (8, 16, 32, 64, 128, 256)),
    "ivf pq48": (ivf_pq, "nprobe", (8, 16, 32, 64, 128, 256)),
}


def set_parameter(index: faiss.Index, name: str, value: int) -> None:
    if name == "efSearch":
        faiss.downcast_index(index).hnsw.efSearch = value
    elif name == "nprobe":
        faiss.extract_index_ivf(index).nprobe = value


def measure(vectors: np.ndarray, queries: np.ndarray) -> list[dict[str, Any]]:
    _, truth = ann.exact(vectors).search(queries, 10)  # [Q, 10]
    rows = []
    for name, (builder, parameter, values) in KINDS.items():
        faiss.omp_set_num_threads(os.cpu_count() or 1)
        started = time.perf_counter()
        index = builder(vectors)
        build_s = time.perf_counter() - started
        faiss.omp_set_num_threads(1)  # serving searches one query on one thread
        chosen, found = values[-1], 0.0
        for value in values:
            set_parameter(index, parameter, value)
            found = recall(index, queries, truth)
            if found >= TARGET:
                chosen = value
                break
        set_parameter(index, parameter, chosen)
        row = {
            "index": name,
            "parameter": f"{parameter}={chosen}" if parameter else "–",
            "recall_at_10": round(found, 4),
            "reaches_target": found >= TARGET,
            "size_mb": round(size_mb(index), 1),
            "search_p50_ms": round(search_p50_ms(index, queries), 3),
            "build_s": round(build_s, 1),
        }
        print(row, flush=True)
        rows.append(row)
    return rows


def markdown(rows: list[dict[str, Any]], n: int, q: int, bundle: str) -> str:
    lines = [
        f"FAISS index choices for {n:,} stored replies ({bundle}, reply side), queried with {q:,} held-out test "
        f"contexts. Each search parameter is the smallest whose recall@10 against exact fp32 search reaches "
        f"{TARGET}. Search: one query, one thread, p50. Build: every core. Size: the index file.",
        "",
        "| index | parameter | recall@10 vs exact | size | search p50 | build |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        mark = "" if r["reaches_target"] else " (below target)"
        lines.append(
            f"| {r['index']} | {r['parameter']} | {r['recall_at_10']:.3f}{mark} | {r['size_mb']:.1f} MB | "
            f"{r['search_p50_ms']:.3f} ms | {r['build_s']:.1f} s |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bundle", type=Path, default=RELEASE_BUNDLE)
    parser.add_argument("--queries", type=int, default=2000)
    parser.add_argument("--out", type=Path, default=Path("reports"))
    args = parser.parse_args()
    manifest = open_bundle(args.bundle)
    encoder = Encoder(args.bundle, manifest)
    replies = tables(corpus_candidates(manifest.max_context_turns)).reply_texts
    started = time.perf_counter()
    vectors = np.ascontiguousarray(encoder.encode(replies, "reply", max_batch=128))  # [R, D]
    pairs = load_pairs("test", manifest.max_context_turns)[: args.queries]
    queries = np.ascontiguousarray(encoder.encode([encoder.join_context(p.context) for p in pairs], "context"))
    print(f"[ann] encoded {len(vectors)} replies and {len(queries)} contexts in {time.perf_counter() - started:.0f}s")
    rows = measure(vectors, queries)
    args.out.mkdir(parents=True, exist_ok=True)
    report = {"bundle": manifest.name, "replies": len(vectors), "queries": len(queries), "target": TARGET, "rows": rows}
    (args.out / "ann.json").write_text(json.dumps(report, indent=2) + "\n")
    (args.out / "ann.md").write_text(markdown(rows, len(vectors), len(queries), manifest.name))
    print((args.out / "ann.md").read_text())


if __name__ == "__main__":
    main()
