"""1-of-100 response selection per bundle, with and without the poly rerank,
the TF-IDF baseline, and the context encoder's latency."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from core.encoder import Encoder
from core.reranker import PolyReranker
from index.corpus import load_conversations
from models.evalset import EvalSet, metrics, ranks, reranked_ranks
from models.tables import cell

LATENCY_QUERIES = 200
LATENCY_BATCH = 64


def tfidf_metrics(data: EvalSet, path: Path | None = None) -> dict[str, float]:
    """TF-IDF on the last turn only, fitted on corpus turns: the lexical baseline."""
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


def bundle_ranks(encoder: Encoder, data: EvalSet, depth: int = 50) -> tuple[np.ndarray, np.ndarray | None]:
    """[N] rank of the true reply by the bi-encoder, and after the poly rerank of its top `depth`."""
    m = encoder.manifest
    joined = data.joined(m.turn_separator, m.max_context_turns)
    reply = encoder.encode(data.replies, side="reply")  # [N, D]
    if m.poly is None:
        return ranks(encoder.contexts(data.contexts), reply, data.negatives), None
    context, poly = encoder.encode_with_poly(joined)  # [N, D], [N, m, D]
    candidates = data.candidates  # [N, 100], true first
    bi = np.einsum("nd,ncd->nc", context, reply[candidates])  # [N, 100]
    reranker = PolyReranker(m.poly)
    final = np.stack([reranker.rescore(poly[i], bi[i], reply[candidates[i]]) for i in range(len(joined))])
    return ranks(context, reply, data.negatives), reranked_ranks(bi, final, depth)


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


def bundle_figures(encoder: Encoder, data: EvalSet, depth: int) -> dict[str, float]:
    """R@1, R@10, MRR; with a poly head also R@1 after the rerank and what it adds."""
    bi, reranked = bundle_ranks(encoder, data, depth)
    figures = metrics(bi)
    if reranked is not None:
        figures["rerank_r_at_1"] = round(float((reranked == 1).mean()), 4)
        figures["rerank_gain"] = round(figures["rerank_r_at_1"] - figures["r_at_1"], 4)
    return figures


def markdown(rows: list[dict[str, Any]], n: int) -> str:
    lines = [
        f"1-of-100 response selection on {n} held-out test-split examples (3-turn contexts), and the context "
        "encoder's latency on this machine. \"+ poly\": the bi-encoder's top 50 reranked by the bundle's poly head.",
        "",
        "| model | layers | quantization | R@1 | R@1 + poly | R@10 | MRR | single query p50 | batched (64) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r.get('layers', '–')} | {r.get('quantization', '–')} | {r['r_at_1']:.3f} | "
            f"{cell(r.get('rerank_r_at_1'))} | {r['r_at_10']:.3f} | {r['mrr']:.3f} | "
            f"{cell(r.get('single_p50_ms'), '{:.2f} ms')} | {cell(r.get('batched_ms_per_text'), '{:.2f} ms/text')} |"
        )
    return "\n".join(lines) + "\n"
