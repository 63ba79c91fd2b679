"""Inner-product FAISS indexes over unit vectors, each checked against exact search.

Small sets get an exact flat index. Larger ones get IVF-Flat: it trains in
seconds (HNSW takes minutes at 100k on two cores, which a live reindex cannot
afford), and its probe count is chosen at build time as the smallest one that
reaches the recall target against exact search on a sample.
"""

from __future__ import annotations

import logging
import math
from dataclasses import asdict, dataclass

import faiss
import numpy as np

log = logging.getLogger(__name__)

EXACT_BELOW = 20_000  # a flat scan of 20k x 384 costs ~0.5 ms: not worth an approximation
RECALL_TARGET = 0.95  # recall@10 against exact search, the bar an ANN index must clear
PROBE_CHOICES = (4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)
CHECK_QUERIES = 500
TRAIN_POINTS_PER_LIST = 40  # faiss warns below 39; more barely moves the centroids and costs linearly


@dataclass
class AnnReport:
    kind: str  # "flat" or "ivf<nlist>"
    nprobe: int
    recall_at_10: float  # measured against IndexFlatIP on CHECK_QUERIES sampled rows

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def build(vectors: np.ndarray, seed: int = 0) -> tuple[faiss.Index, AnnReport]:
    """vectors: [N, D] float32 unit rows. Returns the index and its recall report."""
    n, dim = vectors.shape
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    exact = faiss.IndexFlatIP(dim)
    exact.add(vectors)
    if n < EXACT_BELOW:
        return exact, AnnReport(kind="flat", nprobe=0, recall_at_10=1.0)

    nlist = int(4 * math.sqrt(n))
    quantizer = faiss.IndexFlatIP(dim)
    ivf = faiss.IndexIVFFlat(quantizer, dim, nlist, faiss.METRIC_INNER_PRODUCT)
    rng = np.random.default_rng(seed)
    ivf.train(vectors[rng.choice(n, size=min(n, TRAIN_POINTS_PER_LIST * nlist), replace=False)])
    ivf.add(vectors)

    # Sampled rows stand in for real queries; each row's own hit is dropped
    # from both lists so the check does not reduce to self-retrieval.
    rows = rng.choice(n, size=min(n, CHECK_QUERIES), replace=False)  # [Q]
    queries = vectors[rows]  # [Q, D]
    _, truth = exact.search(queries, 11)  # [Q, 11]
    truth = _without_self(truth, rows)  # [Q, 10]
    for nprobe in PROBE_CHOICES:
        ivf.nprobe = nprobe
        recall = recall_at_k(ivf, queries, truth, drop=rows)
        if recall >= RECALL_TARGET:
            break
    else:
        # Data with no cluster structure defeats IVF; exact search is slower
        # but never wrong, and a reindex must not fail on its data's shape.
        log.warning(
            "IVF%d recall@10 %.3f < %.2f at nprobe=%d; using exact search", nlist, recall, RECALL_TARGET, nprobe
        )
        return exact, AnnReport(kind="flat", nprobe=0, recall_at_10=1.0)
    return ivf, AnnReport(kind=f"ivf{nlist}", nprobe=nprobe, recall_at_10=round(recall, 4))


def _without_self(found: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """[Q, k+1] hits -> [Q, k], each query's own row removed (or the last hit, if absent)."""
    kept = [
        [h for h in hits if h != row][: found.shape[1] - 1]
        for hits, row in zip(found.tolist(), rows.tolist(), strict=True)
    ]
    return np.array(kept, dtype=np.int64)


def recall_at_k(index: faiss.Index, queries: np.ndarray, truth: np.ndarray, drop: np.ndarray | None = None) -> float:
    """Share of the exact top-k found in the index's top-k. truth: [Q, k].
    drop: [Q] each query's own row, excluded as in `truth`."""
    k = truth.shape[1]
    if drop is None:
        _, found = index.search(queries, k)  # [Q, k]
    else:
        _, found = index.search(queries, k + 1)  # [Q, k+1]
        found = _without_self(found, drop)
    hits = sum(len(set(f) & set(t)) for f, t in zip(found.tolist(), truth.tolist(), strict=True))
    return hits / truth.size


def configure(index: faiss.Index, report: AnnReport) -> faiss.Index:
    """Re-applies search-time parameters after loading from disk."""
    if report.nprobe:
        faiss.extract_index_ivf(index).nprobe = report.nprobe
    return index
