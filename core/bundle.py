"""The model bundle: its layout, its manifest and its integrity. The one module
that reads or writes a bundle's manifest, for serving, index builds and the
offline pipeline alike.

    <bundle>/
      manifest.json   what the files are, their sha256, and everything fitted beside them
      encoder.onnx    tokens -> unit context/reply vectors (+ m poly vectors with a poly head)
      tokenizer.json  the model's own tokenizer
      reactions.npz   the reaction classifier, when the bundle has one
      combiner.npz    the per-turn context combiner (core/context.py), when the bundle has one

`checksum` covers the payload files only. It is what index versions and
cache keys pin, so fitting thresholds or recording eval figures later (fields
outside the files) never invalidates an index built with the bundle.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from core.files import write_json_atomic

MANIFEST = "manifest.json"
ENCODER_FILE = "encoder.onnx"
TOKENIZER_FILE = "tokenizer.json"
REACTIONS_FILE = "reactions.npz"
COMBINER_FILE = "combiner.npz"
VALENCE_FILE = "valence.npz"
PAYLOAD_FILES = (ENCODER_FILE, TOKENIZER_FILE, REACTIONS_FILE, COMBINER_FILE, VALENCE_FILE)
# The newest format this code reads. 3: a bundle with a combiner, which a reader of format 2 would
# serve joined with the per-turn calibration; a bundle without one is written as PLAIN_FORMAT.
FORMAT_VERSION = 3
PLAIN_FORMAT = 2
# The release bundles tracked in git, found from the source tree so that any working directory
# serves them. Each is a directory of RELEASE_ROOT; a candidate set names one by that name.
RELEASE_ROOT = Path(__file__).resolve().parents[1] / "models" / "release"
# The default encoder (`make release` promotes into it): every set that names none.
RELEASE_BUNDLE = RELEASE_ROOT / "e5"
# The reaction reader (`make train-reaction-reader`): an encoder that reads the last turn for reactions
# alone, beside whatever encoder a set retrieves with. Not servable as a set's encoder.
RELEASE_REACTIONS = RELEASE_ROOT / "reactions"


class BundleError(ValueError):
    """A bundle that must not be served: missing files, or files that do not match the manifest."""


@dataclass
class Thresholds:
    # Cosine between the last utterance and a stored query at or above which
    # the stored query's reply is served. Calibration fits it on validation
    # data; this untrained default is low on purpose: zero-shot reply matching
    # tends to return paraphrases of the context ("what do you do for a
    # living?" -> "What kind of work do you do?"), while a stored query at
    # 0.7-0.8 ("what do you do for work?") still carries a real answer.
    query_similarity: float = 0.7
    # Confidence (0..1, `ConfidenceSpec`) at or above which reply matching
    # answers rather than a reaction. -1 accepts every answer: the default for
    # a bundle with no confidence model or no reactions to fall back to.
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
    """A classifier over the context vector (linear, or one hidden layer) and its gates; weights in REACTIONS_FILE."""

    labels: list[str]  # the text served for each class
    coverage: float  # share of train replies that fall in one of these classes
    language: str = "en"  # BCP 47; a conversation in another language gets no reaction from this set...
    # ... unless the set has the classes' text in that language: BCP 47 -> [C] texts, class for class.
    translations: dict[str, list[str]] = field(default_factory=dict)
    # [C] the side a class takes on an axis ("valence+" for "congrats!", "valence-" for "oh no"), or
    # "". Such a class is served only when the context leans its way by `stance_margin`: a
    # classifier unsure whether news is good or bad answers with a class that takes no side.
    stances: list[str] = field(default_factory=list)
    # axis -> [lines at its + pole, lines at its - pole]; the axis is the difference of their mean
    # context vectors, taken with the bundle's own encoder when it loads.
    axes: dict[str, list[list[str]]] = field(default_factory=dict)
    stance_margin: float = 0.0
    # axis -> the lean a class needs on it, in the axis's own units (a learned axis: log-odds);
    # an axis not named here needs `stance_margin`. A learned axis ships in REACTIONS_FILE.
    margins: dict[str, float] = field(default_factory=dict)
    # [C] the probability at or above which a class is sure enough to answer; [] every class is.
    floors: list[float] = field(default_factory=list)
    # axis pole ("valence-") -> a lean toward it (the axis's units) at or past which a turn is answered
    # only by the classes that take that side and the fallback: no "good luck!" to bad news.
    guards: dict[str, float] = field(default_factory=dict)
    # The class that answers when no class is sure (a reaction that fits almost anything, "oh I
    # see"); -1: none, every allowed class answers in order of probability.
    fallback: int = -1


@dataclass
class ConfidenceSpec:
    """Logistic regression over features of reply matching's hits: the
    probability that its top reply is acceptable (`models/confidence_fit.py`)."""

    features: list[str]  # names, computed by `core.confidence.features`
    mean: list[float]  # per feature: standardisation fitted on validation turns
    scale: list[float]
    weight: list[float]
    bias: float
    # Confidence at each percentile 0..100 of the validation turns: a reaction
    # share s becomes the threshold quantiles[round(100 s)].
    quantiles: list[float]
    auroc: float  # on the validation turns it was fitted on; test figures are in the eval report


@dataclass
class CombinerSpec:
    """The per-turn way (core/context.py): each turn encoded alone, the context vector combined
    from the newest `turns` turn vectors by the weights in COMBINER_FILE."""

    turns: int  # N, as COMBINER_FILE's gates have it (checked when it loads)
    other_side: str  # "reply" or "context": how turns at odd positions (the bot's) are read
    training: dict[str, Any] = field(default_factory=dict)  # recipe, data, figures on half A


@dataclass
class ValenceSpec:
    """A reaction model's valence (core/valence.py): logistic heads over a text's hashed n-grams and
    over the model's vector of it, weights in VALENCE_FILE; the margins are log-odds, chosen on dev texts."""

    bits: int = 20  # n-grams hashed into 2**bits buckets (VALENCE_FILE keeps only the weights it needs)
    orders: list[int] = field(default_factory=lambda: [1, 2, 3, 4, 5])  # character n-gram lengths
    words: bool = True  # words and word pairs too
    # The log-odds at or past which a turn takes a side, for a turn without Hangul and with it.
    sure: list[float] = field(default_factory=lambda: [2.2, 2.2])
    reply_sure: list[float] = field(default_factory=lambda: [2.2, 2.2])  # a stored reply, likewise
    # The mood guard acts before a turn is sure (a wrong cheer costs more than a cheerful reply passed
    # over): a turn whose lean, in units of `sure`, is at or below -hold_cheer[script] gets no clearly
    # cheerful reply; one at or above +hold_sympathy[script], no clearly sympathetic one.
    hold_cheer: list[float] = field(default_factory=lambda: [1.0, 1.0])
    hold_sympathy: list[float] = field(default_factory=lambda: [1.0, 1.0])
    training: dict[str, Any] = field(default_factory=dict)  # recipe, data, figures on dev and test


