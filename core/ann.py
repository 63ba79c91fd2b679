"""Inner-product FAISS indexes over unit vectors, each checked against exact search.

Vectors are stored once, at 8 bits per dimension (a scalar quantiser trained
per dimension), inside the index: the poly rerank and the next reindex read
them back from it. Small sets get a flat scan over the codes. Larger ones get
a graph or an inverted file over them, whichever the role needs, with the
search parameter chosen at build time as the smallest that reaches the
recall target against exact fp32 search on probe queries. One that cannot
falls back to the flat scan of the codes, checked the same way, and then
to exact fp32 search.

Measured on the ~96k chitchat replies with 2,000 held-out contexts as
queries (`python -m bench.ann`, reports/ann.md): at recall@10 >= 0.98,
HNSW M=32 over 8-bit codes needed efSearch 512 (1.3 ms, 60 MB), M=64 needed
128 (0.55 ms, 83 MB), IVF over 8-bit codes nprobe 192 of 1,024 lists
(1.1 ms, 37 MB), flat 8-bit 3.3 ms, exact fp32 7.0 ms (140 MB). The replies
are searched and reranked on every /reply, so they get the fast graph. The
stored queries are searched only when a last turn repeats one or a request
sets its own threshold: they get a flat scan of their codes (37 MB at 92k)
and, past INVERTED_ABOVE rows, an inverted file, which keeps a version
under 150 MB.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from typing import Literal

import faiss
import numpy as np

log = logging.getLogger(__name__)

EXACT_BELOW = 20_000  # a flat scan of 20k 8-bit codes costs ~0.7 ms: not worth an approximation
# Below this, the "inverted" role (the stored queries) scans its 8-bit codes: on chitchat's 92,045
# queries a one-thread scan cost 4.1 ms (6.0 fp32) and reached recall@10 0.989, where an inverted file
# took 7.5 s to build and never reached the target (0.977 at nprobe 256 of 1,216 lists, by the build's own check).
INVERTED_ABOVE = 150_000
RECALL_TARGET = 0.98  # recall@10 against exact fp32 search, the bar an index must clear
HNSW_M = 64  # links per node: 32 needed efSearch 512 for the target on held-out contexts, 64 needs 128-192
# Graph quality: lower builds faster but needs a larger efSearch. Keep it at most 2 * HNSW_M: with
# faiss 1.15.1 recall falls off a cliff above that (chitchat's 95,703 replies, 8-bit codes, 2,000
# held-out contexts, recall@10 at efSearch 128: efC 64 0.973, 100 0.979, 120 0.981, 136 0.932, 200 0.945).
HNSW_EF_CONSTRUCTION = 100
EF_SEARCH_CHOICES = (16, 32, 48, 64, 96, 128, 160, 192, 256, 384, 512)
NPROBE_CHOICES = (8, 16, 32, 48, 64, 96, 128, 160, 192, 256)
CHECK_QUERIES = 500
# An 8-bit quantiser's training copies what it is given (transposed, or as residuals): on all ~96k
# rows those copies were a reindex's peak, +150 MB. Its per-dimension ranges need far fewer rows.
# (k-means for an inverted file's lists reads all rows in place: trained on a 50k sample, it needed
# nprobe 192 instead of 128 for the recall target on the chitchat queries with one of two seeds.)
QUANTISER_SAMPLE = 20_000
ADD_CHUNK = 8192  # rows an inverted file is given at a time
QUANTIZER = faiss.ScalarQuantizer.QT_8bit
Structure = Literal["graph", "inverted"]


@dataclass
class AnnReport:
    kind: str  # "flat-sq8", "hnsw64-sq8", "ivf1024-sq8", or "flat" (fp32, the fallback)
    ef_search: int  # HNSW's efSearch; 0 otherwise
    recall_at_10: float  # measured against exact fp32 search on CHECK_QUERIES probe queries
    nprobe: int = 0  # IVF's lists searched; 0 otherwise

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def exact(vectors: np.ndarray) -> faiss.Index:
    index = faiss.IndexFlatIP(vectors.shape[1])
    index.add(vectors)
    return index


def training_rows(vectors: np.ndarray, size: int, seed: int = 0) -> np.ndarray:
    """[T, D] at most `size` rows of vectors [N, D], sampled without replacement."""
    if len(vectors) <= size:
        return vectors
    rows = np.random.default_rng(seed).choice(len(vectors), size=size, replace=False)
    return vectors[np.sort(rows)]


def flat_sq8(vectors: np.ndarray) -> faiss.Index:
    index = faiss.IndexScalarQuantizer(vectors.shape[1], QUANTIZER, faiss.METRIC_INNER_PRODUCT)
    index.train(training_rows(vectors, QUANTISER_SAMPLE))
    index.add(vectors)
    return index


def hnsw_sq8(vectors: np.ndarray, m: int = HNSW_M, ef_construction: int = HNSW_EF_CONSTRUCTION) -> faiss.IndexHNSWSQ:
    # The stubs name the quantiser type's enum as a ScalarQuantizer; SWIG takes the int.
    index = faiss.IndexHNSWSQ(vectors.shape[1], QUANTIZER, m, faiss.METRIC_INNER_PRODUCT)  # type: ignore[arg-type]
    index.hnsw.efConstruction = ef_construction
    index.train(training_rows(vectors, QUANTISER_SAMPLE))
    index.add(vectors)
    return index


def ivf_sq8(vectors: np.ndarray) -> faiss.IndexIVFScalarQuantizer:
    lists = max(64, 64 * round(4 * float(np.sqrt(len(vectors))) / 64))  # ~4 sqrt(N): 1,216 for 96k
    quantizer = faiss.IndexFlatIP(vectors.shape[1])
    index = faiss.IndexIVFScalarQuantizer(quantizer, vectors.shape[1], lists, QUANTIZER, faiss.METRIC_INNER_PRODUCT)
    # The lists first, on every row: with the coarse quantiser full, `train` skips k-means and
    # trains only the 8-bit quantiser, on a sample's residuals.
    faiss.Clustering(vectors.shape[1], lists, index.cp).train(vectors, quantizer)
    index.train(training_rows(vectors, QUANTISER_SAMPLE))
    # An inverted file encodes each added block's residuals in a temporary copy; faiss's own blocks
    # are 65,536 rows, ~100 MB at D = 384, so it gets smaller ones.
    for start in range(0, len(vectors), ADD_CHUNK):
        index.add(vectors[start : start + ADD_CHUNK])
    return index


def build(
    vectors: np.ndarray, structure: Structure = "graph", probes: np.ndarray | None = None, seed: int = 0
) -> tuple[faiss.Index, AnnReport]:
    """vectors: [N, D] float32 unit rows. Returns the index and its recall report.

    probes: [P, D] vectors like the queries the index will serve (the recall
    check samples CHECK_QUERIES of them); by default sampled rows of the index
    itself, each with its own hit dropped so the check does not reduce to
    self-retrieval."""
    n, _ = vectors.shape
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    rng = np.random.default_rng(seed)
    drop: np.ndarray | None = None
    if probes is not None and len(probes):
        queries = np.ascontiguousarray(
            probes[rng.choice(len(probes), size=min(len(probes), CHECK_QUERIES), replace=False)]
        )
        _, truth = _exact_top(queries, vectors, 10)  # [Q, 10]
    else:
        drop = rng.choice(n, size=min(n, CHECK_QUERIES), replace=False)  # [Q]
        queries = vectors[drop]  # [Q, D]
        _, found = _exact_top(queries, vectors, 11)  # [Q, 11]
        truth = _without_self(found, drop)  # [Q, 10]

    if n < EXACT_BELOW or (structure == "inverted" and n < INVERTED_ABOVE):
        attempts = [_flat_codes]
    elif structure == "graph":
        attempts = [_graph, _flat_codes]
    else:
        attempts = [_inverted, _flat_codes]
    recall = 0.0
    for attempt in attempts:
        index, report = attempt(vectors, queries, truth, drop)
        if report.recall_at_10 >= RECALL_TARGET:
            return index, report
        recall = max(recall, report.recall_at_10)
        del index
    # Exact fp32 search is slower and four times the size, but never wrong, and
    # a reindex must not fail on its data's shape.
    log.warning("recall@10 %.3f < %.2f with 8-bit codes; storing fp32 and searching exactly", recall, RECALL_TARGET)
    return exact(vectors), AnnReport(kind="flat", ef_search=0, recall_at_10=1.0)


# Each tries one kind of index over 8-bit codes, with its search parameter (if any) the smallest
# that reaches the recall target on `queries`; the report says the recall it reached.
def _flat_codes(
    vectors: np.ndarray, queries: np.ndarray, truth: np.ndarray, drop: np.ndarray | None
) -> tuple[faiss.Index, AnnReport]:
    index = flat_sq8(vectors)
    recall = recall_at_k(index, queries, truth, drop)
    return index, AnnReport(kind="flat-sq8", ef_search=0, recall_at_10=round(recall, 4))


def _graph(
    vectors: np.ndarray, queries: np.ndarray, truth: np.ndarray, drop: np.ndarray | None
) -> tuple[faiss.Index, AnnReport]:
    graph = hnsw_sq8(vectors)
    for ef_search in EF_SEARCH_CHOICES:
        graph.hnsw.efSearch = ef_search
        recall = recall_at_k(graph, queries, truth, drop)
        if recall >= RECALL_TARGET:
            break
    return graph, AnnReport(kind=f"hnsw{HNSW_M}-sq8", ef_search=ef_search, recall_at_10=round(recall, 4))


def _inverted(
    vectors: np.ndarray, queries: np.ndarray, truth: np.ndarray, drop: np.ndarray | None
) -> tuple[faiss.Index, AnnReport]:
    inverted = ivf_sq8(vectors)
    for nprobe in NPROBE_CHOICES:
        inverted.nprobe = nprobe
        recall = recall_at_k(inverted, queries, truth, drop)
        if recall >= RECALL_TARGET:
            break
    kind = f"ivf{inverted.nlist}-sq8"
    return inverted, AnnReport(kind=kind, ef_search=0, recall_at_10=round(recall, 4), nprobe=nprobe)


def _exact_top(queries: np.ndarray, vectors: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact inner-product top k of queries [Q, D] over vectors [N, D], searched in place:
    a flat index would first copy the vectors (150 MB at 96k), at a reindex's peak."""
    return faiss.knn(queries, vectors, k, metric=faiss.METRIC_INNER_PRODUCT)  # ([Q, k], [Q, k])


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


