"""Maps between two models' spaces: a least-squares map between embedding tables over the words both
vocabularies spell alike, and the rotation that best carries one model's vectors onto another's."""

from __future__ import annotations

import torch


def shared_words(student_vocab: dict[str, int], minilm_vocab: dict[str, int]) -> list[tuple[int, int]]:
    """(student id, MiniLM id) of pieces both vocabularies spell alike: a word start "▁x"
    is WordPiece's "x", a continuation "x" is its "##x". One-letter words ("▁a") are left out.
    In the student's id order, whatever order the vocabulary comes in (a tokenizer's changes
    from one process to the next): the map fitted on them is then the same on every run."""
    pairs = []
    for piece, student_id in sorted(student_vocab.items(), key=lambda item: item[1]):
        word = piece[1:] if piece.startswith("▁") else "##" + piece
        if len(word) > 1 and word in minilm_vocab:
            pairs.append((student_id, minilm_vocab[word]))
    return pairs


def fit_map(source: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """[De, D] least-squares W with source @ W ~ target: source [N, De], target [N, D]."""
    return torch.linalg.lstsq(source, target).solution


def procrustes(source: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """[D', D] orthogonal R minimising |source @ R - target|: source [N, D'], target [N, D]."""
    u, _, vt = torch.linalg.svd(source.T @ target, full_matrices=False)  # [D', k], [k], [k, D]
    return u @ vt
