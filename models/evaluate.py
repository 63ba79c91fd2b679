"""1-of-100 response selection on held-out test conversations, and encoder latency.

    python -m models.evaluate            # every bundle + TF-IDF -> reports/eval.{md,json}

For each example the true next turn competes with 99 replies drawn from the
other examples (fixed seed, never a reply equal to the true one once
normalised). Ranks are strict: a negative must score higher to push the true
reply down, and a tie does not.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from app.engine.bundle import MANIFEST, list_bundles
from app.engine.encoder import Encoder
from app.engine.text import normalize
from models.data import Split, load_conversations, load_pairs

CANDIDATES = 100
LATENCY_QUERIES = 200
LATENCY_BATCH = 64


@dataclass
class EvalSet:
    contexts: list[list[str]]  # [N] turns, oldest first
    replies: list[str]  # [N]
    negatives: np.ndarray  # [N, 99] rows of `replies`

    def joined(self, separator: str, turns: int) -> list[str]:
        return [separator.join(c[-turns:]) for c in self.contexts]


def eval_set(n: int = 2000, seed: int = 0, split: Split = "test", path: Path | None = None) -> EvalSet:
    pairs = load_pairs(split, max_context_turns=3, path=path)
    rng = np.random.default_rng(seed)
    chosen = [pairs[i] for i in rng.choice(len(pairs), size=min(n, len(pairs)), replace=False)]
    replies = [p.reply for p in chosen]
    keys = [normalize(r) for r in replies]
    negatives = np.empty((len(chosen), CANDIDATES - 1), dtype=np.int64)  # [N, 99]
    for i in range(len(chosen)):
        pool = rng.permutation(len(chosen))
        picked = [j for j in pool[: 2 * CANDIDATES] if j != i and keys[j] != keys[i]][: CANDIDATES - 1]
        negatives[i] = picked
    return EvalSet([list(p.context) for p in chosen], replies, negatives)


def ranks(context: np.ndarray, reply: np.ndarray, negatives: np.ndarray) -> np.ndarray:
    """context, reply: [N, D] unit rows; negatives [N, 99]. Returns the true reply's rank, 1-based, [N]."""
    positive = (context * reply).sum(axis=1)  # [N]
    negative = np.einsum("nd,nkd->nk", context, reply[negatives])  # [N, 99]
    return 1 + (negative > positive[:, None]).sum(axis=1)


def metrics(rank: np.ndarray) -> dict[str, float]:
    return {
        "r_at_1": round(float((rank == 1).mean()), 4),
        "r_at_10": round(float((rank <= 10).mean()), 4),
        "mrr": round(float((1.0 / rank).mean()), 4),
    }


def tfidf_metrics(data: EvalSet, path: Path | None = None) -> dict[str, float]:
    """TF-IDF on the last turn only, fitted on train turns: the lexical baseline."""
    from sklearn.feature_extraction.text import TfidfVectorizer

    train_turns = [t for c in load_conversations(path) for t in c.turns][:200_000]
    vectorizer = TfidfVectorizer(sublinear_tf=True).fit(train_turns)
    context = vectorizer.transform([c[-1] for c in data.contexts])  # [N, V] sparse, unit rows
    reply = vectorizer.transform(data.replies)  # [N, V]
    positive = np.asarray(context.multiply(reply).sum(axis=1)).ravel()  # [N]
    rank = np.ones(len(data.replies), dtype=np.int64)
    for i in range(len(data.replies)):
        scores = (reply[data.negatives[i]] @ context[i].T).toarray().ravel()  # [99]
        rank[i] += int((scores > positive[i]).sum())
    return metrics(rank)


def bundle_metrics(encoder: Encoder, data: EvalSet) -> dict[str, float]:
    m = encoder.manifest
    context = encoder.encode(data.joined(m.turn_separator, m.max_context_turns), side="context")  # [N, D]
    reply = encoder.encode(data.replies, side="reply")  # [N, D]
    return metrics(ranks(context, reply, data.negatives))


def latency(encoder: Encoder, data: EvalSet) -> dict[str, float]:
    """Context encoding only: p50 of single queries, and ms per text in batches of 64."""
    m = encoder.manifest
    texts = data.joined(m.turn_separator, m.max_context_turns)
    for text in texts[:20]:
        encoder.encode([text], side="context")
    single = []
    for text in texts[:LATENCY_QUERIES]:
        started = time.perf_counter()
        encoder.encode([text], side="context")
        single.append((time.perf_counter() - started) * 1000)
    batch = texts[: LATENCY_BATCH * 8]
    started = time.perf_counter()
    for i in range(0, len(batch), LATENCY_BATCH):
        encoder.encode(batch[i : i + LATENCY_BATCH], side="context")
    per_text = (time.perf_counter() - started) * 1000 / len(batch)
    return {"single_p50_ms": round(float(np.median(single)), 2), "batched_ms_per_text": round(per_text, 2)}


def record(bundle_dir: Path, figures: dict[str, float]) -> None:
    """The figures a bundle is released with live in its manifest; files and checksum are unchanged."""
    path = bundle_dir / MANIFEST
    manifest = json.loads(path.read_text())
    manifest["eval"] = figures
    path.write_text(json.dumps(manifest, indent=2) + "\n")


def markdown(rows: list[dict[str, Any]], n: int) -> str:
    lines = [
        f"1-of-{CANDIDATES} response selection on {n} held-out test-split examples (3-turn contexts), "
        "encoder latency for the context on this machine.",
        "",
        "| model | layers | quantization | R@1 | R@10 | MRR | single query p50 | batched (64) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        single = f"{r['single_p50_ms']:.2f} ms" if "single_p50_ms" in r else "–"
        batched = f"{r['batched_ms_per_text']:.2f} ms/text" if "batched_ms_per_text" in r else "–"
        lines.append(
            f"| {r['model']} | {r.get('layers', '–')} | {r.get('quantization', '–')} | {r['r_at_1']:.3f} | "
            f"{r['r_at_10']:.3f} | {r['mrr']:.3f} | {single} | {batched} |"
        )
    return "\n".join(lines) + "\n"


def evaluate_all(bundles_root: Path, out: Path, n: int, seed: int, path: Path | None = None) -> list[dict[str, Any]]:
    data = eval_set(n, seed, path=path)
    rows: list[dict[str, Any]] = [{"model": "TF-IDF, last turn", **tfidf_metrics(data, path)}]
    for bundle_dir, manifest in list_bundles(bundles_root):
        started = time.perf_counter()
        encoder = Encoder(bundle_dir, manifest)
        figures = {**bundle_metrics(encoder, data), **latency(encoder, data), "examples": len(data.replies)}
        record(bundle_dir, figures)
        rows.append(
            {
                "model": manifest.name,
                "layers": manifest.num_layers,
                "quantization": "int8" if manifest.quantization.startswith("int8") else "fp32",
                **figures,
            }
        )
        print(f"[eval] {manifest.name}: {figures} ({time.perf_counter() - started:.0f}s)")
    out.mkdir(parents=True, exist_ok=True)
    (out / "eval.json").write_text(json.dumps({"examples": len(data.replies), "seed": seed, "rows": rows}, indent=2))
    (out / "eval.md").write_text(markdown(rows, len(data.replies)))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bundles", type=Path, default=Path("artifacts/bundles"))
    parser.add_argument("--out", type=Path, default=Path("reports"))
    parser.add_argument("--examples", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    evaluate_all(args.bundles, args.out, args.examples, args.seed)
    print((args.out / "eval.md").read_text())


if __name__ == "__main__":
    main()
