"""Teacher fine-tune -> 3-layer student distillation -> int8 bundles.

    python -m models.train --profile quick    # <= 5 min on 2 cores
    python -m models.train --profile full     # <= 60 min on 2 cores

Designed for a 2-core CPU, where a full fine-tune step costs ~100 ms per pair:
every stage runs to a wall-clock budget (and a step cap), with the learning
rate decaying linearly in elapsed time, so a profile finishes on time on a
slower machine and simply trains less.

1. teacher: all-MiniLM-L6-v2 plus residual context/reply heads, tuned on
   (3-turn context joined with [SEP], next turn) pairs from the train split
   with in-batch negatives (ConveRT, Dialog-BERT).
2. student: 3 layers copied from alternate teacher layers, distilled on
   unlabelled corpus text (its vectors pulled to the teacher's), then tuned on
   pairs with in-batch negatives plus the teacher's score distribution
   (multi-task distillation, Dialog-BERT; Small-BERT).
3. poly head: m codes over the frozen student's token outputs, trained on
   cached features with in-batch negatives, kept at its best validation
   R@1 after rerank; m is chosen the same way (Humeau et al.).
4. reactions: frequent short replies mined from the train split; a linear
   classifier over the student's context vector (Dialog-BERT's third task).
5. export: teacher and student, fp32 and int8, each parity-checked; the
   student's bundles carry the poly head and the reaction classifier.

`--from-checkpoints` starts at stage 3 from the torch weights stage 2 saved.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from app.engine.bundle import TOKENIZER_FILE, PolySpec, ReactionSpec
from app.engine.text import normalize
from models import poly
from models.batches import Tokenise
from models.data import MAX_CANDIDATE_CHARS, Pair, load_conversations, load_pairs
from models.encoder import DualEncoder, load_pretrained, minilm_path
from models.evaluate import eval_set
from models.export import ExportConfig, export_bundle, parity_sample
from models.losses import embedding_distillation, in_batch_negatives, score_distillation
from models.reactions import ReactionModel, mine, train_classifier
from models.student import student_from


@dataclass
class TrainConfig:
    profile: str
    teacher_budget_s: float
    distill_budget_s: float
    student_budget_s: float
    max_steps: int = 100_000  # budgets, not step counts, end the full profile
    batch_size: int = 64  # in-batch negatives: 63 per pair; larger batches cost linearly on CPU
    teacher_lr: float = 3e-5  # measured here: 3e-5 for 100 steps lifted R@1 0.32 -> 0.39
    student_lr: float = 1e-4  # a 3-layer student starts further from its optimum
    head_lr: float = 1e-3  # zero-initialised residual heads move faster than the body
    warmup_fraction: float = 0.05
    scale: float = 20.0  # cosine -> logit scale, as sentence-transformers' MNRL
    distill_weight: float = 1.0  # score-distillation term, next to in-batch negatives
    max_context_tokens: int = 64  # training truncation; 3 turns median ~50 tokens
    max_reply_tokens: int = 48  # replies are mostly short; the tail is truncated in training only
    max_context_turns: int = 3
    student_layers: tuple[int, ...] = (1, 3, 5)  # alternate layers, keeping the last
    poly_pairs: int = 30_000  # cached token outputs: 30k x 64 x 384 in fp16 is 1.5 GB
    poly_codes: tuple[int, ...] = (16, 64)  # m candidates, chosen by validation R@1 after rerank
    poly_budget_s: float = 150  # per candidate m
    rerank_depth: int = 50  # what serving reranks (Settings.rerank_depth)
    validation_examples: int = 1000  # 1-of-100 on the validation split, to choose m
    seed: int = 0
    threads: int = 0  # 0: torch's default, one per core


PROFILES = {
    "quick": TrainConfig(
        "quick",
        teacher_budget_s=75,
        distill_budget_s=45,
        student_budget_s=45,
        poly_pairs=3000,
        poly_budget_s=10,
        validation_examples=300,
    ),
    "full": TrainConfig("full", teacher_budget_s=1350, distill_budget_s=540, student_budget_s=960),
}


def log(message: str) -> None:
    print(f"[train] {message}", file=sys.stderr, flush=True)


def train_pairs(pairs: list[Pair]) -> list[tuple[str, str]]:
    """Pairs usable for response selection: replies within the candidate cap."""
    return [(" [SEP] ".join(p.context), p.reply) for p in pairs if len(p.reply) <= MAX_CANDIDATE_CHARS]


def batches(items: list[tuple[str, str]], size: int, rng: random.Random) -> Iterator[list[tuple[str, str]]]:
    """Endless shuffled batches with no repeated reply inside a batch: a
    duplicate reply would be a false negative for its twin."""
    while True:
        order = items[:]
        rng.shuffle(order)
        batch: list[tuple[str, str]] = []
        seen: set[str] = set()
        for item in order:
            key = normalize(item[1])
            if key in seen:
                continue
            batch.append(item)
            seen.add(key)
            if len(batch) == size:
                yield batch
                batch, seen = [], set()


def optimiser(model: DualEncoder, body_lr: float, head_lr: float) -> torch.optim.Optimizer:
    heads = [p for h in (model.context_head, model.reply_head) if h is not None for p in h.parameters()]
    head_ids = {id(p) for p in heads}
    body = [p for p in model.parameters() if id(p) not in head_ids]
    groups = [{"params": body, "lr": body_lr}, {"params": heads, "lr": head_lr}]
    return torch.optim.AdamW(groups, weight_decay=0.01)


def run_budgeted(
    name: str,
    budget_s: float,
    max_steps: int,
    optimizer: torch.optim.Optimizer,
    warmup_fraction: float,
    batch_loss: Callable[[], torch.Tensor],
) -> dict[str, float]:
    """Optimises batch_loss() until the budget or max_steps; LR warms up, then decays linearly in time."""
    base = [g["lr"] for g in optimizer.param_groups]
    started = time.perf_counter()
    losses: list[float] = []
    bar = tqdm(total=round(budget_s), desc=name, unit="s", file=sys.stderr)
    while len(losses) < max_steps:
        elapsed = time.perf_counter() - started
        if elapsed >= budget_s:
            break
        progress = elapsed / budget_s
        factor = min(1.0, progress / warmup_fraction) if progress < warmup_fraction else 1.0 - progress
        for group, lr in zip(optimizer.param_groups, base, strict=True):
            group["lr"] = lr * max(factor, 0.02)
        loss = batch_loss()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        bar.n = min(round(time.perf_counter() - started), round(budget_s))
        bar.set_postfix(step=len(losses), loss=f"{sum(losses[-20:]) / len(losses[-20:]):.3f}")
    bar.close()
    seconds = time.perf_counter() - started
    tail = losses[-20:] or [float("nan")]
    log(f"{name}: {len(losses)} steps in {seconds:.0f}s, final loss {sum(tail) / len(tail):.3f}")
    return {"steps": len(losses), "seconds": round(seconds, 1), "final_loss": round(sum(tail) / len(tail), 4)}


def train_teacher(
    model: DualEncoder, pairs: list[tuple[str, str]], tok: Tokenise, cfg: TrainConfig
) -> dict[str, float]:
    model.train()
    opt = optimiser(model, cfg.teacher_lr, cfg.head_lr)
    stream = batches(pairs, cfg.batch_size, random.Random(cfg.seed))

    def batch_loss() -> torch.Tensor:
        batch = next(stream)
        context = model.encode_context(*tok.contexts([c for c, _ in batch]))  # [B, D]
        reply = model.encode_reply(*tok.replies([r for _, r in batch]))  # [B, D]
        return in_batch_negatives(context, reply, cfg.scale)

    stats = run_budgeted("teacher", cfg.teacher_budget_s, cfg.max_steps, opt, cfg.warmup_fraction, batch_loss)
    model.eval()
    return stats


def distill_student(
    student: DualEncoder, teacher: DualEncoder, texts: list[str], tok: Tokenise, cfg: TrainConfig
) -> dict[str, float]:
    """Unlabelled text: both student outputs pulled to the teacher's for the same input."""
    student.train()
    opt = optimiser(student, cfg.student_lr, cfg.head_lr)
    rng = random.Random(cfg.seed + 1)

    def batch_loss() -> torch.Tensor:
        batch = rng.sample(texts, min(cfg.batch_size, len(texts)))
        ids, mask = tok.contexts(batch)  # [B, T]
        with torch.inference_mode():
            t_context, t_reply = teacher(ids, mask)  # [B, D] each
        s_context, s_reply = student(ids, mask)  # [B, D] each
        return embedding_distillation(s_context, t_context.clone()) + embedding_distillation(s_reply, t_reply.clone())

    stats = run_budgeted("distill", cfg.distill_budget_s, cfg.max_steps, opt, cfg.warmup_fraction, batch_loss)
    student.eval()
    return stats


