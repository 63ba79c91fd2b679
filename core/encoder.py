"""Texts -> unit vectors: `tokenizers` + onnxruntime, no torch.

The ONNX graph does mean pooling and L2 normalisation itself, so the vectors
it returns go straight into an inner-product FAISS index.
"""

from __future__ import annotations

import hashlib
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer

from core.bundle import COMBINER_FILE, ENCODER_FILE, TOKENIZER_FILE, BundleManifest
from core.context import Combiner, turn_vectors
from core.turn_tokens import TurnTokenizer

Side = Literal["context", "reply"]

OUTPUT_NAMES: dict[Side, str] = {"context": "context_embedding", "reply": "reply_embedding"}
# Present when the bundle has a poly head: [B, m, D], the m context vectors.
POLY_OUTPUT = "poly_vectors"


# (tokenizer.json's sha256, max tokens, side cut) -> the loaded tokenizer, while an encoder holds it.
_LOADED: weakref.WeakValueDictionary[tuple[str, int, str], Tokenizer] = weakref.WeakValueDictionary()
_LOADING = threading.Lock()


def _tokenizer(path: Path, max_tokens: int, truncate_from: Literal["left", "right"]) -> Tokenizer:
    """One tokenizer per file content and setting in the process: bundles with the same
    tokenizer.json share it (the reaction model reads with the default encoder's vocabulary).
    A loaded e5 tokenizer holds about 23 MB; nothing changes one after it is set up here."""
    content = path.read_bytes()
    key = (hashlib.sha256(content).hexdigest(), max_tokens, truncate_from)
    with _LOADING:
        if (shared := _LOADED.get(key)) is not None:
            return shared
        tokenizer = Tokenizer.from_str(content.decode("utf-8"))
        tokenizer.enable_truncation(max_length=max_tokens, direction=truncate_from)
        # tokenizer.json ships fixed 128-token padding; batches are padded here
        # instead, to their own longest row.
        tokenizer.no_padding()
        _LOADED[key] = tokenizer
        return tokenizer


def prefix_length(tokenizer: Tokenizer, prefix: str) -> int:
    """How many ids every encoding of prefix + text starts with: the start token and the prefix's pieces.

    Not encode(prefix) less its end token: "query: " alone ends in a lone "▁"
    that real text merges into its first word ("▁hell"), so it is no piece of
    the prefix. What prefix + "a" and prefix + "b" share is."""
    a, b = (tokenizer.encode(prefix + x).ids for x in ("a", "b"))
    shared = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), len(a))
    return min(shared, len(a) - 1)  # never the end token


def _batches(lengths: list[int], max_batch: int) -> list[list[int]]:
    """Row indices grouped by similar token length.

    Cost grows with padded tokens, so rows of very different lengths are not
    batched together: a 10-token query padded to a 60-token context costs
    as much as the context again.
    """
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    batches: list[list[int]] = []
    for row in order:
        if batches and len(batches[-1]) < max_batch and lengths[row] <= 1.25 * lengths[batches[-1][0]] + 4:
            batches[-1].append(row)
        else:
            batches.append([row])
    return batches


def cut_context(row: list[int], head: int, limit: int) -> list[int]:
    """A context's ids within `limit`: its first `head` (the start token and the
    query prefix) and its newest `limit - head`, so the oldest turn is what goes."""
    return row if len(row) <= limit else row[:head] + row[len(row) - (limit - head) :]


