"""The multilingual student, trained from a pack (models/pack.py) with both
teachers running beside it: no target vectors are computed ahead, so a long
run on a GPU sees as many batches as its minutes allow.

    python -m models.live_student --tune-teacher --device cuda --student 0,1,2,3,5,7,9,10,11:230
    python -m models.live_student --tune-teacher --tune-steps 2 --rotation-texts 64 --student 0,11 --steps 3
                                                                     # a smoke run on the CPU (~3 min)

A rerun resumes: the teacher tune and each student from their last
checkpoint in --work.

It imports torch, transformers, tokenizers, numpy and scipy and reads nothing but
the pack, so it runs on a machine without our packages.

The student is the teacher's `layers` under the teacher's (frozen) trimmed
embeddings, with residual context and reply heads. Both sides read
"query: " + text, so one pass of the body gives a text's context and reply
vectors. The targets:

- Korean text: the tuned e5 teacher's vectors (tuned first, `--tune-teacher`), "query: " for the context
  head and "passage: " for the reply head;
- English text: the mean of those and all-MiniLM-L6-v2's vector, turned into
  e5's space by the rotation that maps MiniLM's vectors of English text
  closest to e5's (orthogonal Procrustes, fitted at the start of the run on
  the pack's English text). A rotation keeps every MiniLM similarity as it
  is, so English targets carry both models' sense of what is alike (MiniLM
  is the stronger of the two on replies it never saw, reports/ood.md) in one
  space with the Korean ones.

`--english-targets minilm` makes the English targets rotated MiniLM alone
(Korean stays e5's): English then ranks as MiniLM does, the stronger teacher
out of domain, and only the Korean side keeps e5's sense (and e5 reads no
English). `--task-weight` weighs the in-batch chitchat task against the
teachers' vectors; `--broad-batch` sets how many broad texts a step distils.
`--teacher-layers` reuses an earlier run's tuned teacher instead of tuning
one, so two recipes can share a teacher.

Each step: in-batch negatives on (context, reply) pairs, the task; KL to the
targets' in-batch score distribution; 1 - cosine to the targets of the
batch's contexts and replies and of a batch of broad text, both heads.

On a CPU with AMX, `--bf16` runs the teachers and the student in bfloat16.

Output, in --work: `teacher-layers.npz` (the tuned layers, fp16, as
models/trained_layers.py reads them), `student-l<N>.npz` per student (every
tensor it trained, fp16; the frozen embedding rows are the pack's), and
`run.json` (what each stage measured). models/live_export.py makes bundles of them.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from transformers import BertConfig, BertModel

from models.batches import BatchPlan, Tokenise
from models.dataset import TrainPairs
from models.e5_weights import BertShape, E5Weights, bert_body, fitted_body, keep_layers
from models.encoder import DualEncoder, mean_pool
from models.loop import run_steps
from models.losses import embedding_distillation, in_batch_negatives
from models.pack import E5_FILE, MINILM_DIR, MINILM_FILE, STUDENT_TOKENIZER, TEXTS_FILE, PackTexts, from_int8

WORD_EMBEDDINGS = "embeddings.word_embeddings.weight"
PREFETCH = 3  # steps tokenised ahead of the one running
TEACHER_FILE = "teacher-layers.npz"  # the tuned top layers, fp16, as models/trained_layers.py reads them
RUN_FILE = "run.json"


@dataclass(frozen=True)
class LiveConfig:
    # Teacher layers the student starts from, renumbered 0..L-1. The first
    # and the last carry the most (models/e5_student.py measured 9 against 6
    # before any training); how much training wins back is what a run measures.
    layers: tuple[int, ...] = (0, 1, 2, 3, 5, 7, 9, 10, 11)
    steps: int = 3000  # an upper bound: `budget_s` cuts it to what fits
    batch_size: int = 128  # pairs; in-batch negatives: 127 per pair
    broad_batch_size: int = 256
    length_group: int = 16  # batches cut from length-sorted groups pad little
    # Every n-th step is a batch of Korean pairs. Our 4,301 Korean pairs are
    # few: at 16, 3,000 steps see each about 5.5 times.
    korean_every: int = 16
    lr: float = 1e-4
    head_lr: float = 1e-3  # zero-initialised residual heads move faster than a body
    warmup_fraction: float = 0.05
    scale: float = 50.0  # e5's cosines sit in a narrow band; its tune's scale separates them
    score_weight: float = 1.0  # KL to the targets' in-batch scores
    vector_weight: float = 10.0  # 1 - cosine is ~0.2 at the start, a few hundredths once close
    # English targets: e5 + this weight x rotated MiniLM, then normalised. 1: the
    # two teachers count alike (not tuned on any out-of-domain set).
    minilm_weight: float = 1.0
    # "mix": the English targets above; "minilm": rotated MiniLM alone, so that English
    # ranks as MiniLM does (the stronger teacher on replies it never saw) and Korean as e5.
    english_targets: str = "mix"
    # The in-batch chitchat task's weight. It pulls the geometry towards one corpus (the
    # issue's MiniLM fine-tune: chatterbot 0.257 -> 0.238); below 1 the teachers' vectors lead.
    task_weight: float = 1.0
    rotation_texts: int = 16384  # English texts the rotation is fitted on
    max_context_tokens: int = 96
    max_reply_tokens: int = 96
    minilm_max_tokens: int = 128
    prefix: str = "query: "  # the student's, both sides (see the module docstring)
    checkpoint_every: int = 200
    seed: int = 0


def autocast(device: str, bf16: bool) -> torch.autocast:
    """bfloat16 where it pays: always on a GPU; on a CPU when asked (`--bf16`, for CPUs with AMX)."""
    kind = "cuda" if device.startswith("cuda") else "cpu"
    return torch.autocast(kind, dtype=torch.bfloat16, enabled=kind == "cuda" or bf16)


def log(message: str) -> None:
    print(f"[live-student] {message}", file=sys.stderr, flush=True)


class Pack:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.meta: dict[str, Any] = json.loads((folder / "meta.json").read_text())
        self.texts = PackTexts.load(folder / TEXTS_FILE)
        self.e5 = from_int8(dict(np.load(folder / E5_FILE)))  # BertModel names -> fp32

    def e5_weights(self) -> E5Weights:
        """The pack's e5 (with any tuned layers laid over it) as the builder's weights."""
        shape = BertShape(**self.meta["e5_shape"])
        return E5Weights(shape, self.e5)

    def e5_body(self, layers: tuple[int, ...]) -> BertModel:
        """The teacher's `layers`, renumbered 0..L-1, under its embeddings."""
        return bert_body(keep_layers(self.e5_weights(), layers))

    def minilm_body(self) -> BertModel:
        config = BertConfig.from_json_file(str(self.folder / MINILM_DIR / "config.json"))
        config._attn_implementation = "sdpa"  # a teacher is never exported
        arrays = from_int8(dict(np.load(self.folder / MINILM_FILE)))
        # An older export's safetensors carry position_ids, a buffer.
        return fitted_body(config, {k: v for k, v in arrays.items() if not k.endswith("position_ids")})