def tune_student(
    student: DualEncoder, teacher: DualEncoder, pairs: list[tuple[str, str]], tok: Tokenise, cfg: TrainConfig
) -> dict[str, float]:
    """Pairs: in-batch negatives plus the teacher's in-batch score distribution."""
    student.train()
    opt = optimiser(student, cfg.student_lr, cfg.head_lr)
    stream = batches(pairs, cfg.batch_size, random.Random(cfg.seed + 2))

    def batch_loss() -> torch.Tensor:
        batch = next(stream)
        context_in = tok.contexts([c for c, _ in batch])
        reply_in = tok.replies([r for _, r in batch])
        with torch.inference_mode():
            t_context = teacher.encode_context(*context_in)  # [B, D]
            t_reply = teacher.encode_reply(*reply_in)  # [B, D]
        context = student.encode_context(*context_in)  # [B, D]
        reply = student.encode_reply(*reply_in)  # [B, D]
        return in_batch_negatives(context, reply, cfg.scale) + cfg.distill_weight * score_distillation(
            context, reply, t_context.clone(), t_reply.clone(), cfg.scale
        )

    stats = run_budgeted("student", cfg.student_budget_s, cfg.max_steps, opt, cfg.warmup_fraction, batch_loss)
    student.eval()
    return stats


