"""The per-turn way's combiner for a bundle (core/context.py), trained on the bundle's own turn vectors.

    python -m models.combiner --bundle models/release/e5 --out artifacts/bundles/e5-per-turn
    python -m models.combiner --bundle models/release/e5 --sweep            # the choices, on half A
    python -m models.combiner --check artifacts/bundles/e5-per-turn --release models/release/e5

1. Every distinct turn of the training conversations is encoded once on each side by the bundle
   itself (the int8 graph the service runs), and cached under artifacts/combiner/ by the bundle's
   checksum: about 15 minutes on 2 cores, resumable chunk by chunk. The dev sets' turns likewise.
2. The combiner learns, with in-batch negatives, to make from the newest N turn vectors of a
   context the vector that finds its reply among the others' (seconds a variant).
3. `--sweep` prints half-A R@1 of the human dev sets and chitchat test for each variant;
   CombinerConfig holds the one chosen. Half B is printed beside, never chosen on.
4. `--out` writes the bundle with its combiner: the source's files, COMBINER_FILE, and its
   manifest, whose joined-way calibration is kept under `joined`. Its index and calibration
   follow (`make train-combiner`).

The frozen encoder computes the same vectors every run, so the cache is what makes a variant cheap.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import math
import shutil
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from core.bundle import (
    COMBINER_FILE,
    FORMAT_VERSION,
    BundleManifest,
    CombinerSpec,
    JoinedWay,
    open_bundle,
    seal,
    write_manifest,
)
from core.context import LENGTH_SCALE, Combiner
from core.encoder import Encoder, Side
from core.files import staged_dir
from core.text import normalize
from index.corpus import MAX_CANDIDATE_CHARS, load_conversations, split_of
from models.evalset import eval_set
from models.hardware import hardware
from models.ood import half as half_of
from models.ood import held_out_keys, human_set
from models.written_korean import TRANSLATED, WRITTEN, written_conversations

ROOT = Path(__file__).resolve().parents[2]
WORK = ROOT / "artifacts" / "combiner"
SHARED_TRAIN = ROOT.parent / "shared" / "data" / "train"
MAX_TURNS = 8  # the most turns a variant reads: what the cache's pairs keep
CHUNK = 4096  # texts encoded between two saves of the cache


@dataclass
class CombinerConfig:
    # The variant with the best mean half-A R@1 over Topical-Chat, ChatbotData and chitchat test
    # (`--sweep`; docs/experiments.md). Its figures are in the bundle's manifest (`combiner.training`).
    turns: int = 8  # N: the dev files' contexts hold at most 3 turns, chitchat's more; 8 read best on its half A
    other_side: str = "reply"  # the bot's turns read as stored replies: from the index, no encoder pass
    head: bool = True  # the residual [D, D] map after the gated sum: +0.03 on chitchat half A at N = 3
    epochs: int = 8
    batch_size: int = 512  # in-batch negatives
    gate_lr: float = 0.03
    # The head is 148k weights over ~140k pairs: a gentle rate is what keeps it from fitting chitchat
    # (on the cached vectors, 1e-3 lost 0.01 on Topical-Chat half A where 1e-4 kept it).
    head_lr: float = 1e-4
    scale: float = 50.0  # the logits' starting scale, learned
    seed: int = 0


# ---- data: conversations, and every distinct turn's vectors on both sides --------------------------


def conversations() -> dict[str, list[list[str]]]:
    """source -> conversations (turns, oldest first) the combiner trains on: chitchat's train
    split, PersonaChat in English and in translation, our Korean. A turn equal to a line of a dev
    or evaluation set (chatterbot's "hi" among them) cuts its conversation there: no pair reads it."""
    held_out = held_out_keys()

    def clean(convs: list[list[str]]) -> list[list[str]]:
        pieces = []
        for c in convs:
            piece: list[str] = []
            for t in (t for t in c if t.strip()):
                if normalize(t) in held_out:
                    pieces.append(piece)
                    piece = []
                else:
                    piece.append(t)
            pieces.append(piece)
        return [p for p in pieces if len(p) >= 2]

    def persona(name: str) -> list[list[str]]:
        with gzip.open(SHARED_TRAIN / name, "rt", encoding="utf-8") as f:
            return [json.loads(line)["turns"] for line in f if line.strip()]

    return {
        "chitchat": clean([list(c.turns) for c in load_conversations() if split_of(c.id) == "train"]),
        "persona-en": clean(persona("xpersona_en.jsonl.gz")),
        "persona-ko": clean(persona("xpersona_ko_translated.jsonl.gz")),
        "ko": clean(written_conversations(WRITTEN) + written_conversations(TRANSLATED)),
    }


@dataclass
class Pairs:
    """(context, reply) pairs as rows of a text table: each context's newest MAX_TURNS turns."""

    turns: np.ndarray  # [P, MAX_TURNS] int32 text rows, newest first, -1 past the oldest
    replies: np.ndarray  # [P] int32 text rows
    sources: list[str]  # [P]


def pairs_of(convs: dict[str, list[list[str]]], row: dict[str, int]) -> Pairs:
    turns, replies, sources = [], [], []
    for source, those in convs.items():
        for c in those:
            for i in range(1, len(c)):
                if len(c[i]) > MAX_CANDIDATE_CHARS:
                    continue
                recent = [row[t] for t in reversed(c[max(0, i - MAX_TURNS) : i])]
                turns.append(recent + [-1] * (MAX_TURNS - len(recent)))
                replies.append(row[c[i]])
                sources.append(source)
    return Pairs(np.array(turns, dtype=np.int32), np.array(replies, dtype=np.int32), sources)


def cached_vectors(encoder: Encoder, texts: list[str], path: Path) -> dict[Side, np.ndarray]:
    """side -> [T, D] float16 vectors of `texts` on that side, in their order. The cache at `path`
    keeps every text it was ever asked for, so another set of texts encodes only what it lacks; it is
    saved chunk by chunk (shortest texts first, so that a chunk batches like lengths), so a stopped
    run resumes where it was."""
    cached: list[str] = []
    stored = {side: np.zeros((0, encoder.dim), dtype=np.float16) for side in ("context", "reply")}
    if path.is_file():
        with np.load(path) as z:
            cached = bytes(z["texts"]).decode("utf-8").split("\0") if len(z["texts"]) else []
            stored = {"context": z["context"], "reply": z["reply"]}
    row = {t: i for i, t in enumerate(cached)}
    missing = sorted({t for t in texts if t not in row}, key=len)
    started = time.perf_counter()
    for start in range(0, len(missing), CHUNK):
        chunk = missing[start : start + CHUNK]
        fresh = {side: encoder.encode(chunk, side).astype(np.float16) for side in ("context", "reply")}  # type: ignore[arg-type]
        stored = {side: np.concatenate([stored[side], fresh[side]]) for side in stored}
        row.update((t, len(cached) + i) for i, t in enumerate(chunk))
        cached += chunk
        blob = np.frombuffer("\0".join(cached).encode("utf-8"), dtype=np.uint8)
        partial = path.with_suffix(".partial.npz")
        np.savez(partial, texts=blob, context=stored["context"], reply=stored["reply"])
        partial.replace(path)
        rate = (start + len(chunk)) / max(time.perf_counter() - started, 1e-9)
        print(
            f"[combiner] encoded {start + len(chunk):,} of {len(missing):,} new texts, both sides ({rate:.0f}/s)",
            flush=True,
        )
    rows = np.array([row[t] for t in texts], dtype=np.int64)
    return {"context": stored["context"][rows], "reply": stored["reply"][rows]}


# ---- the model: the numpy Combiner's twin in torch ------------------------------------------------


class TorchCombiner(nn.Module):
    """core.context.Combiner's arithmetic, trainable."""

    def __init__(self, config: CombinerConfig, dim: int) -> None:
        super().__init__()
        n = config.turns
        # The newest turn starts at e^2 ≈ 7 times the weight of each other: the last-turn answer.
        self.gate_bias = nn.Parameter(torch.tensor([2.0] + [0.0] * (n - 1)))
        self.gate_newest = nn.Parameter(torch.zeros(n))
        self.gate_own = nn.Parameter(torch.zeros(n))
        self.head = nn.Parameter(torch.zeros(dim, dim), requires_grad=config.head)
        self.head_bias = nn.Parameter(torch.zeros(dim), requires_grad=config.head)

    def forward(self, vectors: torch.Tensor, lengths: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
        # vectors [B, N, D] newest first; lengths, present [B, N] -> [B, D] unit
        gates = torch.exp(self.gate_bias + self.gate_newest * lengths[:, :1] + self.gate_own * lengths) * present
        pooled = F.normalize((gates[..., None] * vectors).sum(1), dim=-1)  # [B, D]
        return F.normalize(pooled + pooled @ self.head + self.head_bias, dim=-1)

    def export(self, reply_side: np.ndarray) -> Combiner:
        def a(p: torch.Tensor) -> np.ndarray:
            return np.asarray(p.detach().numpy(), dtype=np.float32)

        return Combiner(
            a(self.gate_bias), a(self.gate_newest), a(self.gate_own), a(self.head), a(self.head_bias), reply_side
        )


def reply_side(config: CombinerConfig) -> np.ndarray:
    """[N] the positions read on the reply side: the other speaker's, where the config says so."""
    return np.array([p % 2 == 1 and config.other_side == "reply" for p in range(config.turns)])


class Table:
    """The cached vectors as torch, and a batch of contexts gathered from them."""

    def __init__(self, texts: list[str], vectors: dict[Side, np.ndarray]) -> None:
        self.context = torch.from_numpy(vectors["context"].astype(np.float32))  # [T, D]
        self.reply = torch.from_numpy(vectors["reply"].astype(np.float32))  # [T, D]
        self.lengths = torch.tensor([math.log1p(len(t)) / LENGTH_SCALE for t in texts])  # [T]

    def contexts(self, rows: np.ndarray, sides: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """rows [B, N] (newest first, -1 absent), sides [N] (True: reply side) -> vectors, lengths, present."""
        index = torch.from_numpy(np.maximum(rows, 0).astype(np.int64))  # [B, N]
        present = torch.from_numpy((rows >= 0).astype(np.float32))  # [B, N]
        on_reply = torch.from_numpy(sides)[None, :, None]  # [1, N, 1]
        vectors = torch.where(on_reply, self.reply[index], self.context[index])  # [B, N, D]
        return vectors, self.lengths[index] * present, present


def train(config: CombinerConfig, table: Table, pairs: Pairs, keys: list[str]) -> tuple[TorchCombiner, dict[str, Any]]:
    """The combiner after `config.epochs` passes over `pairs` (keys: [T] the normalised texts, so that
    a reply equal to another in the batch is not its negative)."""
    torch.manual_seed(config.seed)
    model = TorchCombiner(config, table.context.shape[1])
    scale = nn.Parameter(torch.tensor(math.log(config.scale)))
    gates = [model.gate_bias, model.gate_newest, model.gate_own, scale]
    groups: list[dict[str, Any]] = [{"params": gates, "lr": config.gate_lr}]
    if config.head:
        groups.append({"params": [model.head, model.head_bias], "lr": config.head_lr})
    optimizer = torch.optim.AdamW(groups, weight_decay=0.0)
    sides = reply_side(config)
    rows = pairs.turns[:, : config.turns]
    id_of: dict[str, int] = {}
    key_ids = np.array([id_of.setdefault(k, len(id_of)) for k in keys], dtype=np.int64)[pairs.replies]  # [P]
    rng = np.random.default_rng(config.seed)
    losses, started = [], time.perf_counter()
    for _ in range(config.epochs):
        order = rng.permutation(len(rows))
        for start in range(0, len(order) - config.batch_size + 1, config.batch_size):
            batch = order[start : start + config.batch_size]
            vectors, lengths, present = table.contexts(rows[batch], sides)
            context = model(vectors, lengths, present)  # [B, D]
            replies = table.reply[torch.from_numpy(pairs.replies[batch].astype(np.int64))]  # [B, D]
            logits = scale.exp() * context @ replies.T  # [B, B]
            same = torch.from_numpy(key_ids[batch][:, None] == key_ids[batch][None, :])  # [B, B]
            logits = logits.masked_fill(same & ~torch.eye(len(batch), dtype=torch.bool), float("-inf"))
            loss = F.cross_entropy(logits, torch.arange(len(batch)))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(float(loss))
    figures = {
        "steps": len(losses),
        "seconds": round(time.perf_counter() - started, 1),
        "first_loss": round(float(np.mean(losses[:20])), 4),
        "final_loss": round(float(np.mean(losses[-20:])), 4),
        "scale": round(float(scale.exp()), 2),
    }
    return model, figures


# ---- the dev sets, half A and half B --------------------------------------------------------------


@dataclass
class DevSet:
    name: str
    windows: list[list[str]]  # [C] turns, oldest first
    candidates: list[str]  # [R] the replies every context is scored against
    gold: (
        list[set[int]] | np.ndarray
    )  # [C] rows of `candidates` that are right; chitchat: [C, 100] rows, the right one first
    halves: np.ndarray  # [C] "A" / "B"


def dev_sets() -> list[DevSet]:
    """Topical-Chat valid and ChatbotData (1 of all their replies, as `bench.ood` asks the live API),
    chitchat test (1 of 100, as `bench.encoders`), with the turns before each context the dev
    files keep (at most 3) or chitchat's (up to MAX_TURNS); halves by the last 3 turns, as theirs."""
    sets = []
    for name in ("topical_chat_valid", "chatbotdata_ko_dev"):
        data = human_set(name)
        row = {normalize(r): i for i, r in enumerate(data.replies)}
        gold = [{row[g] for g in golds if g in row} for golds in data.gold]
        sets.append(DevSet(name, [list(c) for c in data.contexts], data.replies, gold, np.array(data.halves)))
    longer = eval_set(2000, split="test", max_context_turns=MAX_TURNS)  # the same turns, with more before them
    halves = np.array([half_of(tuple(c[-3:])) for c in longer.contexts])
    sets.append(DevSet("chitchat_test", longer.contexts, longer.replies, longer.candidates, halves))
    return sets


def r_at_1(dev: DevSet, context: np.ndarray, replies: np.ndarray) -> dict[str, float]:
    """context [C, D], replies [R, D] -> R@1 on each half."""
    if isinstance(dev.gold, np.ndarray):  # 1 of 100: the first column is the right reply
        candidates = replies[dev.gold]  # [C, 100, D]
        scores = np.einsum("cd,ckd->ck", context, candidates)  # [C, 100]
        hit = (scores[:, 1:] <= scores[:, :1]).all(axis=1)  # [C] strict: a tie does not push it down
    else:
        top = np.argmax(context @ replies.T, axis=1)  # [C]
        hit = np.array([int(t) in g for t, g in zip(top, dev.gold, strict=True)])
    return {h: round(float(hit[dev.halves == h].mean()), 4) for h in ("A", "B") if (dev.halves == h).any()}


def windows_as_rows(dev: DevSet, row: dict[str, int]) -> np.ndarray:
    """[C, MAX_TURNS] text rows of each window, newest first, -1 past the oldest."""
    out = np.full((len(dev.windows), MAX_TURNS), -1, dtype=np.int32)
    for i, w in enumerate(dev.windows):
        recent = [row[t] for t in reversed(w[-MAX_TURNS:])]
        out[i, : len(recent)] = recent
    return out


def judged(combiner: Combiner, table: Table, devs: list[DevSet], row: dict[str, int]) -> dict[str, dict[str, float]]:
    """Each dev set's R@1 per half, with the numpy combiner the service runs."""
    out = {}
    context_np, reply_np = table.context.numpy(), table.reply.numpy()
    for dev in devs:
        rows = windows_as_rows(dev, row)[:, : combiner.turns]  # [C, N]
        vectors = np.where(
            combiner.reply_side[None, :, None], reply_np[np.maximum(rows, 0)], context_np[np.maximum(rows, 0)]
        )
        vectors = vectors * (rows >= 0)[..., None]  # [C, N, D]
        context = combiner.combine_many(vectors.astype(np.float32), dev.windows)
        replies = reply_np[[row[r] for r in dev.candidates]]  # [R, D]
        out[dev.name] = r_at_1(dev, context, replies)
    return out


def joined_figures(encoder: Encoder, devs: list[DevSet]) -> dict[str, dict[str, float]]:
    """The joined way on the same dev sets: what the combiner is held against."""
    out = {}
    for dev in devs:
        context = encoder.contexts(dev.windows, joined=True)
        out[dev.name] = r_at_1(dev, context, encoder.encode(dev.candidates, "reply"))
    return out


# ---- the run -------------------------------------------------------------------------------------


# What `--sweep` tries, each for SWEEP_EPOCHS unless it says otherwise; the last is CombinerConfig.
SWEEP_EPOCHS = 4
SWEEP = [
    {"turns": 1, "head": False},
    {"turns": 2},
    {"turns": 3, "head": False},
    {"turns": 3, "other_side": "context", "head": False},
    {"turns": 3, "other_side": "context"},
    {"turns": 3},
    {"turns": 3, "head_lr": 3e-4},
    {"turns": 3, "head_lr": 3e-5},
    {"turns": 4},
    {"turns": 6},
    {"turns": 8, "head_lr": 3e-4},
    {"turns": 8, "other_side": "context"},
    {"turns": 8},
    {"turns": 8, "epochs": 8},
]


def cache_path(manifest: BundleManifest, stem: str) -> Path:
    """Where `cached_vectors` keeps a bundle's vectors of one set of texts. Named by what makes a
    vector, the graph and the tokenizer, not by the checksum, which a new combiner changes: a
    rebuild from a bundle that has one reads the same cache."""
    made_by = hashlib.sha256(f"{manifest.files['encoder.onnx']}:{manifest.files['tokenizer.json']}".encode())
    WORK.mkdir(parents=True, exist_ok=True)
    return WORK / f"{stem}-{made_by.hexdigest()[:16]}.npz"


def load(bundle: Path) -> tuple[Encoder, list[str], dict[str, int], Table, Pairs, list[DevSet]]:
    manifest = open_bundle(bundle)
    encoder = Encoder(bundle, manifest)
    convs = conversations()
    devs = dev_sets()
    texts = sorted(
        {t for cs in convs.values() for c in cs for t in c}
        | {t for d in devs for w in d.windows for t in w}
        | {t for d in devs for t in d.candidates}
    )
    row = {t: i for i, t in enumerate(texts)}
    started = time.perf_counter()
    vectors = cached_vectors(encoder, texts, cache_path(manifest, "vectors"))
    print(f"[combiner] {len(texts):,} texts' vectors ready in {time.perf_counter() - started:.0f} s", flush=True)
    return encoder, texts, row, Table(texts, vectors), pairs_of(convs, row), devs


def main() -> None:
    args = _arguments()
    if args.check:
        sys.exit(check(args.check, args.release))
    started = time.perf_counter()
    machine = hardware("cpu")
    # fp32 throughout: the combiner is 150k weights, a pass over its cached vectors takes seconds, and
    # the cache is made by the int8 bundle the service runs, not by torch.
    print(f"[combiner] on {machine['cpu']} ({machine['cores']} cores, VNNI {machine['vnni']}), fp32", flush=True)
    encoder, texts, row, table, pairs, devs = load(args.bundle)
    keys = [normalize(t) for t in texts]
    print(
        f"[combiner] {len(pairs.replies):,} pairs: "
        + json.dumps({s: pairs.sources.count(s) for s in dict.fromkeys(pairs.sources)})
    )
    print("[combiner] joined: " + json.dumps(joined_figures(encoder, devs)), flush=True)
    sweep = [replace(CombinerConfig(), **{"epochs": SWEEP_EPOCHS, **v}) for v in SWEEP]
    configs = sweep if args.sweep else [CombinerConfig()]
    results = []
    for config in configs:
        model, figures = train(config, table, pairs, keys)
        combiner = model.export(reply_side(config))
        dev = judged(combiner, table, devs, row)
        mean_a = round(float(np.mean([d["A"] for d in dev.values()])), 4)
        results.append({"config": asdict(config), "train": figures, "dev": dev, "mean_half_a": mean_a})
        print("[combiner] " + json.dumps(results[-1]), flush=True)
    total = round(time.perf_counter() - started, 1)
    print(f"[combiner] {total} s in all, the vector cache included", flush=True)
    if args.out:
        write_bundle(args.bundle, args.out, combiner, configs[-1], results[-1], total)


def write_bundle(
    source: Path,
    out: Path,
    combiner: Combiner,
    config: CombinerConfig,
    result: dict[str, Any],
    seconds: float,
) -> None:
    """`source`'s files with the combiner beside them; the joined way's calibration kept under `joined`."""
    manifest = open_bundle(source)
    with staged_dir(out) as staging:
        for f in source.iterdir():
            if f.is_file():
                shutil.copy2(f, staging / f.name)
        combiner.save(staging / COMBINER_FILE)
        training = {
            "recipe": "models/combiner.py (CombinerConfig)",
            "config": asdict(config),
            "train": result["train"],
            "half_a_b": result["dev"],
            "seconds": seconds,
            "hardware": hardware("cpu"),
            "data": "chitchat train, PersonaChat EN and KO, our Korean: every distinct turn's vectors by this bundle",
        }
        joined = manifest.joined or JoinedWay(manifest.thresholds, manifest.confidence, manifest.calibration)
        written = replace(
            manifest,
            name=f"{manifest.name}-per-turn" if not manifest.name.endswith("-per-turn") else manifest.name,
            combiner=CombinerSpec(config.turns, config.other_side, training),
            joined=joined,
            format_version=FORMAT_VERSION,
            release={},
        )
        write_manifest(staging, seal(staging, written))
    print(f"[combiner] wrote {out}", flush=True)


def check(candidate: Path, release: Path, tolerance: float = 0.01) -> int:
    """0 if the rebuilt combiner's half-A figures are within `tolerance` of the release's: what
    `make train-combiner` holds a rebuild to.

    Both combiners are judged here, on this CPU's cached vectors. The int8 graph's vectors differ a
    little from one CPU to the next (VNNI or not), and that moved the same combiner's half A by 0.01
    against the figures its manifest recorded elsewhere: a check against those would judge the CPU."""
    got, want = open_bundle(candidate).combiner, open_bundle(release).combiner
    if got is None or want is None:
        print("[combiner] both bundles need a combiner", file=sys.stderr)
        return 2
    _, _, row, table, _, devs = load(candidate)
    rebuilt = judged(Combiner.load(candidate / COMBINER_FILE), table, devs, row)
    tracked = judged(Combiner.load(release / COMBINER_FILE), table, devs, row)
    worst = 0.0
    for name, halves in tracked.items():
        delta = abs(rebuilt[name]["A"] - halves["A"])
        worst = max(worst, delta)
        recorded = want.training["half_a_b"].get(name, {}).get("A")
        print(
            f"[combiner] {name} half A: rebuilt {rebuilt[name]['A']:.4f}, tracked {halves['A']:.4f} here"
            f" ({recorded} where it was trained)"
        )
    print(f"[combiner] largest difference {worst:.4f} (tolerance {tolerance})")
    return 0 if worst <= tolerance else 1


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bundle", type=Path, default=ROOT / "models" / "release" / "e5")
    parser.add_argument("--out", type=Path, help="write the bundle with its combiner here")
    parser.add_argument("--sweep", action="store_true", help="train every SWEEP variant and print its figures")
    parser.add_argument("--check", type=Path, help="a rebuilt bundle to hold to --release")
    parser.add_argument("--release", type=Path, default=ROOT / "models" / "release" / "e5")
    return parser.parse_args()


if __name__ == "__main__":
    main()
