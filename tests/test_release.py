"""The release bundle tracked in git: what a fresh clone serves."""

from __future__ import annotations

import json

from core.bundle import MANIFEST, RELEASE_BUNDLE, RELEASE_ROOT, open_bundle
from index.corpus import split_summary
from models.release import GATES, MAX_RELEASE_BYTES


def test_the_shipped_bundle_agrees_with_its_manifest() -> None:
    manifest = open_bundle(RELEASE_BUNDLE)  # every file's sha256, and the checksum over them
    on_disk = {p.name for p in RELEASE_BUNDLE.iterdir()}
    assert on_disk == {*manifest.files, MANIFEST}  # nothing unlisted rides along
    assert sum((RELEASE_BUNDLE / name).stat().st_size for name in on_disk) <= MAX_RELEASE_BYTES


def test_the_shipped_bundle_is_the_trained_student_with_everything_it_serves() -> None:
    manifest = open_bundle(RELEASE_BUNDLE)
    assert manifest.servable and manifest.kind == "fine-tuned" and "int8" in manifest.quantization
    assert manifest.reactions is not None and manifest.confidence is not None
    assert manifest.calibration["reaction_share"] == 0.1
    assert {"r_at_1", "confidence_auroc", "served_echo_share"} <= set(manifest.eval)
    assert manifest.poly is None or "rerank_r_at_1" in manifest.eval  # a poly head ships with what it measured
    assert manifest.language == "mul" and set(manifest.languages) == {"en", "ko"}  # what /info names


def test_the_shipped_bundle_says_how_it_was_made_and_released() -> None:
    manifest = open_bundle(RELEASE_BUNDLE)
    layers = manifest.training["layers"]  # the tuned layers laid over the package's weights, and their run
    tracked = json.loads((RELEASE_ROOT / "multilingual-layers" / "manifest.json").read_text())
    assert layers["sha256"] == tracked["sha256"]  # the tracked layers, as tracked
    assert layers["source"]["config"]["seed"] == 0 and layers["source"]["train"]["seconds"] > 0
    # Never the out-of-domain dev set: the teacher's pack has no chatterbot-corpus source.
    assert not layers["source"]["config"].get("chatterbot", False)
    assert "chatterbot" not in json.dumps(layers["source"].get("data", {}).get("sources", {}))
    assert manifest.data["split_sha256"] == split_summary()["split_sha256"]  # the split it was evaluated on
    gates = {g["gate"]: g for g in manifest.release["gates"]}
    assert set(gates) == {g.name for g in GATES}
    assert all(g["passed"] or g.get("waived") for g in gates.values())  # a miss is released only by name, with why
