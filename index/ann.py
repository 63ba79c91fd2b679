"""Inner-product FAISS indexes over unit vectors, each checked against exact search.

Small sets get an exact flat index. Larger ones get HNSW; its efSearch is
chosen at build time as the smallest that reaches the recall target against
exact search on sampled rows. Measured on the ~96k chitchat replies (384-d,
one thread): exact scan 9.8 ms/query; IVF-Flat (1237 lists) needs nprobe 64
for recall@10 0.95 at 0.70 ms; HNSW (M=32) gives 0.976 at efSearch 32 in
0.16 ms and builds in 10 s on two cores.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass

import faiss
import numpy as np

log = logging.getLogger(__name__)

EXACT_BELOW = 20_000  # a flat scan of 20k x 384 costs ~0.5 ms: not worth an approximation
RECALL_TARGET = 0.95  # recall@10 against exact search, the bar an ANN index must clear
HNSW_M = 32  # links per node: 16 loses recall on 384-d text vectors, 64 doubles memory for little
HNSW_EF_CONSTRUCTION = 40  # faiss's default; higher builds slower for <1 point of recall here
EF_SEARCH_CHOICES = (16, 32, 48, 64, 96, 128, 256, 512)
CHECK_QUERIES = 500


@dataclass
class AnnReport:
    kind: str  # "flat" or "hnsw<M>"
    ef_search: int  # 0 for flat
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
        return exact, AnnReport(kind="flat", ef_search=0, recall_at_10=1.0)

    hnsw = faiss.IndexHNSWFlat(dim, HNSW_M, faiss.METRIC_INNER_PRODUCT)
    hnsw.hnsw.efConstruction = HNSW_EF_CONSTRUCTION
    hnsw.add(vectors)

    # Sampled rows stand in for real queries; each row's own hit is dropped
    # from both lists so the check does not reduce to self-retrieval.
    rng = np.random.default_rng(seed)
    rows = rng.choice(n, size=min(n, CHECK_QUERIES), replace=False)  # [Q]
    queries = vectors[rows]  # [Q, D]
    _, truth = exact.search(queries, 11)  # [Q, 11]
    truth = _without_self(truth, rows)  # [Q, 10]
    for ef_search in EF_SEARCH_CHOICES:
        hnsw.hnsw.efSearch = ef_search
        recall = recall_at_k(hnsw, queries, truth, drop=rows)
        if recall >= RECALL_TARGET:
            break
    else:
        # Exact search is slower but never wrong, and a reindex must not fail
        # on its data's shape.
        log.warning("HNSW recall@10 %.3f < %.2f at efSearch=%d; using exact search", recall, RECALL_TARGET, ef_search)
        return exact, AnnReport(kind="flat", ef_search=0, recall_at_10=1.0)
    return hnsw, AnnReport(kind=f"hnsw{HNSW_M}", ef_search=ef_search, recall_at_10=round(recall, 4))


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
    if report.ef_search:
        faiss.downcast_index(index).hnsw.efSearch = report.ef_search  # type: ignore[attr-defined]
    return index
