"""Poly-encoder rerank of the FAISS top-k, in numpy (Humeau et al., ICLR 2020).

The context graph outputs m poly vectors; each candidate's stored reply
vector attends over them to build its own context vector. `tests/test_rerank.py`
holds it to the poly-encoder's score written in torch. No shipped bundle has a
poly head: none trained over the 6-layer student or the default encoder gained
beyond noise through the live API (docs/experiments.md), so a bundle that brings
its own is what this serves.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from core.bundle import PolySpec


def _softmax(logits: np.ndarray) -> np.ndarray:
    # logits: [K, m] -> [K, m], rows sum to 1
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    return np.asarray(shifted / shifted.sum(axis=1, keepdims=True))


@dataclass(frozen=True)
class PolyReranker:
    spec: PolySpec

    def poly_scores(self, poly: np.ndarray, replies: np.ndarray) -> np.ndarray:
        """poly: [m, D] context vectors; replies: [K, D] unit rows -> [K] cosines."""
        attention = _softmax(replies @ poly.T)  # [K, m]
        context = attention @ poly  # [K, D]: one context vector per candidate
        context /= np.maximum(np.linalg.norm(context, axis=1, keepdims=True), 1e-12)
        return np.asarray((context * replies).sum(axis=1))  # [K]

    def rescore(self, poly: np.ndarray, bi_scores: np.ndarray, replies: np.ndarray) -> np.ndarray:
        """bi_scores: [K] FAISS cosines of the same candidates -> [K] reranked scores."""
        weight = self.spec.weight
        return (1.0 - weight) * bi_scores + weight * self.poly_scores(poly, replies)
