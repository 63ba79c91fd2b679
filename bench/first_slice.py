"""`make bench-first-slice`: what a newcomer's first answers lose to the first slice.

    python -m bench.first_slice [--contexts 2000] [--artifacts artifacts]

Builds the first slice (`index.first_slice`, what `make run` serves within the minute) in a
scratch folder, and asks it and the full index of the release bundle (`make index`) for the
reply to held-out chitchat test contexts (their last 3 turns), in process:

- R@1: the top reply is the conversation's true next turn (as normalised text). Generic turns
  ("haha", "yeah") recur across conversations, so both indexes can hold them;
- the slice's top reply among the full index's top 10, and each top reply's cosine.

Writes reports/first_slice.{md,json} with the CPU.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.reports import write
from bench.service import cpu_description
from core.bundle import RELEASE_BUNDLE, open_bundle
from core.encoder import Encoder
from core.store import IndexStore
from core.text import normalize
from index.build import DEFAULT_SOURCE, ENGLISH_SOURCE, build_version, default_candidates
from index.corpus import load_pairs
from index.first_slice import SLICE_REPLIES, first_slice

ROOT = Path(__file__).resolve().parents[1]


def top(store: IndexStore, version: str, vectors: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """([N, k] cosines, [N, k] rows, the version's reply texts)."""
    loaded = store.load(version)
    scores, rows = loaded.reply_index.search(np.ascontiguousarray(vectors), k)
    return scores, rows, loaded.reply_texts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--contexts", type=int, default=2000)
    parser.add_argument("--artifacts", type=Path, default=ROOT / "artifacts")
    parser.add_argument("--replies", type=int, default=SLICE_REPLIES)
    parser.add_argument("--out", type=Path, default=ROOT / "reports" / "first_slice")
    args = parser.parse_args()
    bundle = open_bundle(RELEASE_BUNDLE)
    encoder = Encoder(RELEASE_BUNDLE, bundle)
    full_store = IndexStore(args.artifacts / "indexes")
    full = full_store.latest_for(bundle.checksum)
    source = full_store.manifest(full).source if full else None
    if full is None or source not in (DEFAULT_SOURCE, ENGLISH_SOURCE):
        raise SystemExit(f"no full chitchat index for {bundle.name} under {args.artifacts}: run `make index`")
    # The slice of the same candidates as the full index: with Korean, a fifth of it is Korean replies.
    candidates = default_candidates(bundle.max_context_turns, korean=source == DEFAULT_SOURCE)
    with tempfile.TemporaryDirectory() as scratch:
        slice_store = IndexStore(Path(scratch) / "indexes")
        started = time.perf_counter()
        chosen = first_slice(candidates, args.replies)
        manifest = build_version(chosen, encoder, bundle.checksum, slice_store, "first slice", progress=False)
        slice_s = time.perf_counter() - started
        pairs = load_pairs("test", bundle.max_context_turns)
        pairs = random.Random(0).sample(pairs, min(args.contexts, len(pairs)))
        contexts = encoder.encode([bundle.turn_separator.join(p.context) for p in pairs], side="context")  # [N, D]
        truth = [normalize(p.reply) for p in pairs]
        full_scores, full_rows, full_texts = top(full_store, full, contexts, 10)  # [N, 10] each
        slice_scores, slice_rows, slice_texts = top(slice_store, manifest.version, contexts, 1)  # [N, 1] each
    full_top = [normalize(full_texts[r]) for r in full_rows[:, 0]]
    slice_top = [normalize(slice_texts[r]) for r in slice_rows[:, 0]]
    in_full_top10 = [s in {normalize(full_texts[r]) for r in row} for s, row in zip(slice_top, full_rows, strict=True)]
    report: dict[str, Any] = {
        "command": "python -m bench.first_slice",
        "cpu": cpu_description(),
        "bundle": bundle.name,
        "full_index": full,
        "slice": {"replies": manifest.replies, "queries": manifest.queries, "build_seconds": round(slice_s, 1)},
        "contexts": len(pairs),
        "r_at_1": {
            "slice": round(float(np.mean([s == t for s, t in zip(slice_top, truth, strict=True)])), 4),
            "full": round(float(np.mean([f == t for f, t in zip(full_top, truth, strict=True)])), 4),
        },
        "slice_top1_in_full_top10": round(float(np.mean(in_full_top10)), 4),
        "same_top1": round(float(np.mean([s == f for s, f in zip(slice_top, full_top, strict=True)])), 4),
        "mean_top1_cosine": {
            "slice": round(float(slice_scores[:, 0].mean()), 4),
            "full": round(float(full_scores[:, 0].mean()), 4),
        },
    }
    text = "\n".join(
        [
            f"`python -m bench.first_slice` on {report['cpu']}: {bundle.name}, "
            f"{len(pairs)} held-out chitchat test contexts.",
            "",
            f"- the first slice: {manifest.replies} replies, {manifest.queries} queries, built in {slice_s:.1f} s here",
            f"- R@1 (the top reply is the true next turn): slice **{report['r_at_1']['slice']}**, "
            f"full index ({full}) **{report['r_at_1']['full']}**",
            f"- the slice's top reply is the full index's top reply for {report['same_top1']:.1%} of the contexts, "
            f"and among its top 10 for {report['slice_top1_in_full_top10']:.1%}",
            f"- mean cosine of the top reply: slice {report['mean_top1_cosine']['slice']}, "
            f"full {report['mean_top1_cosine']['full']}",
            "",
        ]
    )
    write(args.out, report, text)


if __name__ == "__main__":
    main()
