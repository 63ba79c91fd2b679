"""A tiny random encoder bundle built without torch: the service's tests need one,
and the service's venv has no torch.

The graph is the smallest that keeps the contract `core.encoder` serves:

    input_ids, attention_mask [B, T] int64
      -> Gather (embeddings) -> MatMul + Add -> Tanh          hidden [B, T, H]
      -> masked mean pool -> L2 normalise                   context_embedding, reply_embedding [B, H]
      -> (with a poly head) m codes attend over the unpadded
         tokens -> MatMul + Add                              poly_vectors [B, m, H]

as `models.encoder.DualEncoder` exports it, with the poly head the service reads (both sides
the same vector, as a zero-shot bundle's are). A numpy twin of the graph
checks each build, as `models.export` checks an export against torch, and the
result goes in the manifest's `parity`. The tokenizer is a lower-casing
WordPiece with BERT's specials whose pieces are single characters (`tiny_tokenizer`).
The bundle is written with `core.bundle` (manifest, checksums), so the service
loads it as it loads any other.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers
from tokenizers.models import WordPiece
from tokenizers.processors import TemplateProcessing

from core.bundle import (
    COMBINER_FILE,
    ENCODER_FILE,
    FORMAT_VERSION,
    REACTIONS_FILE,
    TOKENIZER_FILE,
    BundleManifest,
    CombinerSpec,
    PolySpec,
    ReactionSpec,
    seal,
    write_manifest,
)
from core.context import Combiner
from core.encoder import OUTPUT_NAMES, POLY_OUTPUT, Encoder
from core.files import staged_dir

ONNX_OPSET = 17
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]  # [PAD] is id 0: what the encoder pads with
# Every character English and Korean text normalises to: printable ASCII, the conjoining jamo
# that Hangul syllables decompose into (the normaliser strips accents, so NFD), compatibility jamo.
ALPHABET = [chr(c) for span in ((33, 127), (0x1100, 0x1200), (0x3131, 0x318F)) for c in range(*span)]


def tiny_tokenizer() -> Tokenizer:
    """A WordPiece that lower-cases and splits as MiniLM's does, with BERT's specials, whose
    pieces are the characters of ALPHABET, alone and as "##" continuations: no English or
    Korean text reads as unknowns.

    Characters, not words: texts in one script then share many pieces, as Korean in jamo
    always does, so a random encoder puts a text nearer texts of its own script than of
    another, as a trained one does. With whole words, an English question would be nearest
    whichever Korean texts share its "?"."""
    pieces = SPECIALS + ALPHABET + ["##" + c for c in ALPHABET]
    tokenizer = Tokenizer(WordPiece({p: i for i, p in enumerate(pieces)}, unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.post_processor = TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", SPECIALS.index("[CLS]")), ("[SEP]", SPECIALS.index("[SEP]"))],
    )
    tokenizer.decoder = decoders.WordPiece()
    tokenizer.add_special_tokens(SPECIALS)  # " [SEP] " between turns is the separator token, not 5 pieces
    return tokenizer


@dataclass
class TinyWeights:
    embeddings: np.ndarray  # [V, H]
    dense: np.ndarray  # [H, H]
    dense_bias: np.ndarray  # [H]
    codes: np.ndarray | None = None  # [m, H] poly codes
    project: np.ndarray | None = None  # [H, H] poly projection
    project_bias: np.ndarray | None = None  # [H]

    @classmethod
    def random(cls, vocab: int, dim: int, seed: int, codes: int | None = None) -> TinyWeights:
        rng = np.random.default_rng(seed)
        weights = cls(
            embeddings=rng.normal(size=(vocab, dim)).astype(np.float32),
            dense=(rng.normal(size=(dim, dim)) / np.sqrt(dim)).astype(np.float32),
            # No bias: tanh of zero-mean inputs averages out, so unrelated texts are near orthogonal.
            # A shared offset would make every long text (Korean runs to ~3 pieces a syllable)
            # everyone's nearest neighbour: the mean of many pieces is the offset.
            dense_bias=np.zeros(dim, dtype=np.float32),
        )
        # [CLS] and [SEP] start and end every text: as vectors of their own they would make
        # texts alike by length alone. At zero (tanh(0) = 0) they only count in the mean.
        weights.embeddings[[SPECIALS.index(s) for s in ("[PAD]", "[CLS]", "[SEP]")]] = 0.0
        if codes is not None:
            # Peaked attention, so the m vectors differ and the poly score moves the order visibly.
            weights.codes = rng.normal(scale=4.0, size=(codes, dim)).astype(np.float32)
            weights.project = np.eye(dim, dtype=np.float32)  # as PolyHead starts: identity
            weights.project_bias = np.zeros(dim, dtype=np.float32)
        return weights

    @property
    def dim(self) -> int:
        return int(self.dense.shape[0])

    def forward(self, ids: np.ndarray, mask: np.ndarray) -> list[np.ndarray]:
        """The graph in numpy: [B, T] ids and mask -> [B, H] unit vectors (+ [B, m, H] poly vectors)."""
        hidden = np.tanh(self.embeddings[ids] @ self.dense + self.dense_bias)  # [B, T, H]
        m = mask.astype(np.float32)[:, :, None]  # [B, T, 1]
        pooled = (hidden * m).sum(axis=1) / np.maximum(m.sum(axis=1), 1e-9)  # [B, H]
        unit = pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
        if self.codes is None:
            return [unit]
        assert self.project is not None and self.project_bias is not None
        logits = np.einsum("mh,bth->bmt", self.codes, hidden) / np.sqrt(self.dim)  # [B, m, T]
        logits = logits + (mask[:, None, :] - 1.0) * 1e4
        attention = np.exp(logits - logits.max(axis=-1, keepdims=True))
        attention /= attention.sum(axis=-1, keepdims=True)
        return [unit, np.einsum("bmt,bth->bmh", attention, hidden) @ self.project + self.project_bias]


def _const(name: str, value: np.ndarray | float | list[int]) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value, dtype=np.int64 if isinstance(value, list) else np.float32), name)


def tiny_graph(weights: TinyWeights) -> onnx.ModelProto:
    """`weights.forward` as an ONNX graph with the inputs and outputs `core.encoder` reads."""
    inits = [
        numpy_helper.from_array(weights.embeddings, "embeddings"),
        numpy_helper.from_array(weights.dense, "dense.weight"),
        numpy_helper.from_array(weights.dense_bias, "dense.bias"),
        _const("axis1", [1]),
        _const("axis2", [2]),
        _const("one", 1.0),
        _const("tiny_count", 1e-9),
        _const("tiny_norm", 1e-12),
    ]
    node = helper.make_node
    nodes = [
        node("Gather", ["embeddings", "input_ids"], ["tokens"], name="embed"),  # [B, T, H]
        node("MatMul", ["tokens", "dense.weight"], ["dense_out"], name="dense/MatMul"),
        node("Add", ["dense_out", "dense.bias"], ["dense_biased"]),
        node("Tanh", ["dense_biased"], ["hidden"]),
        node("Cast", ["attention_mask"], ["mask"], to=TensorProto.FLOAT),  # [B, T]
        node("Unsqueeze", ["mask", "axis2"], ["mask3"]),  # [B, T, 1]
        node("Mul", ["hidden", "mask3"], ["masked"]),
        node("ReduceSum", ["masked", "axis1"], ["summed"], keepdims=0),  # [B, H]
        node("ReduceSum", ["mask3", "axis1"], ["count"], keepdims=0),  # [B, 1]
        node("Max", ["count", "tiny_count"], ["count_safe"]),
        node("Div", ["summed", "count_safe"], ["pooled"]),
        node("ReduceL2", ["pooled"], ["norm"], axes=[-1], keepdims=1),  # [B, 1]
        node("Max", ["norm", "tiny_norm"], ["norm_safe"]),
        node("Div", ["pooled", "norm_safe"], [OUTPUT_NAMES["context"]]),
        node("Identity", [OUTPUT_NAMES["context"]], [OUTPUT_NAMES["reply"]]),
    ]
    outputs = [
        helper.make_tensor_value_info(OUTPUT_NAMES[side], TensorProto.FLOAT, ["batch", weights.dim])
        for side in ("context", "reply")
    ]
    if weights.codes is not None:
        assert weights.project is not None and weights.project_bias is not None
        inits += [
            numpy_helper.from_array(np.ascontiguousarray(weights.codes.T), "poly.codes_t"),  # [H, m]
            numpy_helper.from_array(weights.project, "poly.project.weight"),
            numpy_helper.from_array(weights.project_bias, "poly.project.bias"),
            _const("poly.scale", 1.0 / np.sqrt(weights.dim)),
            _const("poly.masked", 1e4),
        ]
        nodes += [
            node("MatMul", ["hidden", "poly.codes_t"], ["code_logits"], name="poly/codes/MatMul"),  # [B, T, m]
            node("Transpose", ["code_logits"], ["code_logits_t"], perm=[0, 2, 1]),  # [B, m, T]
            node("Mul", ["code_logits_t", "poly.scale"], ["scaled"]),
            node("Unsqueeze", ["mask", "axis1"], ["mask_row"]),  # [B, 1, T]
            node("Sub", ["mask_row", "one"], ["padding"]),  # 0 on tokens, -1 on padding
            node("Mul", ["padding", "poly.masked"], ["padding_logits"]),
            node("Add", ["scaled", "padding_logits"], ["logits"]),
            node("Softmax", ["logits"], ["attention"], axis=-1),
            node("MatMul", ["attention", "hidden"], ["attended"], name="poly/attend/MatMul"),  # [B, m, H]
            node("MatMul", ["attended", "poly.project.weight"], ["projected"], name="poly/project/MatMul"),
            node("Add", ["projected", "poly.project.bias"], [POLY_OUTPUT]),
        ]
        outputs.append(helper.make_tensor_value_info(POLY_OUTPUT, TensorProto.FLOAT, ["batch", "codes", weights.dim]))
    inputs = [
        helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "sequence"])
        for n in ("input_ids", "attention_mask")
    ]
    graph = helper.make_graph(nodes, "tiny-encoder", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", ONNX_OPSET)], producer_name="tests")
    onnx.checker.check_model(model, full_check=True)
    return model


def _quantize(fp32: Path, int8: Path) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    # As models.export quantises a real encoder: dynamic int8, per-channel, 7-bit weights.
    quantize_dynamic(str(fp32), str(int8), weight_type=QuantType.QInt8, per_channel=True, reduce_range=True)


def _parity(weights: TinyWeights, encoder: Encoder, texts: list[str]) -> dict[str, float]:
    """Cosine between the served path (tokenizers + onnxruntime) and the numpy twin, as export records it."""
    served = encoder.encode_with_poly(texts) if encoder.has_poly else (encoder.encode(texts, "context"),)
    rows = [weights.forward(np.array([ids]), np.ones((1, len(ids)))) for ids in encoder.tokenize(texts, "context")]
    reference = [np.concatenate(outputs) for outputs in zip(*rows, strict=True)]  # unpadded, one text at a time
    cosines = (served[0] * reference[0]).sum(axis=1)  # [N]; both sides are unit vectors
    result = {"mean_cosine": round(float(cosines.mean()), 5), "min_cosine": round(float(cosines.min()), 5)}
    if len(served) > 1:
        a, b = served[1].reshape(len(texts), -1), reference[1].reshape(len(texts), -1)  # [N, m*H]
        poly = (a * b).sum(axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
        result["poly_mean_cosine"] = round(float(poly.mean()), 5)
    result["samples"] = len(texts)
    return result


@dataclass
class TinyReactions:
    spec: ReactionSpec
    weight: np.ndarray  # [C, H]
    bias: np.ndarray  # [C]


def tiny_combiner(dim: int, turns: int = 3, seed: int = 0) -> Combiner:
    """A per-turn combiner for a tiny bundle: the newest turn weighs most, the bot's turns are read
    on the reply side, and a small random head, so that its output is no plain sum."""
    rng = np.random.default_rng(seed)
    return Combiner(
        gate_bias=np.array([1.0] + [0.0] * (turns - 1), dtype=np.float32),
        gate_newest=np.zeros(turns, dtype=np.float32),
        gate_own=np.full(turns, 0.1, dtype=np.float32),
        head=(0.05 * rng.normal(size=(dim, dim))).astype(np.float32),
        head_bias=np.zeros(dim, dtype=np.float32),
        reply_side=np.array([p % 2 == 1 for p in range(turns)]),
    )


def build_tiny_bundle(
    bundles_root: Path,
    name: str,
    parity_texts: Sequence[str],
    seed: int = 0,
    dim: int = 32,
    quantize: bool = True,
    poly: PolySpec | None = None,
    reactions: TinyReactions | None = None,
    min_parity_cosine: float = 0.95,
    prefixes: tuple[str, str] = ("", ""),
    kind: str = "tiny",
    combiner: Combiner | None = None,
) -> Path:
    """bundles_root/name: a random encoder, checked against its numpy twin on `parity_texts`.
    Assembled aside and renamed into place. prefixes: (query, passage), as e5 reads its sides.
    combiner: the per-turn way's, for a bundle that serves per turn (`tiny_combiner`)."""
    tokenizer = tiny_tokenizer()
    weights = TinyWeights.random(tokenizer.get_vocab_size(), dim, seed, codes=poly.codes if poly else None)
    final = bundles_root / name
    with staged_dir(final) as staging:
        tokenizer.save(str(staging / TOKENIZER_FILE))
        fp32 = staging / "encoder.fp32.onnx"
        onnx.save(tiny_graph(weights), str(fp32))
        if quantize:
            _quantize(fp32, staging / ENCODER_FILE)
            fp32.unlink()
        else:
            fp32.rename(staging / ENCODER_FILE)
        if reactions is not None:
            with (staging / REACTIONS_FILE).open("wb") as f:  # the format app.engine.reactions reads
                np.savez(f, weight=reactions.weight.astype(np.float32), bias=reactions.bias.astype(np.float32))
        if combiner is not None:
            combiner.save(staging / COMBINER_FILE)
        draft = BundleManifest(
            name=name,
            model_id="tiny-random-wordpiece" + (" + poly" if poly else ""),
            kind=kind,
            servable=kind != "reactions",  # a reaction model reads turns; no set retrieves with it
            dim=dim,
            num_layers=1,
            # A character a piece: about the text MiniLM's 64 and 96 word pieces (models.export) hold.
            max_context_tokens=256,
            max_reply_tokens=384,
            max_context_turns=3,
            turn_separator=" [SEP] ",
            query_prefix=prefixes[0],
            passage_prefix=prefixes[1],
            quantization="int8-dynamic-per-channel" if quantize else "none",
            files={},
            checksum="",
            poly=poly,
            reactions=reactions.spec if reactions else None,
            combiner=CombinerSpec(combiner.turns, "reply" if combiner.reply_side.any() else "context")
            if combiner
            else None,
            created_at=datetime.now(UTC).isoformat(timespec="seconds"),
        )
        if combiner is not None:
            draft.format_version = FORMAT_VERSION
        manifest = seal(staging, draft)
        manifest.parity = _parity(weights, Encoder(staging, manifest), list(parity_texts))
        if manifest.parity["mean_cosine"] < min_parity_cosine:
            raise AssertionError(f"{name}: the graph does not compute its numpy twin: {manifest.parity}")
        write_manifest(staging, manifest)
    return final
