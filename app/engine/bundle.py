"""Model bundle: a directory with encoder.onnx, tokenizer.json and manifest.json.

The manifest is the contract between the offline pipeline (`models/`) and the
service; both sides read and write it through this module.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

MANIFEST = "manifest.json"
ENCODER_FILE = "encoder.onnx"
TOKENIZER_FILE = "tokenizer.json"
REACTIONS_FILE = "reactions.npz"
FORMAT_VERSION = 1


@dataclass
class Thresholds:
    # Cosine between the last utterance and a stored query above which the
    # stored query's reply is served. The training pipeline fits it on
    # validation data; this zero-shot default is low on purpose: zero-shot
    # reply matching tends to return paraphrases of the context ("what do you
    # do for a living?" -> "What kind of work do you do?"), while a stored
    # query at 0.7-0.8 ("what do you do for work?") still carries a real answer.
    query_similarity: float = 0.7
    # Reply-matching score (after rerank, when there is one) above which its
    # top reply is served rather than a reaction. -1 accepts every answer:
    # the default for a bundle with no reaction classifier to fall back to.
    reply_matching: float = -1.0


@dataclass
class PolySpec:
    """A poly-encoder head: the context graph also outputs `codes` vectors."""

    codes: int  # m
    # Reranked score = (1 - weight) * bi-encoder cosine + weight * poly cosine:
    # both are cosines, so thresholds stay on one scale with or without rerank.
    weight: float


@dataclass
class ReactionSpec:
    """A linear classifier over the context vector; weights in REACTIONS_FILE."""

    labels: list[str]  # the text served for each class
    coverage: float  # share of train replies that fall in one of these classes


@dataclass
class BundleManifest:
    name: str
    model_id: str
    kind: str  # "zero-shot", "teacher", "student", "tiny": what produced the weights
    dim: int
    num_layers: int
    max_context_tokens: int
    max_reply_tokens: int
    max_context_turns: int
    turn_separator: str
    quantization: str  # "int8-dynamic" or "none"
    files: dict[str, str]  # file name -> sha256
    checksum: str  # sha256 over `files`, what index versions and cache keys pin
    thresholds: Thresholds = field(default_factory=Thresholds)
    poly: PolySpec | None = None
    reactions: ReactionSpec | None = None
    # How the thresholds were fitted: objective, data, figures at the optimum.
    calibration: dict[str, object] = field(default_factory=dict)
    parity: dict[str, float] = field(default_factory=dict)
    eval: dict[str, float] = field(default_factory=dict)  # released figures, e.g. {"r_at_1": 0.39}
    # False for bundles kept only for evaluation (fp32 copies, the teacher):
    # the service never picks them on its own.
    servable: bool = True
    training: dict[str, object] = field(default_factory=dict)  # profile and per-stage steps/seconds/loss
    created_at: str = ""
    format_version: int = FORMAT_VERSION

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> BundleManifest:
        raw = dict(raw)
        raw["thresholds"] = Thresholds(**raw.get("thresholds", {}))
        if raw.get("poly") is not None:
            raw["poly"] = PolySpec(**raw["poly"])
        if raw.get("reactions") is not None:
            raw["reactions"] = ReactionSpec(**raw["reactions"])
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in raw.items() if k in known})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def combined_checksum(files: dict[str, str]) -> str:
    joined = "\n".join(f"{name}:{digest}" for name, digest in sorted(files.items()))
    return hashlib.sha256(joined.encode()).hexdigest()


def read_manifest(bundle_dir: Path) -> BundleManifest:
    return BundleManifest.from_dict(json.loads((bundle_dir / MANIFEST).read_text()))


def verify_files(bundle_dir: Path, manifest: BundleManifest) -> None:
    """Refuse a bundle whose files do not match its manifest (a torn copy)."""
    for name, expected in manifest.files.items():
        actual = sha256_file(bundle_dir / name)
        if actual != expected:
            raise ValueError(f"{bundle_dir / name}: sha256 {actual[:12]} != manifest {expected[:12]}")


def list_bundles(bundles_root: Path) -> list[tuple[Path, BundleManifest]]:
    found = []
    if bundles_root.is_dir():
        for child in sorted(bundles_root.iterdir()):
            if (child / MANIFEST).is_file():
                found.append((child, read_manifest(child)))
    return found


def ranked_bundles(bundles_root: Path) -> list[Path]:
    """Servable bundles, best released R@1 first; bundles without a figure
    rank last, so an evaluated trained bundle beats the zero-shot export."""
    servable = [(path, m) for path, m in list_bundles(bundles_root) if m.servable]
    servable.sort(key=lambda item: (item[1].eval.get("r_at_1", -1.0), item[1].created_at), reverse=True)
    return [path for path, _ in servable]


def best_bundle(bundles_root: Path) -> Path | None:
    ranked = ranked_bundles(bundles_root)
    return ranked[0] if ranked else None