def train_poly(
    student: DualEncoder, pairs: list[tuple[str, str]], tok: Tokenise, cfg: TrainConfig, data_path: Path | None
) -> tuple[poly.PolyHead, dict[str, float]]:
    """Trains one head per m in cfg.poly_codes and keeps the best on validation."""
    started = time.perf_counter()
    sample = random.Random(cfg.seed + 3).sample(pairs, min(cfg.poly_pairs, len(pairs)))
    train_features = poly.features(student, tok, sample, cfg.max_context_tokens)
    val = eval_set(cfg.validation_examples, cfg.seed, "validation", data_path)
    val_pairs = list(zip(val.joined(" [SEP] ", cfg.max_context_turns), val.replies, strict=True))
    val_features = poly.features(student, tok, val_pairs, cfg.max_context_tokens)
    candidates = np.concatenate([np.arange(len(val_pairs))[:, None], val.negatives], axis=1)  # [N, 100]

    def validate(head: poly.PolyHead) -> float:
        return poly.evaluate(head, val_features, candidates, cfg.rerank_depth)["rerank_r_at_1"]

    stats: dict[str, float] = {"features_seconds": round(time.perf_counter() - started, 1)}
    heads = {}
    for codes in cfg.poly_codes:
        head, head_stats = poly.train(
            train_features, poly.PolyTrainConfig(codes, cfg.poly_budget_s, cfg.max_steps), validate
        )
        head_stats.update(poly.evaluate(head, val_features, candidates, cfg.rerank_depth))
        log(f"poly m={codes}: {head_stats}")
        heads[codes] = head
        stats.update({f"m{codes}_{k}": v for k, v in head_stats.items()})
    # Ties go to the smaller m: it costs less to serve.
    best = max(heads, key=lambda m: (stats[f"m{m}_rerank_r_at_1"], -m))
    stats["codes"] = best
    stats["seconds"] = round(time.perf_counter() - started, 1)
    return heads[best], stats


def train_reactions(
    student: DualEncoder, pairs: list[tuple[str, str]], tok: Tokenise, cfg: TrainConfig
) -> tuple[ReactionModel | None, dict[str, float]]:
    started = time.perf_counter()
    reaction_set = mine([r for _, r in pairs])
    if not reaction_set.labels:
        log("reactions: no reply is frequent enough to be one; the bundle gets no classifier")
        return None, {"classes": 0, "coverage": 0.0}
    labels = reaction_set.classify([r for _, r in pairs])  # [N], -1: not a reaction
    contexts = [c for (c, _), label in zip(pairs, labels, strict=True) if label >= 0]
    with torch.inference_mode():
        vectors = torch.cat(
            [student.encode_context(*tok.contexts(contexts[i : i + 256])) for i in range(0, len(contexts), 256)]
        )  # [M, D]
    weight, bias = train_classifier(vectors.clone(), torch.from_numpy(labels[labels >= 0]), len(reaction_set.labels))
    spec = ReactionSpec(labels=reaction_set.labels, coverage=reaction_set.coverage)
    stats = {"classes": len(spec.labels), "coverage": spec.coverage, "examples": len(contexts)}
    stats["seconds"] = round(time.perf_counter() - started, 1)
    log(f"reactions: {stats}")
    return ReactionModel(spec, weight, bias), stats


