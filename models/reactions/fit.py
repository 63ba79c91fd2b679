"""The reaction heads, each with its training loop: the softmax over the classes and the valence direction."""

from __future__ import annotations

import numpy as np

from models.reactions.examples import Examples
from models.reactions.model import ReactionConfig


def class_weights(examples: Examples, written_share: float) -> np.ndarray:
    """[N] each class weighing alike; within it each language; within that our written lines
    `written_share` (where there are labelled texts too) and each labelled source alike. Mean 1."""
    label = np.array(examples.label)  # [N]
    language = np.array(examples.language)  # [N]
    source = np.array(examples.source)  # [N]
    weights = np.zeros(len(label), np.float32)  # [N]
    for c in sorted(set(label.tolist()) - {-1}):
        languages = sorted(set(language[label == c].tolist()))
        for lang in languages:
            here = (label == c) & (language == lang)
            written = here & (source == "written")
            labelled = sorted(set(source[here & ~written].tolist()))
            share = written_share if labelled and written.any() else 1.0
            if written.any():
                weights[written] = share / len(languages) / written.sum()
            for s in labelled:
                part = here & (source == s)
                weights[part] = (1.0 - share if written.any() else 1.0) / len(labelled) / len(languages) / part.sum()
    return np.asarray(weights * (label >= 0).sum() / max(float(weights.sum()), 1e-12), np.float32)


def fit_head(
    vectors: np.ndarray, labels: np.ndarray, weights: np.ndarray, classes: int, config: ReactionConfig
) -> dict[str, np.ndarray]:
    """A softmax head over frozen vectors: vectors [N, D], labels [N], weights [N] -> the arrays the
    service reads: hidden_weight [H, D], hidden_bias [H] (when hidden), weight [C, H|D], bias [C].
    Full batch: N is a few thousand, a step is milliseconds."""
    import torch
    import torch.nn.functional as F

    torch.manual_seed(config.seed)
    x, y, w = torch.from_numpy(vectors), torch.from_numpy(labels), torch.from_numpy(weights)
    layers: list[torch.nn.Module] = []
    if config.hidden:
        layers += [torch.nn.Linear(x.shape[1], config.hidden), torch.nn.ReLU(), torch.nn.Dropout(config.dropout)]
    layers.append(torch.nn.Linear(config.hidden or x.shape[1], classes))
    head = torch.nn.Sequential(*layers)
    opt = torch.optim.AdamW(head.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    for _ in range(config.steps):
        loss = (F.cross_entropy(head(x), y, reduction="none") * w).mean()  # logits [N, C]
        opt.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()
    linear = [m for m in head if isinstance(m, torch.nn.Linear)]
    out = {"weight": linear[-1].weight.detach().numpy().copy(), "bias": linear[-1].bias.detach().numpy().copy()}
    if config.hidden:
        out["hidden_weight"] = linear[0].weight.detach().numpy().copy()
        out["hidden_bias"] = linear[0].bias.detach().numpy().copy()
    return out


def fit_valence(
    vectors: np.ndarray, sides: np.ndarray, language: np.ndarray, written: np.ndarray, config: ReactionConfig
) -> tuple[np.ndarray, float]:
    """Logistic regression, good (+1) against bad (-1): vectors [N, D], sides [N], language [N],
    written [N] (our own lines) -> (direction [D], bias): log-odds of good news = vectors @ direction
    + bias. Each side of each language weighs alike; within one, our lines `config.written_share`."""
    import torch
    import torch.nn.functional as F

    weights = np.zeros(len(sides), np.float32)  # [N]
    groups = [(lang, s) for lang in sorted(set(language.tolist())) for s in (1, -1)]
    for lang, s in groups:
        part = (language == lang) & (sides == s)
        ours, theirs = part & written, part & ~written
        share = config.written_share if ours.any() and theirs.any() else float(ours.any())
        weights[ours] = share / len(groups) / max(1, ours.sum())
        weights[theirs] = (1.0 - share) / len(groups) / max(1, theirs.sum())
    torch.manual_seed(config.seed)
    x = torch.from_numpy(vectors)
    y = torch.from_numpy((sides > 0).astype(np.float32))
    w = torch.from_numpy(weights * len(sides))
    linear = torch.nn.Linear(x.shape[1], 1)
    opt = torch.optim.AdamW(linear.parameters(), lr=0.05, weight_decay=1e-4)
    for _ in range(300):
        loss = (F.binary_cross_entropy_with_logits(linear(x)[:, 0], y, reduction="none") * w).mean()
        opt.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()
    return linear.weight.detach().numpy()[0].copy(), float(linear.bias.detach()[0])
