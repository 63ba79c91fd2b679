"""What the poly rerank adds to a reply, in process, on held-out contexts.

Two costs, measured per context and interleaved so drift hits both sides:
- the rerank step: FAISS top-`depth` + reading their vectors + the numpy
  poly score, against the plain FAISS top-k;
- the encoder: the context graph with the poly output, against the same
  model exported without a poly head (`--baseline`), if given.

    python -m bench.rerank [--bundle DIR] [--baseline DIR] [--requests 1000] [--depth 50]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from app.config import Settings
from app.engine.runtime import limit_cpu_threads, load_serving
from bench.latency import test_contexts
from core import retriever
from core.bundle import read_manifest
from core.encoder import Encoder
from core.store import IndexStore


def _ms(fn: Any, *args: Any) -> float:
    started = time.perf_counter()
    fn(*args)
    return (time.perf_counter() - started) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--artifacts", type=Path, default=Path("artifacts"))
    parser.add_argument("--bundle", type=Path, help="a bundle with a poly head (default: the served one)")
    parser.add_argument("--baseline", type=Path, help="the same model exported without a poly head")
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--depth", type=int, default=50)
    parser.add_argument("--k", type=int, default=5)
    args = parser.parse_args()

    settings = Settings(artifacts_dir=args.artifacts, bundle_dir=args.bundle)
    limit_cpu_threads(settings)  # as the service does
    serving = load_serving(settings, IndexStore(settings.indexes_root))
    if serving.reranker is None:
        raise SystemExit(f"{serving.bundle.name} has no poly head")
    baseline = Encoder(args.baseline, read_manifest(args.baseline)) if args.baseline else None
    encoder = serving.encoder
    contexts = [encoder.join_context(c) for c in test_contexts(args.requests, serving.bundle.max_context_turns)]

    timings: dict[str, list[float]] = {"search": [], "search_rerank": [], "encode_poly": [], "encode_baseline": []}
    for text in contexts[:20]:  # warm-up
        encoder.encode_with_poly([text])
    for text in contexts:
        timings["encode_poly"].append(_ms(encoder.encode_with_poly, [text]))
        if baseline is not None:
            timings["encode_baseline"].append(_ms(baseline.encode, [text], "context"))
        vector, poly = encoder.encode_with_poly([text])  # [1, D], [1, m, D]
        timings["search"].append(_ms(retriever.reply_matching, serving, vector[0], args.k, retriever.Avoid()))
        timings["search_rerank"].append(
            _ms(retriever.reply_matching, serving, vector[0], args.k, retriever.Avoid(), poly[0], args.depth)
        )
    p50 = {name: round(float(np.median(ms)), 3) for name, ms in timings.items() if ms}
    result: dict[str, Any] = {
        "bundle": serving.bundle.name,
        "codes": serving.bundle.poly.codes if serving.bundle.poly else None,
        "depth": args.depth,
        "requests": len(contexts),
        "p50_ms": p50,
        "rerank_step_added_p50_ms": round(p50["search_rerank"] - p50["search"], 3),
    }
    if baseline is not None:
        result["encoder_added_p50_ms"] = round(p50["encode_poly"] - p50["encode_baseline"], 3)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
