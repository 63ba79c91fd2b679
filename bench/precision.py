"""Builds of one model, side by side on this CPU: which graph and precision encode fastest, and
how far each strays from the first.

    python -m bench.precision BUNDLE [BUNDLE ...] [--queries 600] [--out reports/precision]

The first bundle is the reference (the release, say), the others rebuilds of the same weights
(`python -m models.minilm.script_student --rows-from ... --export [--fp32] [--no-fuse]`). Each build
encodes the same held-out contexts of up to 3 turns (a seeded sample, as `make bench` draws),
one at a time and then in batches of 64, the builds taking turns a block at a time with a pause
between blocks, so that a noisy neighbour slows all of them alike (timed one bundle after another,
a neighbour's burst lands on one build). Agreement: the cosine between each build's context vectors and the
reference's, mean and minimum.

Why: onnxruntime's int8 kernels lean on VNNI; on a CPU without it the u8 x s8 product is two
instructions where VNNI has one, and fp32 or another graph might win there. This measures it.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.reports import write
from bench.service import cpu_description, test_contexts
from core.bundle import open_bundle
from core.encoder import Encoder

WARMUP = 20
BLOCK = 20  # queries a build runs before the next takes its turn
BATCH = 64  # texts per batch, as the index build encodes


def _timed(encoder: Encoder, texts: list[str]) -> tuple[float, np.ndarray]:
    started = time.perf_counter()
    vectors = encoder.encode(texts, side="context")  # [N, D], unit length
    return (time.perf_counter() - started) * 1000, vectors


def compare(bundles: list[Path], queries: int, batches: int) -> list[dict[str, Any]]:
    encoders = [Encoder(b, open_bundle(b)) for b in bundles]
    manifest = encoders[0].manifest
    turns = test_contexts(WARMUP + queries, manifest.max_context_turns)
    texts = [encoders[0].join_context(t) for t in turns]  # the builds share one tokenizer and its rules
    single: list[list[float]] = [[] for _ in encoders]
    vectors: list[list[np.ndarray]] = [[] for _ in encoders]
    for start in range(0, len(texts), BLOCK):
        for k, encoder in enumerate(encoders):
            time.sleep(0.1)
            for i, text in enumerate(texts[start : start + BLOCK], start):
                ms, vector = _timed(encoder, [text])  # vector: [1, D]
                if i >= WARMUP:
                    single[k].append(ms)
                    vectors[k].append(vector[0])
    batched: list[list[float]] = [[] for _ in encoders]
    for b in range(batches):
        batch = texts[b * BATCH % len(texts) :][:BATCH]
        for k, encoder in enumerate(encoders):
            batched[k].append(_timed(encoder, batch)[0] / len(batch))
    reference = np.stack(vectors[0])  # [Q, D]
    rows = []
    for k, encoder in enumerate(encoders):
        cosines = (np.stack(vectors[k]) * reference).sum(axis=1)  # [Q]
        rows.append(
            {
                "bundle": str(bundles[k]),
                "name": encoder.manifest.name,
                "graph": encoder.manifest.quantization,
                "single_p50_ms": round(float(np.median(single[k])), 2),
                "single_p90_ms": round(float(np.percentile(single[k], 90)), 2),
                "batched_ms_per_text": round(float(np.median(batched[k])), 2),
                "mean_cosine_to_first": round(float(cosines.mean()), 4),
                "min_cosine_to_first": round(float(cosines.min()), 4),
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("bundles", type=Path, nargs="+")
    parser.add_argument("--queries", type=int, default=600)
    parser.add_argument("--batches", type=int, default=10, help="batches of 64 each build encodes")
    parser.add_argument("--out", type=Path, default=Path("reports/precision"))
    args = parser.parse_args()
    cpu = cpu_description()
    rows = compare(args.bundles, args.queries, args.batches)
    lines = [
        f"Builds of one model on {cpu} (`python -m bench.precision`): {args.queries} held-out contexts one at a "
        f"time and {args.batches} batches of {BATCH}, the builds taking turns; cosine to the first build's vectors.",
        "",
        "| build | graph | single p50 ms | single p90 ms | batched ms/text | cosine to first: mean / min |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['name']} | {r['graph']} | {r['single_p50_ms']} | {r['single_p90_ms']} | "
            f"{r['batched_ms_per_text']} | {r['mean_cosine_to_first']} / {r['min_cosine_to_first']} |"
        )
    write(args.out, {"cpu": cpu, "queries": args.queries, "rows": rows}, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