@dataclass
class JoinedWay:
    """A bundle with a combiner serves per-turn, with the top-level thresholds and confidence model
    fitted that way. Served joined instead (Settings.joined_context), it takes these: fitted on
    joined contexts, as the bundle without its combiner was."""

    thresholds: Thresholds = field(default_factory=Thresholds)
    confidence: ConfidenceSpec | None = None
    calibration: dict[str, Any] = field(default_factory=dict)


@dataclass
class BundleManifest:
    name: str
    model_id: str
    kind: str  # "zero-shot", "fine-tuned", "teacher", "student", "tiny": what produced the weights
    dim: int
    num_layers: int
    max_context_tokens: int
    max_reply_tokens: int
    max_context_turns: int
    turn_separator: str
    quantization: str  # "int8-dynamic..." or "none"
    files: dict[str, str]  # file name -> sha256
    checksum: str  # sha256 over `files`, what index versions and cache keys pin
    thresholds: Thresholds = field(default_factory=Thresholds)
    poly: PolySpec | None = None
    reactions: ReactionSpec | None = None
    confidence: ConfidenceSpec | None = None
    combiner: CombinerSpec | None = None  # the per-turn way, where the bundle has COMBINER_FILE
    joined: JoinedWay | None = None  # with a combiner: the joined way's calibration
    valence: ValenceSpec | None = None  # a reaction model's good-news reading, where it has VALENCE_FILE
    # How the thresholds were fitted: objective, data, figures at the optimum.
    calibration: dict[str, Any] = field(default_factory=dict)
    parity: dict[str, float] = field(default_factory=dict)
    eval: dict[str, Any] = field(default_factory=dict)  # released figures, e.g. {"r_at_1": 0.39}
    # False for bundles kept only for evaluation (fp32 copies, the teacher).
    servable: bool = True
    # Configuration, per-stage steps/seconds/loss, hardware, total time.
    training: dict[str, Any] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)  # corpus, split rule and the split's hash
    release: dict[str, Any] = field(default_factory=dict)  # gates and their figures, once released
    # Text the encoder puts before what it encodes (E5: "query: ", "passage: "):
    # the query prefix on contexts and stored queries, the passage prefix on
    # stored replies. Callers never add them.
    query_prefix: str = ""
    passage_prefix: str = ""
    language: str = "en"  # BCP 47, or "mul" for a multilingual encoder
    # For a "mul" bundle, the languages it was trained and gated for (BCP 47):
    # what /info promises. Others may work; nothing measured them.
    languages: list[str] = field(default_factory=list)
    created_at: str = ""
    format_version: int = PLAIN_FORMAT

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> BundleManifest:
        raw = dict(raw)
        known = set(Thresholds.__dataclass_fields__)
        raw["thresholds"] = Thresholds(**{k: v for k, v in raw.get("thresholds", {}).items() if k in known})
        specs: tuple[tuple[str, Any], ...] = (
            ("poly", PolySpec),
            ("reactions", ReactionSpec),
            ("confidence", ConfidenceSpec),
            ("combiner", CombinerSpec),
            ("valence", ValenceSpec),
        )
        for name, spec in specs:
            if raw.get(name) is not None:
                fields = set(spec.__dataclass_fields__)
                raw[name] = spec(**{k: v for k, v in raw[name].items() if k in fields})
        if raw.get("joined") is not None:
            joined = dict(raw["joined"])
            joined["thresholds"] = Thresholds(**{k: v for k, v in joined.get("thresholds", {}).items() if k in known})
            if joined.get("confidence") is not None:
                joined["confidence"] = ConfidenceSpec(**joined["confidence"])
            raw["joined"] = JoinedWay(**{k: v for k, v in joined.items() if k in JoinedWay.__dataclass_fields__})
        # A manifest written by a newer version may carry fields this one does not know.
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
    path = bundle_dir / MANIFEST
    if not path.is_file():
        raise BundleError(f"{bundle_dir}: no {MANIFEST}")
    return BundleManifest.from_dict(json.loads(path.read_text()))


