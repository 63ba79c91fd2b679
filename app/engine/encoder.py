"""Texts -> unit vectors: `tokenizers` + onnxruntime, no torch.

The ONNX graph does mean pooling and L2 normalisation itself, so the vectors
it returns go straight into an inner-product FAISS index.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer

from app.engine.bundle import ENCODER_FILE, TOKENIZER_FILE, BundleManifest

Side = Literal["context", "reply"]

OUTPUT_NAMES: dict[Side, str] = {"context": "context_embedding", "reply": "reply_embedding"}


def _tokenizer(path: Path, max_tokens: int, truncate_from: Literal["left", "right"]) -> Tokenizer:
    tokenizer = Tokenizer.from_file(str(path))
    tokenizer.enable_truncation(max_length=max_tokens, direction=truncate_from)
    # tokenizer.json ships fixed 128-token padding; pad to the batch's longest
    # instead, which is what makes short chat turns cheap.
    tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")
    return tokenizer


class Encoder:
    def __init__(self, bundle_dir: Path, manifest: BundleManifest, intra_op_threads: int = 0) -> None:
        self.manifest = manifest
        options = ort.SessionOptions()
        # 0 lets onnxruntime use every core; one session serves requests one
        # batch at a time, so inter-op parallelism would only add contention.
        options.intra_op_num_threads = intra_op_threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.session = ort.InferenceSession(str(bundle_dir / ENCODER_FILE), options, providers=["CPUExecutionProvider"])
        tokenizer_path = bundle_dir / TOKENIZER_FILE
        self._tokenizers: dict[Side, Tokenizer] = {
            # A context keeps its most recent turns, so it loses tokens on the left.
            "context": _tokenizer(tokenizer_path, manifest.max_context_tokens, truncate_from="left"),
            "reply": _tokenizer(tokenizer_path, manifest.max_reply_tokens, truncate_from="right"),
        }

    @property
    def dim(self) -> int:
        return self.manifest.dim

    def join_context(self, turns: Sequence[str]) -> str:
        """The last `max_context_turns` turns, oldest first, with the turn separator."""
        return self.manifest.turn_separator.join(turns[-self.manifest.max_context_turns :])

    def _feed(self, texts: Sequence[str], side: Side) -> dict[str, np.ndarray]:
        encodings = self._tokenizers[side].encode_batch(list(texts))
        return {
            "input_ids": np.array([e.ids for e in encodings], dtype=np.int64),  # [B, T]
            "attention_mask": np.array([e.attention_mask for e in encodings], dtype=np.int64),  # [B, T]
        }

    def encode(self, texts: Sequence[str], side: Side, batch_size: int = 64) -> np.ndarray:
        """Returns [len(texts), dim] float32, unit rows."""
        out = np.empty((len(texts), self.dim), dtype=np.float32)  # [N, D]
        # Length-sorted batches pad little; results are written back in input order.
        order = np.argsort([len(t) for t in texts], kind="stable")
        for start in range(0, len(texts), batch_size):
            rows = order[start : start + batch_size]
            (vectors,) = self.session.run([OUTPUT_NAMES[side]], self._feed([texts[i] for i in rows], side))
            out[rows] = vectors  # [B, D]
        return out

    def encode_both(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """One pass, both heads: ([N, D] context vectors, [N, D] reply vectors).

        Tokenised with the reply limit: this is for stored single turns, which
        the index uses both as replies and as queries.
        """
        context, reply = self.session.run([OUTPUT_NAMES["context"], OUTPUT_NAMES["reply"]], self._feed(texts, "reply"))
        return context, reply