Tokens = tuple[torch.Tensor, torch.Tensor]  # [B, T] ids, [B, T] mask, on the CPU


@dataclass(frozen=True)
class TargetInputs:
    """What the teachers read for one batch of texts and one side, tokenised ahead of the step."""

    e5: Tokens | None  # None where the targets are MiniLM's alone (English, `english_targets="minilm"`)
    minilm: Tokens | None  # English texts only


def procrustes(source: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """[D', D] orthogonal R minimising |source @ R - target|: source [N, D'], target [N, D]."""
    u, _, vt = torch.linalg.svd(source.T @ target, full_matrices=False)  # [D', k], [k], [k, D]
    return u @ vt


class Teachers:
    """Both teachers' target vectors for any batch of texts, on the training device."""

    def __init__(self, pack: Pack, cfg: LiveConfig, device: str, bf16: bool = False) -> None:
        self.device = device
        self.bf16 = bf16
        self.cfg = cfg
        self.e5 = pack.e5_body(tuple(range(pack.meta["e5_shape"]["layers"]))).to(device)
        self.minilm = pack.minilm_body().to(device)
        self.e5_tok = Tokenise(pack.folder / STUDENT_TOKENIZER, cfg.max_context_tokens, cfg.max_reply_tokens, "query: ")
        minilm_tokenizer = pack.folder / MINILM_DIR / "tokenizer.json"
        self.minilm_tok = Tokenise(minilm_tokenizer, cfg.minilm_max_tokens, cfg.minilm_max_tokens)
        dims = (self.minilm.config.hidden_size, self.e5.config.hidden_size)
        self.rotation = torch.eye(*dims, device=device)  # [D', D] MiniLM -> e5; fitted by `fit_rotation`

    @torch.no_grad()
    def _pool(self, body: BertModel, tokens: Tokens) -> torch.Tensor:
        ids, mask = (x.to(self.device, non_blocking=True) for x in tokens)
        with autocast(self.device, self.bf16):
            hidden = body(input_ids=ids, attention_mask=mask).last_hidden_state  # [B, T, H]
        return F.normalize(mean_pool(hidden.float(), mask), dim=-1)  # [B, H]

    def _e5_tokens(self, texts: list[str], side: str) -> Tokens:
        """ "query: " texts cut as contexts are, "passage: " texts as replies are."""
        if side == "query":
            return self.e5_tok.contexts(["query: " + t for t in texts])
        return self.e5_tok.replies(["passage: " + t for t in texts])

    def _minilm_tokens(self, texts: list[str], context: bool) -> Tokens:
        return (self.minilm_tok.contexts if context else self.minilm_tok.replies)(texts)

    def inputs(self, texts: list[str], side: str, english: bool, minilm_texts: list[str] | None = None) -> TargetInputs:
        """CPU work only (safe off the training thread); `minilm_texts`: MiniLM's own joins of the texts, if any."""
        minilm = self._minilm_tokens(minilm_texts or texts, context=side == "query") if english else None
        e5_read = not english or self.cfg.english_targets != "minilm"
        return TargetInputs(self._e5_tokens(texts, side) if e5_read else None, minilm)

    def targets(self, inputs: TargetInputs) -> torch.Tensor:
        """[B, D] unit targets; English rows mix in rotated MiniLM (the module docstring)."""
        minilm = None if inputs.minilm is None else self._pool(self.minilm, inputs.minilm) @ self.rotation  # [B, D]
        if minilm is not None and self.cfg.english_targets == "minilm":
            return minilm  # a rotation of unit rows: unit rows
        assert inputs.e5 is not None, "English inputs made for MiniLM's targets alone"
        e5 = self._pool(self.e5, inputs.e5)  # [B, D]
        if minilm is None:
            return e5
        return F.normalize(e5 + self.cfg.minilm_weight * minilm, dim=-1)

    def fit_rotation(self, texts: list[str], batch: int = 512) -> float:
        """Fits the rotation on English `texts`; returns the mean cosine of rotated MiniLM to e5 after."""
        chunks = [texts[i : i + batch] for i in range(0, len(texts), batch)]
        e5 = torch.cat([self._pool(self.e5, self._e5_tokens(c, "query")) for c in chunks])  # [N, D]
        minilm = torch.cat([self._pool(self.minilm, self._minilm_tokens(c, False)) for c in chunks])  # [N, D']
        self.rotation = procrustes(minilm, e5)
        return float((minilm @ self.rotation * e5).sum(-1).mean())


@dataclass(frozen=True)
class TeacherTune:
    """models/multilingual_tune.py's recipe (TuneConfig, ChatterBot off), run from the pack."""

    trained_layers: int = 6  # the top 6 of 12; the 6 below carry the alignment across languages
    steps: int = 720  # TuneConfig's: 46k pairs, under half a pass
    batch_size: int = 64
    lr: float = 4e-5
    warmup_fraction: float = 0.05
    scale: float = 50.0
    korean_every: int = 8  # with ChatterBot off, every other-language batch is Korean
    max_tokens: int = 96
    seed: int = 0


def tune_teacher(
    pack: Pack, tune: TeacherTune, work: Path, device: str, budget_s: float | None, bf16: bool = False
) -> dict[str, Any]:
    """Trains the top layers of the pack's e5 on the pack's pairs; lays them over `pack.e5`."""
    layers = pack.meta["e5_shape"]["layers"]
    model = DualEncoder(pack.e5_body(tuple(range(layers)))).to(device)
    first = layers - tune.trained_layers
    if not 0 < first < layers:
        raise ValueError(f"{tune.trained_layers} trained layers of {layers}: some must learn and some stay")
    for name, parameter in model.body.named_parameters():
        parameter.requires_grad_(name.startswith("encoder.layer.") and int(name.split(".")[2]) >= first)
    t = pack.texts
    english = TrainPairs(t.english_contexts, t.english_replies)
    korean = TrainPairs(t.korean_contexts, t.korean_replies)
    english_plan = BatchPlan(english.reply_keys, english.lengths, tune.batch_size, 16, tune.seed)
    korean_plan = BatchPlan(korean.reply_keys, korean.lengths, tune.batch_size, 1, tune.seed)
    tok = Tokenise(pack.folder / STUDENT_TOKENIZER, tune.max_tokens, tune.max_tokens, "query: ")

    def batch_loss(step: int) -> torch.Tensor:
        if step % tune.korean_every == tune.korean_every - 1:
            contexts, replies = korean.rows(korean_plan.batch(step // tune.korean_every))
        else:
            contexts, replies = english.rows(english_plan.batch(step - (step + 1) // tune.korean_every))
        with autocast(device, bf16):
            context = model.encode_context(*(x.to(device) for x in tok.contexts(["query: " + c for c in contexts])))
            reply = model.encode_reply(*(x.to(device) for x in tok.replies(["passage: " + r for r in replies])))
        return in_batch_negatives(context.float(), reply.float(), tune.scale)

    torch.manual_seed(tune.seed)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=tune.lr, weight_decay=0.01)
    stats = run_steps(
        "teacher-tune", {"model": model}, opt, tune.steps, tune.warmup_fraction, batch_loss,
        work / "teacher-checkpoint.pt", 100, budget_s,
    )  # fmt: skip
    trained = {
        name: value.detach().cpu().numpy().astype(np.float32)
        for name, value in model.body.state_dict().items()
        if name.startswith("encoder.layer.") and int(name.split(".")[2]) >= first
    }
    pack.e5.update(trained)
    work.mkdir(parents=True, exist_ok=True)
    np.savez(work / TEACHER_FILE, **{k: v.astype(np.float16) for k, v in trained.items()})
    return {"config": asdict(tune), "train": stats}


def lay_teacher(pack: Pack, layers_file: Path) -> dict[str, Any] | None:
    """Lays an earlier run's tuned layers (its `TEACHER_FILE`) over `pack.e5`; returns that run's tune record."""
    pack.e5.update({k: v.astype(np.float32) for k, v in np.load(layers_file).items()})
    earlier = layers_file.parent / RUN_FILE
    return json.loads(earlier.read_text()).get("teacher_tune") if earlier.exists() else None


def student_model(pack: Pack, cfg: LiveConfig) -> DualEncoder:
    model = DualEncoder(pack.e5_body(cfg.layers))
    model.add_heads()
    # The embedding table is half the student and carries e5's alignment across
    # languages; frozen, it also need not travel back from a GPU machine.
    model.body.embeddings.word_embeddings.weight.requires_grad_(False)
    return model


class BroadBatches:
    """Rows of the broad pools for each step, each pool its share; a function of the step."""

    def __init__(self, pools: dict[str, list[str]], shares: dict[str, float], seed: int) -> None:
        self.names = sorted(pools, key=lambda n: (not n.startswith("en"), n))  # English first
        self.pools = pools
        self.shares = shares
        self.seed = seed

    def batch(self, step: int, size: int) -> tuple[list[str], int]:
        """(texts, how many of them, from the front, are English)."""
        rng = np.random.default_rng((self.seed, step))
        counts = {n: round(self.shares[n] * size) for n in self.names}
        counts[self.names[-1]] += size - sum(counts.values())
        texts: list[str] = []
        english = 0
        for name in self.names:
            pool = self.pools[name]
            picked = [pool[i] for i in rng.choice(len(pool), counts[name], replace=counts[name] > len(pool))]
            texts += picked
            english += len(picked) if name.startswith("en") else 0
        return texts, english


def fit_rotation(pack: Pack, teachers: Teachers, texts: int, seed: int) -> float:
    english = [x for name, pool in pack.texts.broad.items() if name.startswith("en") for x in pool]
    rng = np.random.default_rng(seed)
    fit = teachers.fit_rotation([english[i] for i in rng.permutation(len(english))[:texts]])
    log(f"rotation MiniLM -> e5 fitted on {min(texts, len(english))} English texts: mean cosine {fit:.3f}")
    return fit


def student_file(layers: tuple[int, ...]) -> str:
    return f"student-l{len(layers)}.npz"


def train(
    pack: Pack, teachers: Teachers, cfg: LiveConfig, work: Path, device: str, budget_s: float | None, bf16: bool = False
) -> dict[str, Any]:
    """Trains one student; writes its tensors to `work / student_file(cfg.layers)` and returns its figures."""
    torch.manual_seed(cfg.seed)
    started = time.perf_counter()
    t = pack.texts
    english = TrainPairs(t.english_contexts, t.english_replies)
    korean = TrainPairs(t.korean_contexts, t.korean_replies)
    english_plan = BatchPlan(english.reply_keys, english.lengths, cfg.batch_size, cfg.length_group, cfg.seed)
    korean_plan = BatchPlan(korean.reply_keys, korean.lengths, min(cfg.batch_size, len(korean) // 2), 1, cfg.seed)
    broad = BroadBatches(t.broad, t.broad_shares, cfg.seed)
    model = student_model(pack, cfg).to(device)
    tok = Tokenise(pack.folder / STUDENT_TOKENIZER, cfg.max_context_tokens, cfg.max_reply_tokens, cfg.prefix)

    def is_korean(step: int) -> bool:
        return cfg.korean_every > 0 and step % cfg.korean_every == cfg.korean_every - 1

    @dataclass(frozen=True)
    class Step:
        """One step's tokenised inputs, made on the CPU while the device runs the step before."""

        context: Tokens  # the student's
        reply: Tokens
        broad: Tokens
        t_context: TargetInputs  # the teachers'
        t_reply: TargetInputs
        t_broad: tuple[TargetInputs, TargetInputs, TargetInputs, TargetInputs]  # query en, ko; passage en, ko

    def prepare(step: int) -> Step:
        if is_korean(step):
            contexts, replies = korean.rows(korean_plan.batch(step // cfg.korean_every))
            minilm_contexts, en = None, False
        else:
            rows = english_plan.batch(step - (step + 1) // max(cfg.korean_every, 1))
            contexts, replies = english.rows(rows)
            minilm_contexts, en = [t.english_minilm_contexts[i] for i in rows], True
        texts, n_en = broad.batch(step, cfg.broad_batch_size)
        return Step(
            tok.contexts([cfg.prefix + c for c in contexts]),
            tok.replies([cfg.prefix + r for r in replies]),
            tok.replies([cfg.prefix + x for x in texts]),
            teachers.inputs(contexts, "query", en, minilm_contexts),
            teachers.inputs(replies, "passage", en),
            tuple(  # type: ignore[arg-type]
                teachers.inputs(part, side, english)
                for side in ("query", "passage")
                for part, english in ((texts[:n_en], True), (texts[n_en:], False))
            ),
        )

    # Tokenising ~1,300 texts a step for three models is CPU work a GPU would
    # wait on; threads make the next steps' while this one runs (tokenizers
    # releases the GIL). A step's batch is a function of the step, so order is kept.
    ahead = ThreadPoolExecutor(max_workers=PREFETCH)
    pending: dict[int, Future[Step]] = {}

    def batch_loss(step: int) -> torch.Tensor:
        for later in range(step, step + PREFETCH + 1):
            if later not in pending:
                pending[later] = ahead.submit(prepare, later)
        batch = pending.pop(step).result()

        def on(tokens: Tokens) -> Tokens:
            return tokens[0].to(device, non_blocking=True), tokens[1].to(device, non_blocking=True)

        t_context, t_reply = teachers.targets(batch.t_context), teachers.targets(batch.t_reply)  # [B, D]
        q_en, q_ko, p_en, p_ko = (teachers.targets(x) for x in batch.t_broad)  # [b_en, D], [b_ko, D], ...
        t_broad_q, t_broad_p = torch.cat([q_en, q_ko]), torch.cat([p_en, p_ko])  # [b, D]
        with autocast(device, bf16):
            context = model.encode_context(*on(batch.context))  # [B, D]
            reply = model.encode_reply(*on(batch.reply))  # [B, D]
            broad_context, broad_reply = model(*on(batch.broad))[:2]  # [b, D] each
        context, reply = context.float(), reply.float()
        task = in_batch_negatives(context, reply, cfg.scale)
        scores = F.kl_div(
            F.log_softmax(cfg.scale * context @ reply.T, -1),
            F.log_softmax(cfg.scale * t_context @ t_reply.T, -1),
            log_target=True,
            reduction="batchmean",
        )
        vectors = embedding_distillation(context, t_context) + embedding_distillation(reply, t_reply)
        broad_vectors = embedding_distillation(broad_context.float(), t_broad_q) + embedding_distillation(
            broad_reply.float(), t_broad_p
        )
        return cfg.task_weight * task + cfg.score_weight * scores + cfg.vector_weight * (vectors + broad_vectors)

    heads = [p for h in (model.context_head, model.reply_head) if h is not None for p in h.parameters()]
    head_ids = {id(p) for p in heads}
    body = [p for p in model.parameters() if p.requires_grad and id(p) not in head_ids]
    opt = torch.optim.AdamW([{"params": body, "lr": cfg.lr}, {"params": heads, "lr": cfg.head_lr}], weight_decay=0.01)
    stats = run_steps(
        "live-student",
        {"model": model},
        opt,
        cfg.steps,
        cfg.warmup_fraction,
        batch_loss,
        work / f"checkpoint-l{len(cfg.layers)}.pt",
        cfg.checkpoint_every,
        budget_s,
    )
    ahead.shutdown(cancel_futures=True)
    state = {k: v.detach().cpu().numpy().astype(np.float16) for k, v in model.state_dict().items()}
    state.pop(f"body.{WORD_EMBEDDINGS}")
    work.mkdir(parents=True, exist_ok=True)
    np.savez(work / student_file(cfg.layers), **state)
    return {"config": asdict(cfg), "train": stats, "minutes": round((time.perf_counter() - started) / 60, 1)}


def load_student(pack: Pack, layers: tuple[int, ...], trained: Path) -> DualEncoder:
    """A trained student on the CPU: the pack's embeddings under the run's tensors."""
    model = student_model(pack, LiveConfig(layers=layers))
    # fp16 as `train` writes it, or int8 rows (models/pack.py's `to_int8`) where a file had to travel small.
    state = {k: torch.from_numpy(v.astype(np.float32)) for k, v in from_int8(dict(np.load(trained))).items()}
    state[f"body.{WORD_EMBEDDINGS}"] = model.body.embeddings.word_embeddings.weight.detach()
    model.load_state_dict(state)
    return model.eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pack", type=Path, default=Path("artifacts/pack"))
    parser.add_argument("--work", type=Path, default=Path("artifacts/live-student"))
    parser.add_argument(
        "--student",
        action="append",
        default=[],
        help="LAYERS[:BUDGET_S], e.g. 0,1,2,3,5,7,9,10,11:240; repeat for several (default: LiveConfig.layers)",
    )
    parser.add_argument("--steps", type=int, default=LiveConfig.steps, help="each student's steps, at most")
    parser.add_argument("--tune-teacher", action="store_true", help="tune the pack's e5 first (TeacherTune)")
    parser.add_argument("--tune-steps", type=int, default=TeacherTune.steps)
    parser.add_argument("--tune-budget-s", type=float, default=None)
    parser.add_argument(
        "--teacher-layers", type=Path, default=None, help="an earlier run's teacher-layers.npz, instead of a tune"
    )
    parser.add_argument("--rotation-texts", type=int, default=LiveConfig.rotation_texts)
    parser.add_argument("--device", default="cpu", help="torch device, e.g. cuda")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    parser.add_argument("--bf16", action="store_true", help="bfloat16 on the CPU too (pays with AMX)")
    parser.add_argument("--english-targets", choices=("mix", "minilm"), default=LiveConfig.english_targets)
    parser.add_argument("--task-weight", type=float, default=LiveConfig.task_weight)
    parser.add_argument("--broad-batch", type=int, default=LiveConfig.broad_batch_size)
    parser.add_argument("--lr", type=float, default=LiveConfig.lr, help="the body's peak learning rate")
    args = parser.parse_args()
    if args.tune_teacher and args.teacher_layers:
        parser.error("--tune-teacher and --teacher-layers: one teacher or the other")
    if args.threads:
        torch.set_num_threads(args.threads)
    started = time.perf_counter()
    pack = Pack(args.pack)
    record: dict[str, Any] = {
        "pack": pack.meta["teacher"],
        "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
    }
    if args.tune_teacher:
        record["teacher_tune"] = tune_teacher(
            pack, TeacherTune(steps=args.tune_steps), args.work, args.device, args.tune_budget_s, args.bf16
        )
    elif args.teacher_layers:
        record["teacher_tune"] = lay_teacher(pack, args.teacher_layers)
        record["teacher_layers"] = str(args.teacher_layers)
    recipe = {
        "english_targets": args.english_targets,
        "task_weight": args.task_weight,
        "broad_batch_size": args.broad_batch,
        "lr": args.lr,
    }
    teachers = Teachers(pack, LiveConfig(**recipe), args.device, args.bf16)
    record["rotation_mean_cosine"] = round(fit_rotation(pack, teachers, args.rotation_texts, 0), 4)
    record["students"] = []
    for spec in args.student or [",".join(map(str, LiveConfig.layers))]:
        layers, _, budget = spec.partition(":")
        cfg = LiveConfig(layers=tuple(int(x) for x in layers.split(",")), steps=args.steps, **recipe)
        log(json.dumps(asdict(cfg)))
        budget_s = float(budget) if budget else None
        record["students"].append(train(pack, teachers, cfg, args.work, args.device, budget_s, args.bf16))
        record["minutes"] = round((time.perf_counter() - started) / 60, 1)
        (args.work / RUN_FILE).write_text(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