def write_manifest(bundle_dir: Path, manifest: BundleManifest) -> None:
    """Atomic: a reader sees the old manifest or the new one, never half of one."""
    write_json_atomic(bundle_dir / MANIFEST, manifest.to_dict(), indent=2, sync_dir=True)


def seal(bundle_dir: Path, manifest: BundleManifest) -> BundleManifest:
    """The manifest with `files` and `checksum` computed from the payload files present."""
    files = {name: sha256_file(bundle_dir / name) for name in PAYLOAD_FILES if (bundle_dir / name).is_file()}
    return replace(manifest, files=files, checksum=combined_checksum(files))


def verify(bundle_dir: Path, manifest: BundleManifest) -> None:
    """Refuse a bundle whose files do not match its manifest: a torn copy, an
    edited file, or a manifest whose checksum does not cover its own files."""
    if manifest.format_version > FORMAT_VERSION:
        raise BundleError(f"{bundle_dir}: format {manifest.format_version}; this version reads up to {FORMAT_VERSION}")
    for name in (ENCODER_FILE, TOKENIZER_FILE):
        if name not in manifest.files:
            raise BundleError(f"{bundle_dir}: the manifest lists no {name}")
    for name, expected in manifest.files.items():
        path = bundle_dir / name
        if not path.is_file():
            raise BundleError(f"{path}: missing")
        actual = sha256_file(path)
        if actual != expected:
            raise BundleError(f"{path}: sha256 {actual[:12]} != manifest {expected[:12]}")
    if combined_checksum(manifest.files) != manifest.checksum:
        raise BundleError(f"{bundle_dir}: checksum does not match the listed files")


def open_bundle(bundle_dir: Path) -> BundleManifest:
    """The manifest of a bundle whose files check out; raises BundleError otherwise."""
    manifest = read_manifest(bundle_dir)
    verify(bundle_dir, manifest)
    return manifest


# Fields fitted or measured after export. Changing them leaves the files, and
# so the checksum and every index built with the bundle, valid.
MUTABLE_FIELDS = frozenset({"thresholds", "confidence", "calibration", "eval", "release", "servable", "joined"})


def update_manifest(bundle_dir: Path, **changes: Any) -> BundleManifest:
    """Rewrites fields outside the payload; refuses any that would change what the checksum covers."""
    frozen = set(changes) - MUTABLE_FIELDS
    if frozen:
        raise ValueError(f"cannot change {sorted(frozen)} after export; export a new bundle")
    manifest = replace(read_manifest(bundle_dir), **changes)
    write_manifest(bundle_dir, manifest)
    return manifest


def list_bundles(bundles_root: Path) -> list[tuple[Path, BundleManifest]]:
    found = []
    if bundles_root.is_dir():
        for child in sorted(bundles_root.iterdir()):
            if (child / MANIFEST).is_file():
                found.append((child, read_manifest(child)))
    return found


def shipped_bundles(root: Path) -> dict[str, Path]:
    """name -> directory of every servable bundle directly under `root` (a release folder of trained
    layers alone has no encoder graph, and is not one). Reads manifests only: nothing is verified
    or loaded until a set uses the bundle."""
    children = sorted(root.iterdir()) if root.is_dir() else []
    bundles = [c for c in children if (c / ENCODER_FILE).is_file() and (c / MANIFEST).is_file()]
    return {c.name: c for c in bundles if read_manifest(c).servable}