# Fewer admitted rows than this are searched exactly, as a set of this size would be stored flat
# (EXACT_BELOW): `filters.exact_subset` copies them into a flat index of their own, and `search`
# below, given only a bitmap, scans every stored code with a bitmap test per row.
FILTERED_EXACT_BELOW = EXACT_BELOW
MAX_FILTERED_EF = 1024  # a graph search keeps efSearch / (admitted share) candidates, up to this
SUBSET_FP32_BELOW = 2000  # rows a subset keeps as fp32 (3 MB at most): 8-bit ranges need more rows to train


@dataclass(frozen=True)
class Subset:
    """Some rows of an index, copied into a flat index of their own, so that an exact scan of
    them reads only them (a bitmap over the whole index reads every stored code)."""

    index: faiss.Index  # flat, over `rows` in their order
    rows: np.ndarray  # [S] int64: each one's row in the whole index

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """queries [Q, D] -> (scores [Q, k], rows of the whole index [Q, k]), rows -1 past the last hit."""
        scores, local = self.index.search(queries, k)  # [Q, k] each
        return scores, np.where(local >= 0, self.rows[np.maximum(local, 0)], -1)


def subset(index: faiss.Index, rows: np.ndarray) -> Subset:
    """rows: [S] ascending rows of `index` (an inverted file needs `allow_row_lookup` first)."""
    vectors = vectors_of(index, rows)  # [S, D] decoded from the stored codes
    flat = exact(vectors) if len(rows) < SUBSET_FP32_BELOW else flat_sq8(vectors)
    return Subset(flat, np.asarray(rows, dtype=np.int64))