def pad(rows: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Token id lists -> ([B, T] ids, [B, T] attention mask), right-padded with id 0."""
    width = max(len(r) for r in rows)
    ids = np.zeros((len(rows), width), dtype=np.int64)  # [B, T]
    mask = np.zeros((len(rows), width), dtype=np.int64)  # [B, T]
    for i, r in enumerate(rows):
        ids[i, : len(r)] = r
        mask[i, : len(r)] = 1
    return ids, mask


@dataclass(frozen=True)
class Tokenizers:
    """A bundle's tokenizers, one per side, set up as the model reads its inputs."""

    by_side: dict[Side, Tokenizer]
    context_head: int  # ids every context starts with and keeps: the start token and the query prefix
    # Whether "Hi" and "hi" are one input to the model (MiniLM's WordPiece
    # lower-cases, XLM-R's SentencePiece does not): what cache keys may fold.
    lowercases: bool
    turns: TurnTokenizer | None = None  # contexts assembled turn by turn, where that is exact

    @classmethod
    def load(cls, bundle_dir: Path, manifest: BundleManifest) -> Tokenizers:
        path = bundle_dir / TOKENIZER_FILE
        head = 0
        if manifest.query_prefix:
            # Cutting a long context from the left would cut its query prefix first: the
            # context side is tokenised whole and cut between the prefix and the oldest turn.
            context = _tokenizer(path, 1 << 30, truncate_from="left")
            head = prefix_length(context, manifest.query_prefix)
        else:
            # A context keeps its most recent turns, so it loses tokens on the left.
            context = _tokenizer(path, manifest.max_context_tokens, truncate_from="left")
        reply = _tokenizer(path, manifest.max_reply_tokens, truncate_from="right")
        lowercases = reply.normalizer is not None and reply.normalizer.normalize_str("Hi") == "hi"
        return cls({"context": context, "reply": reply}, head, lowercases, TurnTokenizer.for_bundle(context, manifest))


class Encoder:
    def __init__(
        self,
        bundle_dir: Path,
        manifest: BundleManifest,
        intra_op_threads: int = 0,
        spin: bool = False,
        tokenizers_of: Encoder | None = None,
    ) -> None:
        """tokenizers_of: an encoder of the same bundle whose tokenizers this one shares
        rather than loads (see `sibling`)."""
        self.bundle_dir, self.manifest = bundle_dir, manifest
        options = ort.SessionOptions()
        # 0 lets onnxruntime use every core; one session serves requests one
        # batch at a time, so inter-op parallelism would only add contention.
        options.intra_op_num_threads = intra_op_threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        # A context is ~100 small ops, and a pool thread that sleeps between them pays a
        # wake-up for each. With spin, the threads spin between the ops of one run and stop
        # the moment it returns (force_spinning_stop): idle threads left spinning between
        # requests took the cores the event loop and searches need under load.
        # `python -m bench.load [--spin]` measures both ways (docs/experiments.md).
        options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
        options.add_session_config_entry("session.force_spinning_stop", "1")
        self.session = ort.InferenceSession(
            str(bundle_dir / ENCODER_FILE),
            options,
            providers=["CPUExecutionProvider"],
            # onnxruntime 1.32's SkipLayerNormalization kernel is slower than the Add and
            # LayerNormalization it would replace, at one short context too (docs/experiments.md).
            disabled_optimizers=["SkipLayerNormFusion"],
        )
        self.has_poly = POLY_OUTPUT in {o.name for o in self.session.get_outputs()}
        if tokenizers_of is not None and tokenizers_of.manifest.checksum != manifest.checksum:
            raise ValueError(f"{tokenizers_of.manifest.name}'s tokenizers are not {manifest.name}'s")
        self.tokenizers: Tokenizers = (
            tokenizers_of.tokenizers if tokenizers_of else Tokenizers.load(bundle_dir, manifest)
        )
        # The per-turn way's combiner (core/context.py), where the bundle has one: shared with the
        # encoder whose tokenizers this one shares, as it is of the same bundle.
        self.combiner: Combiner | None = None
        if tokenizers_of is not None:
            self.combiner = tokenizers_of.combiner
        elif manifest.combiner is not None:
            self.combiner = Combiner.load(bundle_dir / COMBINER_FILE)
            self.combiner.check(manifest.dim)
            if self.combiner.turns != manifest.combiner.turns:
                raise ValueError(f"{bundle_dir}: the manifest's combiner reads {manifest.combiner.turns} turns")
        # A sibling whose threads spin within a run, for a batch of one request (`for_batch`),
        # and why it is there or not (the service measures both at load).
        self.alone: Encoder | None = None
        self.alone_choice: dict[str, Any] = {}

    @property
    def lowercases(self) -> bool:
        return self.tokenizers.lowercases

    def sibling(self, intra_op_threads: int = 0, spin: bool = False) -> Encoder:
        """A session of its own on this bundle, with this encoder's tokenizers: the same objects
        `_tokenizer` would hand it, and their turn memo too, with no file read at all (a reindex
        starts one while the event loop serves)."""
        return Encoder(self.bundle_dir, self.manifest, intra_op_threads, spin, tokenizers_of=self)

    def for_batch(self, requests: int) -> Encoder:
        """The session to run a batch of `requests` on: `alone`, spinning, for a lone request,
        which a hundred thread wake-ups would slow; this one, sleeping between ops, for a
        batch, so that under load the idle threads leave the cores to the event loop."""
        return self.alone if self.alone is not None and requests == 1 else self

    @property
    def dim(self) -> int:
        return self.manifest.dim

    def join_context(self, turns: Sequence[str]) -> str:
        """The last `max_context_turns` turns, oldest first, with the turn separator."""
        return self.manifest.turn_separator.join(turns[-self.manifest.max_context_turns :])

    def prefixed(self, texts: Sequence[str], side: Side) -> list[str]:
        """The texts as the model expects them: a query or passage prefix, if the bundle names one."""
        prefix = self.manifest.query_prefix if side == "context" else self.manifest.passage_prefix
        return [prefix + t for t in texts] if prefix else list(texts)

    def tokenize(self, texts: Sequence[str], side: Side) -> list[list[int]]:
        """Token ids per text, prefixed and truncated as the side requires."""
        if side == "context" and self.tokenizers.turns is not None:
            return [self.tokenizers.turns.ids(t) for t in texts]
        ids = [e.ids for e in self.tokenizers.by_side[side].encode_batch(self.prefixed(texts, side))]
        limit = self.manifest.max_context_tokens
        if side == "context" and self.manifest.query_prefix:
            ids = [cut_context(row, self.tokenizers.context_head, limit) for row in ids]
        return ids

    def run_ids(self, token_ids: Sequence[list[int]], outputs: list[str], max_batch: int = 64) -> list[np.ndarray]:
        """Each requested output as float32 with N rows in input order: [N, D] or [N, m, D]."""
        if not token_ids:
            return [np.empty((0, self.dim), dtype=np.float32) for _ in outputs]
        results: list[np.ndarray] = []
        for rows in _batches([len(t) for t in token_ids], max_batch):
            ids, mask = pad([token_ids[i] for i in rows])
            arrays = self.session.run(outputs, {"input_ids": ids, "attention_mask": mask})  # [B, ...] each
            if not results:
                results = [np.empty((len(token_ids), *a.shape[1:]), dtype=np.float32) for a in arrays]
            for result, batch in zip(results, arrays, strict=True):
                result[rows] = batch
        return results

    def _run(self, texts: Sequence[str], side: Side, outputs: list[str], max_batch: int) -> list[np.ndarray]:
        return self.run_ids(self.tokenize(texts, side), outputs, max_batch)

    def encode(self, texts: Sequence[str], side: Side, max_batch: int = 64) -> np.ndarray:
        """Returns [len(texts), dim] float32, unit rows."""
        return self._run(texts, side, [OUTPUT_NAMES[side]], max_batch)[0]

    def contexts(self, windows: Sequence[Sequence[str]], joined: bool = False, max_batch: int = 64) -> np.ndarray:
        """[N, D] context vectors of N windows (turns, oldest first), as the service makes them: combined
        from each turn's own vector where the bundle has a combiner (every distinct turn encoded once,
        on its side), else (or with `joined`) the window joined and encoded as one text."""
        if self.combiner is None or joined:
            return self.encode([self.join_context(w) for w in windows], side="context", max_batch=max_batch)
        combiner = self.combiner
        items: dict[tuple[str, Side], None] = {}
        for window in windows:
            recent = combiner.window(window)
            items.update(dict.fromkeys(zip(recent, combiner.sides(len(recent)), strict=True)))
        vector_of: dict[tuple[str, Side], np.ndarray] = {}
        for side in ("context", "reply"):
            these = [item for item in items if item[1] == side]
            if these:
                vectors = self.encode([t for t, _ in these], side, max_batch)  # [n, D]
                vector_of.update(zip(these, vectors, strict=True))
        turns = turn_vectors(windows, combiner.turns, vector_of, combiner)  # [N, T, D]
        return combiner.combine_many(turns, [combiner.window(w) for w in windows])

    def encode_with_poly(self, texts: Sequence[str], max_batch: int = 64) -> tuple[np.ndarray, np.ndarray]:
        """Contexts in one pass: ([N, D] context vectors, [N, m, D] poly vectors). Needs a poly head."""
        if not self.has_poly:
            raise ValueError(f"bundle {self.manifest.name} has no poly head")
        context, poly = self._run(texts, "context", [OUTPUT_NAMES["context"], POLY_OUTPUT], max_batch)
        return context, poly
