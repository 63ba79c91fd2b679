"""Does lexical evidence pay? Dense reply matching alone against dense fused with BM25, per language.

    python -m bench.lexical [--bundle models/release/e5]   # -> reports/lexical.{md,json}

On each human chit-chat dev set (models/ood.py), in process with the served
encoder: every distinct reply is a candidate, each distinct context asks, and
R@1 counts the gold reply first (the bench.ood protocol, with exact search).
The lexical scorer is BM25 (k1 = 1.2, b = 0.75) over the candidates' words for
English and over character bigrams and trigrams for Korean (its words carry
particles, so a whole-word match is rare). Fusion adds `weight` x the BM25
scores, scaled to [0, 1] per context, to the cosines. The weight is chosen on
half A; half B is reported beside it. The bar for turning it on for a
language: +0.01 R@1 on half B at no more than 1 ms p50 a context.
"""

from __future__ import annotations

import argparse
import re
import time
from pathlib import Path
from typing import Any

import numpy as np
from scipy import sparse

from bench.reports import write
from bench.service import cpu_description
from core.bundle import RELEASE_BUNDLE, open_bundle
from core.encoder import Encoder
from core.text import normalize
from models.ood import ReplySet, available_human, human_set

ROOT = Path(__file__).resolve().parents[1]
WEIGHTS = (0.0, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5)
BAR_R_AT_1 = 0.01
BAR_MS = 1.0
K1, B = 1.2, 0.75


def terms(text: str, language: str) -> list[str]:
    """Words for English; character 2- and 3-grams of each word for Korean."""
    words = re.findall(r"\w+", normalize(text, lowercase=True))
    if language != "ko":
        return words
    return [w[i : i + n] for w in words for n in (2, 3) for i in range(max(1, len(w) - n + 1))]


class BM25:
    """Okapi BM25 over a fixed set of documents: `scores(query)` is a [N] vector."""

    def __init__(self, documents: list[list[str]]) -> None:
        vocabulary: dict[str, int] = {}
        rows, cols, counts = [], [], []
        for i, doc in enumerate(documents):
            for term, count in zip(*np.unique(doc, return_counts=True), strict=True) if doc else ():
                rows.append(i)
                cols.append(vocabulary.setdefault(str(term), len(vocabulary)))
                counts.append(float(count))
        tf = sparse.csr_matrix((counts, (rows, cols)), shape=(len(documents), len(vocabulary)))  # [N, V]
        lengths = np.array([len(d) for d in documents], dtype=np.float64)  # [N]
        frequency = np.bincount(cols, minlength=len(vocabulary))  # [V] documents holding each term
        self.idf = np.log(1 + (len(documents) - frequency + 0.5) / (frequency + 0.5))  # [V]
        norm = K1 * (1 - B + B * lengths / max(1.0, lengths.mean()))  # [N]
        tf = tf.tocoo()
        weight = tf.data * (K1 + 1) / (tf.data + norm[tf.row])
        self.weights = sparse.csc_matrix((weight, (tf.row, tf.col)), shape=tf.shape)  # [N, V]
        self.vocabulary = vocabulary

    def scores(self, query: list[str]) -> np.ndarray:
        ids = [self.vocabulary[t] for t in set(query) if t in self.vocabulary]
        if not ids:
            return np.zeros(self.weights.shape[0])
        return np.asarray(self.weights[:, ids] @ self.idf[ids]).ravel()  # [N]


def evaluate(encoder: Encoder, data: ReplySet) -> dict[str, Any]:
    m = encoder.manifest
    contexts = [encoder.join_context(c) for c in data.contexts]
    dense = encoder.encode(contexts, side="context") @ encoder.encode(data.replies, side="reply").T  # [C, N]
    bm25 = BM25([terms(r, data.language) for r in data.replies])
    started = time.perf_counter()
    lexical = np.stack([bm25.scores(terms(" ".join(c[-m.max_context_turns :]), data.language)) for c in data.contexts])
    ms = (time.perf_counter() - started) * 1000 / len(contexts)  # [C, N] above; ms a context
    top = lexical.max(axis=1, keepdims=True)  # [C, 1]
    scaled = np.divide(lexical, top, out=np.zeros_like(lexical), where=top > 0)  # [C, N] in [0, 1]
    keys = [normalize(r) for r in data.replies]
    halves = np.array(data.halves)  # [C]

    def r_at_1(weight: float) -> dict[str, float]:
        best = (dense + weight * scaled).argmax(axis=1)  # [C]
        hit = np.array([keys[j] in data.gold[i] for i, j in enumerate(best)])  # [C]
        return {h: round(float(hit[halves == h].mean()), 4) for h in ("A", "B")}

    by_weight = {w: r_at_1(w) for w in WEIGHTS}
    chosen = max(WEIGHTS, key=lambda w: (by_weight[w]["A"], -w))  # the lightest weight among equals
    gain = round(by_weight[chosen]["B"] - by_weight[0.0]["B"], 4)
    return {
        "language": data.language,
        "by_weight": {str(w): v for w, v in by_weight.items()},
        "chosen_weight": chosen,
        "half_b_gain": gain,
        "lexical_ms_per_context": round(ms, 3),
        "passes": gain >= BAR_R_AT_1 and ms <= BAR_MS and chosen > 0,
    }


def markdown(bundle: str, rows: dict[str, dict[str, Any]], cpu: str) -> str:
    lines = [
        f"# Lexical evidence fused with dense reply matching (`python -m bench.lexical`, {bundle}, {cpu})",
        "",
        "R@1 in process, every distinct reply a candidate; weight chosen on half A, gain read on half B. "
        f"Bar to turn it on: +{BAR_R_AT_1} R@1 on half B at <= {BAR_MS} ms a context.",
        "",
        "| set | " + " | ".join(f"w={w}: A / B" for w in WEIGHTS) + " | chosen | half-B gain | ms | on |",
        "|---|" + "---|" * (len(WEIGHTS) + 4),
    ]
    for name, r in rows.items():
        cells = [f"{v['A']:.3f} / {v['B']:.3f}" for v in r["by_weight"].values()]
        lines.append(
            f"| {name} | " + " | ".join(cells) + f" | {r['chosen_weight']} | {r['half_b_gain']:+.4f} "
            f"| {r['lexical_ms_per_context']:.2f} | {'yes' if r['passes'] else 'no'} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bundle", type=Path, default=RELEASE_BUNDLE)
    parser.add_argument("--out", type=Path, default=ROOT / "reports" / "lexical")
    args = parser.parse_args()
    manifest = open_bundle(args.bundle)
    encoder = Encoder(args.bundle, manifest)
    rows = {name: evaluate(encoder, human_set(name)) for name in available_human()}
    cpu = cpu_description()
    report = {"bundle": manifest.name, "checksum": manifest.checksum, "cpu": cpu, "sets": rows}
    write(args.out, report, markdown(manifest.name, rows, cpu))


if __name__ == "__main__":
    main()