def search(
    index: faiss.Index, queries: np.ndarray, k: int, selector: faiss.IDSelector | None = None, admitted: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """queries [Q, D] -> (scores [Q, k], rows [Q, k]), rows -1 past the last hit.

    With a selector, only the `admitted` rows it lets through can come back,
    and the top k is taken among them, never cut from an unfiltered top k.
    Few admitted rows are scanned exactly; many go through the graph or the
    inverted file, with the search widened by the share they are of all rows,
    so that as many admitted candidates are kept as an unfiltered search keeps."""
    if selector is None:
        return index.search(queries, k)
    if admitted == 0:
        return np.full((len(queries), k), -np.inf, np.float32), np.full((len(queries), k), -1, np.int64)
    widen = index.ntotal / admitted
    outer = faiss.downcast_index(index)
    ivf = faiss.try_extract_index_ivf(index)
    params: faiss.SearchParameters
    if isinstance(outer, faiss.IndexHNSW):
        if admitted < FILTERED_EXACT_BELOW:
            index, params = faiss.downcast_index(outer.storage), faiss.SearchParameters()
        else:
            ef = min(MAX_FILTERED_EF, int(np.ceil(outer.hnsw.efSearch * widen)))
            params = faiss.SearchParametersHNSW()  # type: ignore[attr-defined]  # missing from the stubs
            params.efSearch = max(k, ef)  # type: ignore[attr-defined]
    elif ivf is not None:
        exact_scan = admitted < FILTERED_EXACT_BELOW
        params = faiss.SearchParametersIVF()
        params.nprobe = ivf.nlist if exact_scan else min(ivf.nlist, int(np.ceil(ivf.nprobe * widen)))
    else:  # a flat scan: exact already
        params = faiss.SearchParameters()
    params.sel = selector
    return index.search(queries, k, params=params)


# A search that only asks whether the index holds a near copy of the query (query
# similarity answers at a cosine of ~0.998): such a vector sits in the query's own
# inverted list or graph neighbourhood, so the fewest probes find it.
NARROW_NPROBE = 8
NARROW_EF = 32


def narrow_search(index: faiss.Index, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """`search` with the fewest probes the index allows: its top hit is right when the
    query has a near copy, its ranking below that is not. A flat index searches exactly."""
    outer = faiss.downcast_index(index)
    ivf = faiss.try_extract_index_ivf(index)
    params: faiss.SearchParameters
    if isinstance(outer, faiss.IndexHNSW):
        params = faiss.SearchParametersHNSW()  # type: ignore[attr-defined]  # missing from the stubs
        params.efSearch = max(k, min(outer.hnsw.efSearch, NARROW_EF))  # type: ignore[attr-defined]
    elif ivf is not None:
        params = faiss.SearchParametersIVF()
        params.nprobe = min(ivf.nprobe, NARROW_NPROBE)
    else:
        return index.search(queries, k)
    return index.search(queries, k, params=params)


def configure(index: faiss.Index, report: AnnReport) -> faiss.Index:
    """Re-applies search-time parameters after loading from disk."""
    if report.ef_search:
        faiss.downcast_index(index).hnsw.efSearch = report.ef_search  # type: ignore[attr-defined]
    if report.nprobe:
        faiss.extract_index_ivf(index).nprobe = report.nprobe
    return index


def allow_row_lookup(index: faiss.Index) -> None:
    """An inverted file decodes given rows only with a row -> list map (8 bytes a row)."""
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is not None:
        ivf.make_direct_map()


def vectors_of(index: faiss.Index, rows: np.ndarray | None = None) -> np.ndarray:
    """[R, D] float32 vectors stored in the index (decoded from their codes); all rows when None."""
    if rows is None:
        return np.asarray(index.reconstruct_n(0, index.ntotal), dtype=np.float32)
    return np.asarray(index.reconstruct_batch(np.ascontiguousarray(rows, dtype=np.int64)), dtype=np.float32)
