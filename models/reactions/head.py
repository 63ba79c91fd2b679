"""The reaction model of a bundle: trained on labelled emotions, gated, and written into the bundle.

    python -m models.reactions.head --bundle models/release/e5     # or: make train-reactions BUNDLE=...

One command for any bundle directory (docs/reactions.md): it encodes the
emotion sets' train splits and our written trigger lines with the bundle's
own encoder (cached under artifacts/reactions/, by the encoder's checksum),
fits a small head over those vectors, chooses its gates, and writes
reactions.npz and the manifest's `reactions` (the bundle's checksum changes
with it; its encoder does not, so retrieval is untouched).

- **Classes** (models/reactions/classes.py): each labelled text teaches the
  class its kind trains (sadness -> "oh no, I'm sorry"); every class weighs
  alike, and within one each language, and within that, each source.
- **Valence**: a logistic direction, good news against bad, learned from every
  text whose labels agree on a side (NSMC's polarity too). A class that takes
  a side answers only where the turn leans its way by the margin.
- **Gates**, chosen on fixed half A of bench/data/reactions_labelled.jsonl and
  on the emotion sets' dev splits, never on a test split: the valence margin,
  the floor a class's probability must reach, the mirrors' higher floor, the
  phase margin. The rule: no wrong reaction on half A and, where the service
  takes a side on a dev text clearly good or bad, at least `side_accuracy`
  of them the right one; then the most that fit; then the safest.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np

from core.bundle import REACTIONS_FILE, ReactionSpec, read_manifest, seal, write_manifest
from core.encoder import Encoder
from core.reactions import stance_axes
from models.reactions import emotions
from models.reactions.classes import CLASS_NAMES, FALLBACK, REACTION_CLASSES, STANCE_AXES
from models.reactions.examples import LABELLED, ROOT, emotion_split, labelled_lines, training_examples
from models.reactions.fit import class_weights, fit_head, fit_valence
from models.reactions.gates import with_gates
from models.reactions.model import ReactionConfig, ReactionModel
from models.reactions.scoring import choose_gates
from models.reactions.vectors import CACHE, encode_cached


def train_reactions(
    encoder: Encoder,
    config: ReactionConfig = ReactionConfig(),  # noqa: B008  (frozen, so one shared default is safe)
    directory: Path = emotions.EMOTIONS_DIR,
    cache: Path = CACHE,
) -> tuple[ReactionModel, dict[str, Any]]:
    """The reaction model for `encoder`'s bundle, and what it was made from and chose.
    directory: the emotion sets; cache: where vectors of texts this encoder has read are kept."""
    if not emotions.available(directory):
        raise FileNotFoundError(f"no emotion sets at {directory} (CHITCHAT_EMOTIONS_DIR): see docs/reactions.md")
    started = time.perf_counter()
    examples = training_examples(config, directory)
    vectors = encode_cached(encoder, examples.texts, cache)  # [N, D]
    labels = np.array(examples.label)  # [N]
    language = np.array(examples.language)  # [N]
    taught = labels >= 0  # [N]
    weights = class_weights(examples, config.written_share)  # [N]
    arrays = fit_head(vectors[taught], labels[taught], weights[taught], len(CLASS_NAMES), config)
    valence = np.array(examples.valence)  # [N]
    sided = valence != 0  # [N]
    written = np.isin(np.array(examples.source), ["written", "axis"])  # [N] our own lines
    direction, offset = fit_valence(vectors[sided], valence[sided], language[sided], written[sided], config)
    names = list(STANCE_AXES)
    phase = ReactionSpec(labels=list(CLASS_NAMES), coverage=0.0, axes={"phase": STANCE_AXES["phase"]})
    phase_axis = stance_axes(phase, encoder)[0][0]  # [D]
    arrays["axes"] = np.stack([direction if n == "valence" else phase_axis for n in names])  # [A, D]
    arrays["axis_bias"] = np.array([offset if n == "valence" else 0.0 for n in names], np.float32)  # [A]
    spec = ReactionSpec(
        labels=[c.surface["en"] for c in REACTION_CLASSES],
        coverage=0.0,  # the classes are not mined from the corpus
        language="en",
        translations={"ko": [c.surface["ko"] for c in REACTION_CLASSES]},
        stances=[c.stance for c in REACTION_CLASSES],
        axes={name: [list(plus), list(minus)] for name, (plus, minus) in STANCE_AXES.items()},
        fallback=CLASS_NAMES.index(FALLBACK),
    )
    model = ReactionModel(spec, arrays)

    lines = [r for r in labelled_lines() if r["half"] == "A"]
    half_a = encode_cached(encoder, [r["text"] for r in lines], cache, alone=True)  # [L, D]
    dev = emotion_split("dev", per_source=600, seed=config.seed, directory=directory)
    dev_vectors = encode_cached(encoder, dev.texts, cache, alone=True)  # [M, D]
    gates, chosen = choose_gates(
        model,
        (half_a, [r["category"] for r in lines], [r["language"] for r in lines]),
        (dev_vectors, np.array(dev.side), dev.source),
        config,
    )
    model = with_gates(model, gates)
    counts = Counter((examples.language[i], CLASS_NAMES[c]) for i, c in enumerate(examples.label) if c >= 0)
    stats = {
        "config": {k: v for k, v in asdict(config).items() if not k.endswith("_grid")},
        "data": {
            "train_texts": len(examples),
            "by_source": dict(Counter(examples.source)),
            "per_class": {f"{lang}:{name}": n for (lang, name), n in sorted(counts.items())},
            "valence_texts": int(sided.sum()),
            "chosen_on": f"half A of {LABELLED.relative_to(ROOT)} ({len(lines)} lines), "
            f"{len(dev.texts)} clear dev texts",
        },
        "gates": {**asdict(gates), "half_a_fits": chosen["fits"], "half_a_wrong": chosen["wrong"]},
        "dev_side_accuracy": chosen["side_accuracy"],
        "gate_settings": {"tried": chosen["tried"], "meeting_the_rule": chosen["meeting_the_rule"]},
        "seconds": round(time.perf_counter() - started, 1),
    }
    return model, stats


def install(bundle: Path, model: ReactionModel, stats: dict[str, Any]) -> None:
    """Writes REACTIONS_FILE and reseals the manifest: its `reactions`, `files` and `checksum` (an index
    built with the bundle before must be built again), and the recipe's record in training.reactions."""
    model.save(bundle / REACTIONS_FILE)
    manifest = read_manifest(bundle)
    training = {**manifest.training, "reactions": stats}
    write_manifest(bundle, seal(bundle, replace(manifest, reactions=model.spec, training=training)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bundle", type=Path, action="append", required=True, help="repeatable")
    parser.add_argument("--dry-run", action="store_true", help="train and print; write nothing into the bundle")
    args = parser.parse_args()
    if not emotions.available():
        raise SystemExit(f"no emotion sets at {emotions.EMOTIONS_DIR} (CHITCHAT_EMOTIONS_DIR)")
    for bundle in args.bundle:
        encoder = Encoder(bundle, read_manifest(bundle))
        model, stats = train_reactions(encoder)
        print(json.dumps({"bundle": str(bundle), **stats}, ensure_ascii=False, indent=1), flush=True)
        if not args.dry_run:
            install(bundle, model, stats)
            print(
                f"[reactions] wrote {bundle / REACTIONS_FILE}; {read_manifest(bundle).checksum[:12]}", file=sys.stderr
            )


if __name__ == "__main__":
    main()
