"""ONNX export of a tiny model: parity with torch, dynamic axes, atomic bundles."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from core.bundle import TOKENIZER_FILE, read_manifest, verify
from core.encoder import Encoder
from models.encoder import DualEncoder, minilm_path, tiny_body
from models.export import ExportConfig, ParityError, export_bundle
from tests.helpers import TINY_PARITY_TEXTS

pytestmark = [pytest.mark.training, pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")]


def test_int8_bundle_matches_torch_and_records_its_parity(torch_artifacts: Path) -> None:
    bundle_dir = torch_artifacts / "bundles" / "tiny-int8"
    manifest = read_manifest(bundle_dir)
    verify(bundle_dir, manifest)
    assert manifest.quantization.startswith("int8")
    assert manifest.parity["mean_cosine"] >= 0.95
    assert manifest.parity["samples"] == len(TINY_PARITY_TEXTS)


def test_fp32_export_is_exact_for_any_batch_and_length(tmp_path: Path) -> None:
    model = DualEncoder(tiny_body(vocab_size=30522, seed=3))
    config = ExportConfig(
        name="tiny-fp32", model_id="t", kind="tiny", tokenizer_path=minilm_path() / TOKENIZER_FILE, quantize=False
    )
    bundle_dir = export_bundle(model, config, tmp_path, TINY_PARITY_TEXTS)
    manifest = read_manifest(bundle_dir)
    assert manifest.parity["min_cosine"] > 0.9999

    encoder = Encoder(bundle_dir, manifest)
    texts = ["hi", "a much longer sentence than the dummy input used at export time, to be sure", "ok"]
    batched = encoder.encode(texts, side="context")  # [3, D], padded to the longest
    one_by_one = np.stack([encoder.encode([t], side="context")[0] for t in texts])
    np.testing.assert_allclose(batched, one_by_one, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(batched, axis=1), 1.0, atol=1e-5)

    with torch.no_grad():  # and the same as torch on an unpadded input
        ids = torch.tensor([encoder.tokenizers.by_side["context"].encode(texts[1]).ids])
        reference = model(ids, torch.ones_like(ids))[0]
    np.testing.assert_allclose(batched[1], reference[0].numpy(), atol=1e-5)


def test_failed_parity_leaves_no_bundle(tmp_path: Path) -> None:
    config = ExportConfig(
        name="never",
        model_id="t",
        kind="tiny",
        tokenizer_path=minilm_path() / TOKENIZER_FILE,
        min_parity_cosine=1.01,  # unreachable: every attempt must fail
    )
    with pytest.raises(ParityError):
        export_bundle(DualEncoder(tiny_body(vocab_size=30522)), config, tmp_path, TINY_PARITY_TEXTS)
    assert list(tmp_path.iterdir()) == []


FUSED_FP32 = ExportConfig(
    name="tiny-fused-fp32",
    model_id="t",
    kind="tiny",
    tokenizer_path=minilm_path() / TOKENIZER_FILE,
    quantize=False,
    fuse=True,
)


def test_a_fused_fp32_export_is_fused_exact_and_keeps_the_ffn_names_the_int8_pass_excludes(tmp_path: Path) -> None:
    import onnx

    from models.export import ffn_down_projections

    body = tiny_body(vocab_size=30522, seed=5)
    bundle_dir = export_bundle(DualEncoder(body), FUSED_FP32, tmp_path, TINY_PARITY_TEXTS)
    manifest = read_manifest(bundle_dir)
    assert manifest.quantization == "fused, none"
    assert manifest.parity["min_cosine"] > 0.9999
    graph = onnx.load(str(bundle_dir / "encoder.onnx")).graph
    layers = body.config.num_hidden_layers
    assert sum(n.op_type == "Attention" for n in graph.node) == layers
    # The fused int8 attempt keeps these in fp32 only if it finds one a layer.
    assert len(ffn_down_projections(bundle_dir / "encoder.onnx")) == layers
    assert sorted(p.name for p in bundle_dir.iterdir()) == ["encoder.onnx", "manifest.json", "tokenizer.json"]


def test_down_projections_stored_fp16_run_as_their_fp32_weights_do(tmp_path: Path) -> None:
    import onnx

    from models.export import ffn_down_projections, layer_of, quantize_int8, store_fp16

    fused = export_bundle(
        DualEncoder(tiny_body(vocab_size=30522, seed=5)), FUSED_FP32, tmp_path / "b", TINY_PARITY_TEXTS
    )
    kept = [n for n in ffn_down_projections(fused / "encoder.onnx") if layer_of(n) == 0]
    assert len(kept) == 1
    vectors = {}
    for name, half in (("fp32", False), ("fp16", True)):
        out = tmp_path / name
        out.mkdir()
        quantize_int8(fused / "encoder.onnx", out / "encoder.onnx", kept)
        if half:
            assert store_fp16(out / "encoder.onnx") == 1
        graph = onnx.load(str(out / "encoder.onnx")).graph
        halves = [i for i in graph.initializer if i.data_type == onnx.TensorProto.FLOAT16]
        assert len(halves) == (1 if half else 0)
        for f in ("tokenizer.json", "manifest.json"):
            (out / f).write_bytes((fused / f).read_bytes())
        vectors[name] = Encoder(out, read_manifest(fused)).encode(TINY_PARITY_TEXTS, side="context")  # [N, D]
    cosines = (vectors["fp32"] * vectors["fp16"]).sum(axis=1)  # [N]
    assert cosines.min() > 0.999
