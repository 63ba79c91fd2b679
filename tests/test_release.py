"""The release bundle tracked in git: what a fresh clone serves."""

from __future__ import annotations

import json
from pathlib import Path

from core.bundle import (
    ENCODER_FILE,
    MANIFEST,
    RELEASE_BUNDLE,
    RELEASE_REACTIONS,
    RELEASE_ROOT,
    open_bundle,
    shipped_bundles,
)
from index.corpus import split_summary
from models.release import GATES, MAX_RELEASE_BYTES

ROOT = Path(__file__).resolve().parents[1]
# Every folder tracked under models/release/ and why (docs/training.md, weights in git): a bundle the
# service serves, or tuned layers a recipe reads to rebuild what is served, with the file that reads them
# and the words it reads them by. A new folder fails until it is named here with its reader; a bundle that
# tracked layers rebuild and no set needs (the teacher, the 6-layer student: `make bench-encoders`) lives
# in artifacts/.
SERVED = {
    "e5": "the default encoder (core/bundle.py's RELEASE_BUNDLE)",
    "minilm": "MiniLM with Korean rows, an encoder a set may name",
    "reactions": "the reaction model every set's fallback reads the last turn with (RELEASE_REACTIONS)",
}
READ_BY = {
    # the default's layers: models.e5.multilingual's RELEASE_LAYERS, laid under models/release/e5
    "multilingual-layers": ("models/trained_layers.py", '/ "release" / "multilingual-layers"'),
    # the teacher at alpha 1, a bake-off candidate (the default's layers are it at alpha 0.7)
    "e5-teacher-layers": ("Makefile", "--layers models/release/e5-teacher-layers"),
    # the 6-layer student's layers: what `make bench-encoders` builds its bundle from, into artifacts/
    "e5-l6-layers": ("Makefile", "--student models/release/e5-l6-layers"),
}
MAX_RELEASE_TREE_BYTES = 200_000_000  # all of models/release/, decimal: what every clone checks out


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


def test_every_folder_in_the_release_is_served_or_read_by_a_recipe() -> None:
    found = {p.name for p in RELEASE_ROOT.iterdir()}
    assert found == set(SERVED) | set(READ_BY), "name what serves or reads each folder, or take it out of the tree"
    named = shipped_bundles(RELEASE_ROOT)  # what a set may name
    for name in SERVED:
        folder = RELEASE_ROOT / name
        assert (folder / ENCODER_FILE).is_file() and (folder / MANIFEST).is_file(), name
        assert name in named or folder in (RELEASE_BUNDLE, RELEASE_REACTIONS), f"nothing serves {name}"
    for name, (reader, words) in READ_BY.items():
        assert (RELEASE_ROOT / name / MANIFEST).is_file() and not (RELEASE_ROOT / name / ENCODER_FILE).exists()
        assert words in (ROOT / reader).read_text(encoding="utf-8"), f"{reader} no longer reads {name}"


def test_the_release_fits_its_budget_in_git() -> None:
    sizes = {p.name: sum(f.stat().st_size for f in p.rglob("*") if f.is_file()) for p in RELEASE_ROOT.iterdir()}
    total = sum(sizes.values())
    assert total <= MAX_RELEASE_TREE_BYTES, f"models/release holds {total:,} bytes: {sizes}"
    assert not {name: size for name, size in sizes.items() if size > MAX_RELEASE_BYTES}  # 40 MiB a bundle