def unlabelled_texts(pairs: list[tuple[str, str]], conversations_turns: list[str], limit: int, seed: int) -> list[str]:
    """Contexts and single turns, the two kinds of input the encoder serves."""
    rng = random.Random(seed)
    contexts = [c for c, _ in pairs]
    mixed = rng.sample(contexts, min(limit // 2, len(contexts))) + rng.sample(
        conversations_turns, min(limit // 2, len(conversations_turns))
    )
    rng.shuffle(mixed)
    return mixed


@dataclass
class Outputs:
    bundles: list[Path]
    stats: dict[str, dict[str, float]]


def run(
    cfg: TrainConfig,
    bundles_root: Path,
    teacher: DualEncoder,
    tokenizer_path: Path,
    model_id: str,
    data_path: Path | None = None,
    parity_texts: list[str] | None = None,
    min_parity_cosine: float = 0.99,
    prefix: str = "chitchat",
    from_checkpoints: bool = False,
) -> Outputs:
    started = time.perf_counter()
    torch.manual_seed(cfg.seed)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    tok = Tokenise(tokenizer_path, cfg.max_context_tokens, cfg.max_reply_tokens)
    pairs = train_pairs(load_pairs("train", cfg.max_context_turns, data_path))
    turns = [t for c in load_conversations(data_path) for t in c.turns if len(t) <= MAX_CANDIDATE_CHARS]
    log(f"{len(pairs)} train pairs, {len(turns)} turns loaded in {time.perf_counter() - started:.1f}s")
    parity_texts = parity_texts or parity_sample()

    checkpoints = bundles_root.parent / "checkpoints"
    if teacher.context_head is None:
        teacher.add_heads()
    if from_checkpoints:
        teacher.load_state_dict(torch.load(checkpoints / f"{prefix}-teacher.pt"))
        student = student_from(teacher, cfg.student_layers)
        student.load_state_dict(torch.load(checkpoints / f"{prefix}-student.pt"))
        stats: dict[str, dict[str, float]] = {}
    else:
        stats = {"teacher": train_teacher(teacher, pairs, tok, cfg)}
        student = student_from(teacher, cfg.student_layers)
        distill_texts = unlabelled_texts(pairs, turns, limit=200_000, seed=cfg.seed)
        stats["distill"] = distill_student(student, teacher, distill_texts, tok, cfg)
        stats["student"] = tune_student(student, teacher, pairs, tok, cfg)
        # Torch weights, so the stages below can be rerun without retraining.
        checkpoints.mkdir(parents=True, exist_ok=True)
        for model, role in ((teacher, "teacher"), (student, "student")):
            torch.save(model.state_dict(), checkpoints / f"{prefix}-{role}.pt")
    teacher.eval()
    student.eval()

    poly_head, stats["poly"] = train_poly(student, pairs, tok, cfg, data_path)
    reactions, stats["reactions"] = train_reactions(student, pairs, tok, cfg)

    export_started = time.perf_counter()
    bundles = []
    teacher_layers = int(teacher.body.config.num_hidden_layers)
    student_layers = int(student.body.config.num_hidden_layers)
    student.poly_head = poly_head  # the student's bundles carry the head; the teacher's do not
    head_spec = PolySpec(codes=poly_head.num_codes, weight=float(poly_head.weight.item()))
    for model, role, layers, servable in (
        (teacher, "teacher", teacher_layers, False),
        (student, "student", student_layers, True),
    ):
        for quantize in (False, True):
            config = ExportConfig(
                name=f"{prefix}-{role}-l{layers}-{'int8' if quantize else 'fp32'}",
                model_id=f"{model_id} ({role}, {cfg.profile} profile)",
                kind=role,
                tokenizer_path=tokenizer_path,
                max_context_turns=cfg.max_context_turns,
                quantize=quantize,
                min_parity_cosine=min_parity_cosine,
                # Only the int8 student is meant to serve; the rest are for evaluation.
                servable=servable and quantize,
                training={"profile": cfg.profile, **{f"{k}_{m}": v for k, s in stats.items() for m, v in s.items()}},
                poly=head_spec if model is student else None,
                reactions=reactions if model is student else None,
            )
            bundles.append(export_bundle(model, config, bundles_root, parity_texts))
    stats["export"] = {"seconds": round(time.perf_counter() - export_started, 1)}
    log(f"done in {time.perf_counter() - started:.0f}s: {stats}")
    return Outputs(bundles, stats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", choices=sorted(PROFILES), default="quick")
    parser.add_argument("--bundles", type=Path, default=Path("artifacts/bundles"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--from-checkpoints", action="store_true", help="skip stages 1-2: load their saved weights")
    args = parser.parse_args()
    cfg = replace(PROFILES[args.profile], seed=args.seed)
    log(f"profile {cfg.profile}: {asdict(cfg)}")
    run(
        cfg,
        args.bundles,
        load_pretrained(),
        minilm_path() / TOKENIZER_FILE,
        "sentence-transformers/all-MiniLM-L6-v2",
        from_checkpoints=args.from_checkpoints,
    )


if __name__ == "__main__":
    main()
