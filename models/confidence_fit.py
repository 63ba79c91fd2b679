"""Fits the confidence model: how likely reply matching's top reply is acceptable.

"Acceptable" is the criterion the thresholds have always been fitted with
(`models/walk.py`): the judge cosine between the answer and the reply the
person sent is at least the off-topic line. The model is a logistic
regression over features of reply matching's hits and of the context
(`core/confidence.py`), fitted on validation turns with a little L2;
the service evaluates it in a few numpy operations.
"""

from __future__ import annotations

import numpy as np

from core.bundle import ConfidenceSpec

L2 = 1e-2  # on standardised features: keeps weights finite when a feature separates the labels
NEWTON_STEPS = 25


def auroc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Area under the ROC curve: the chance a random positive outscores a random negative (ties count half)."""
    labels = labels.astype(bool)
    positives, negatives = int(labels.sum()), int((~labels).sum())
    if positives == 0 or negatives == 0:
        return float("nan")
    order = np.argsort(scores, kind="stable")
    ranks = np.empty(len(scores))
    sorted_scores = scores[order]
    # Average ranks over ties, 1-based.
    _, first, counts = np.unique(sorted_scores, return_index=True, return_counts=True)
    for start, count in zip(first, counts, strict=True):
        ranks[order[start : start + count]] = start + (count + 1) / 2
    return float((ranks[labels].sum() - positives * (positives + 1) / 2) / (positives * negatives))


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return np.asarray(1.0 / (1.0 + np.exp(-np.clip(z, -60, 60))))


def fit(x: np.ndarray, labels: np.ndarray, names: list[str]) -> ConfidenceSpec:
    """x: [N, F] features named `names`; labels: [N] acceptable or not."""
    mean = x.mean(axis=0)  # [F]
    std = x.std(axis=0)  # [F]
    # A feature constant on these turns (no question in a small sample) carries
    # nothing; scale 1 keeps it at zero once the spec is rounded, not 0/0.
    scale = np.where(std > 1e-6, std, 1.0)  # [F]
    z = np.concatenate([(x - mean) / scale, np.ones((len(x), 1))], axis=1)  # [N, F+1], bias last
    y = labels.astype(np.float64)  # [N]
    w = np.zeros(z.shape[1])  # [F+1]
    penalty = np.diag([L2 * len(x)] * (z.shape[1] - 1) + [0.0])  # the bias is not shrunk
    for _ in range(NEWTON_STEPS):  # iteratively reweighted least squares
        p = _sigmoid(z @ w)  # [N]
        gradient = z.T @ (p - y) + penalty @ w  # [F+1]
        hessian = (z * (p * (1 - p))[:, None]).T @ z + penalty  # [F+1, F+1]
        w -= np.linalg.solve(hessian, gradient)
    confidence = _sigmoid(z @ w)  # [N]
    return ConfidenceSpec(
        features=list(names),
        mean=[round(float(v), 6) for v in mean],
        scale=[round(float(v), 6) for v in scale],
        weight=[round(float(v), 6) for v in w[:-1]],
        bias=round(float(w[-1]), 6),
        quantiles=[round(float(q), 6) for q in np.quantile(confidence, np.linspace(0, 1, 101))],
        auroc=round(auroc(labels, confidence), 4),
    )
