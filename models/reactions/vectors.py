"""The context vectors of the texts the reaction recipe reads, kept by the encoder that read them."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from core.encoder import Encoder

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / "artifacts" / "reactions"


def encoder_key(encoder: Encoder) -> str:
    """What the vectors depend on: the encoder graph, its tokenizer and how contexts are read."""
    m = encoder.manifest
    parts = [
        m.files.get("encoder.onnx", ""),
        m.files.get("tokenizer.json", ""),
        m.query_prefix,
        str(m.max_context_tokens),
    ]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def encode_cached(encoder: Encoder, texts: Sequence[str], cache: Path = CACHE, alone: bool = False) -> np.ndarray:
    """[N, D] context vectors of `texts`; texts this encoder has read before come from the cache.

    alone: each text in a batch of its own, as the service reads a lone request. The int8 graphs
    quantize activations per batch, so a text's vector moves a little with the batch it is read
    in (a class probability by 0.03 and more): the gates are chosen, and judged, on texts read alone."""
    folder = cache / encoder_key(encoder) / ("alone" if alone else "batched")
    known: dict[str, int] = {}
    stored = np.zeros((0, encoder.dim), np.float32)  # [K, D]
    if (folder / "texts.json").is_file() and (folder / "vectors.npy").is_file():
        names = json.loads((folder / "texts.json").read_text(encoding="utf-8"))
        stored = np.load(folder / "vectors.npy")
        if len(names) == len(stored):
            known = {t: i for i, t in enumerate(names)}
        else:
            stored = stored[:0]
    missing = list(dict.fromkeys(t for t in texts if t not in known))
    if missing:
        started = time.perf_counter()
        if alone:
            fresh = np.concatenate([encoder.encode([t], side="context") for t in missing])  # [M, D]
        else:
            fresh = encoder.encode(missing, side="context")  # [M, D]
        print(f"[reactions] encoded {len(missing)} texts in {time.perf_counter() - started:.0f}s", flush=True)
        for t in missing:
            known[t] = len(known)
        stored = np.concatenate([stored, fresh]) if len(stored) else fresh
        folder.mkdir(parents=True, exist_ok=True)
        np.save(folder / "vectors.npy", stored)
        (folder / "texts.json").write_text(json.dumps(list(known), ensure_ascii=False), encoding="utf-8")
    return np.asarray(stored[[known[t] for t in texts]])  # [N, D]
