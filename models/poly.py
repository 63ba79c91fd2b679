"""The poly-encoder head (Humeau et al., ICLR 2020) over the default encoder's token outputs.

    python -m models.poly                                 # -> artifacts/poly/poly.npz, figures.json
    python -m models.poly --contexts 512 --steps-grid 4 --out /tmp/poly   # a smoke run

m learned codes attend over the context's token outputs and give m context
vectors; each candidate's stored reply vector attends over those m vectors to
build its own context vector. The served score mixes that cosine with the
bi-encoder's, (1 - w) * bi + w * poly, over FAISS's top-k (`core/reranker.py`
is the numpy twin of `rescore` below; tests/test_rerank.py holds them equal).

The encoder stays frozen, so its token outputs for a fixed sample of training
contexts are computed once (the cost of the run on a CPU) and every step
trains only the head on them: the bundle's vectors, index and thresholds stay
the encoder's own. Each context's candidates are its batch's replies (in-batch
negatives) and `hard` replies drawn from the encoder's own top `hard_pool` for
it among the sample's replies of its language (what FAISS would hand the head),
its true reply and any reply spelled alike left out. Drawn from the top 50
rather than taken from the top 8: in chit-chat the very nearest are mostly
fitting replies too.

After training, w is chosen on half A of the human dev sets (the mean gain in
R@1 over both, reranking each context's top `depth` among every distinct
reply); half B is read only through the live API (`python -m bench.poly`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from core.bundle import open_bundle
from core.encoder import Encoder
from models.e5_pack import OUT as PACK
from models.e5_pack import Pack
from models.e5_weights import bert_body
from models.encoder import DualEncoder, mean_pool
from models.loop import run_steps
from models.teacher import tokeniser
from models.trained_layers import overlay, read_layers

OUT = Path("artifacts/poly")
POLY_FILE = "poly.npz"
FIGURES_FILE = "figures.json"
SAMPLES_FILE = "samples.pt"  # the cached token outputs: ~1 GB, reused by a rerun
DEFAULT_LAYERS = Path("models/release/multilingual-layers/layers.npz")  # the default bundle's tuned layers
DEFAULT_BUNDLE = Path("models/release/e5")
WEIGHTS = tuple(round(0.05 * i, 2) for i in range(21))  # the w grid chosen on half A
ENCODE_BATCH = 64


class PolyHead(nn.Module):
    def __init__(self, dim: int, codes: int) -> None:
        super().__init__()
        # Unit-variance codes, as the paper's embedding init: attention starts mildly peaked and
        # different per code. Tiny codes would start every vector as the same mean pool.
        self.codes = nn.Parameter(torch.randn(codes, dim))  # [m, H]
        self.project = nn.Linear(dim, dim)  # token space -> reply-vector space
        nn.init.eye_(self.project.weight)
        nn.init.zeros_(self.project.bias)
        self.mix = nn.Parameter(torch.tensor(-2.0))  # sigmoid(-2) = 0.12: mostly the bi-encoder at first

    @property
    def num_codes(self) -> int:
        return int(self.codes.shape[0])

    @property
    def weight(self) -> torch.Tensor:
        return torch.sigmoid(self.mix)

    def forward(self, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        # hidden: [B, T, H], attention_mask: [B, T] -> [B, m, H]
        logits = torch.einsum("mh,bth->bmt", self.codes, hidden) / hidden.shape[-1] ** 0.5  # [B, m, T]
        logits = logits.masked_fill(attention_mask[:, None, :] == 0, -1e4)
        attended = torch.einsum("bmt,bth->bmh", logits.softmax(dim=-1), hidden)  # [B, m, H]
        return self.project(attended)  # [B, m, H]


def poly_scores(vectors: torch.Tensor, replies: torch.Tensor) -> torch.Tensor:
    # vectors: [B, m, H], replies: [B, C, H] unit rows -> [B, C] cosines
    attention = torch.einsum("bch,bmh->bcm", replies, vectors).softmax(dim=-1)  # [B, C, m]
    context = torch.einsum("bcm,bmh->bch", attention, vectors)  # [B, C, H]
    return (F.normalize(context, dim=-1, eps=1e-12) * replies).sum(dim=-1)


def rescore(
    weight: torch.Tensor | float, bi: torch.Tensor, vectors: torch.Tensor, replies: torch.Tensor
) -> torch.Tensor:
    # bi: [B, C] bi-encoder cosines of the same candidates -> [B, C]
    return (1 - weight) * bi + weight * poly_scores(vectors, replies)


@dataclass(frozen=True)
class PolyConfig:
    codes: int = 16  # m: the paper's small setting; each is 1.5 kB of cache per context
    contexts: int = 24000  # training contexts whose token outputs are cached: ~15 min of fp32 on 2 cores
    korean_share: float = 0.25  # of `contexts`: the teacher's one Korean batch in four
    # Step counts tried, each its own schedule; half A chooses. A long run fits chit-chat's own
    # cues (its learned mix rose to 0.4) that do not carry to the human dev sets.
    steps_grid: tuple[int, ...] = (250, 1000, 3000)
    batch_size: int = 64
    hard: int = 8  # hard negatives a context, on top of the batch's replies
    hard_pool: int = 50  # drawn from this many of the encoder's nearest replies (FAISS's k)
    lr: float = 1e-3  # only the head learns, from a fresh start
    warmup_fraction: float = 0.05
    scale: float = 50.0  # as the encoder's own loss (models/teacher.py)
    depth: int = 50  # the top-k reranked when w is chosen: the service's rerank_top_k bound
    checkpoint_every: int = 500
    seed: int = 0


def encoder_model(pack: Pack, layers_path: Path) -> DualEncoder:
    """The default encoder in fp32: the package's weights under its tuned top layers."""
    model = DualEncoder(bert_body(overlay(pack.weights(), read_layers(layers_path)))).eval()
    model.requires_grad_(False)
    return model


@dataclass
class TokenCache:
    """Frozen token outputs of a sample of contexts, kept flat: row i is tokens[offsets[i]:offsets[i + 1]]."""

    tokens: torch.Tensor  # [total tokens, H] fp16
    offsets: np.ndarray  # [N + 1]
    vectors: torch.Tensor  # [N, H] unit: the bi-encoder's context vectors

    def batch(self, rows: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """[B, T, H] fp32 token outputs padded to the batch's longest, and their [B, T] mask."""
        lengths = [int(self.offsets[r + 1] - self.offsets[r]) for r in rows]
        hidden = torch.zeros(len(rows), max(lengths), self.tokens.shape[1])  # [B, T, H]
        mask = torch.zeros(len(rows), max(lengths), dtype=torch.long)  # [B, T]
        for i, (row, length) in enumerate(zip(rows, lengths, strict=True)):
            hidden[i, :length] = self.tokens[self.offsets[row] : self.offsets[row] + length].float()
            mask[i, :length] = 1
        return hidden, mask


@torch.no_grad()
def cache_contexts(model: DualEncoder, tok, contexts: list[str]) -> TokenCache:
    """Every context's token outputs (padding dropped) and its pooled vector, in length order."""
    order = sorted(range(len(contexts)), key=lambda i: len(contexts[i]))
    pieces: list[torch.Tensor | None] = [None] * len(contexts)
    vectors = torch.zeros(len(contexts), model.dim)  # [N, H]
    for start in range(0, len(order), ENCODE_BATCH):
        rows = order[start : start + ENCODE_BATCH]
        ids, mask = tok.contexts([contexts[i] for i in rows])  # [B, T] each
        hidden = model.hidden(ids, mask)  # [B, T, H]
        vectors[rows] = F.normalize(mean_pool(hidden, mask), dim=-1)
        for i, row in enumerate(rows):
            pieces[row] = hidden[i, mask[i].bool()].half()  # [T_i, H]
    lengths = [len(p) for p in pieces if p is not None]
    return TokenCache(torch.cat(pieces), np.concatenate([[0], np.cumsum(lengths)]), vectors)  # type: ignore[arg-type]


def encode_replies(served: Encoder, replies: list[str]) -> torch.Tensor:
    """[N, H] unit reply vectors as the bundle serves them (int8, through onnxruntime): what FAISS
    stores and the head attends with, at five times torch's fp32 rate on a CPU."""
    return torch.from_numpy(served.encode(replies, side="reply"))


@dataclass
class LanguageSample:
    """One language's sampled pairs: their cached contexts, reply vectors and hard-negative pools."""

    cache: TokenCache
    replies: torch.Tensor  # [N, H] unit
    near: np.ndarray  # [N, hard_pool] each context's nearest replies of the sample, its own spelling left out


def sample_language(
    model: DualEncoder, served: Encoder, tok, pack: Pack, names: tuple[str, ...], count: int, cfg: PolyConfig
) -> LanguageSample:
    spec = pack.meta["spec"]
    pairs = pack.pairs(names[0])
    for name in names[1:]:
        pairs = pairs + pack.pairs(name)
    rng = np.random.default_rng(cfg.seed)
    rows = sorted(rng.choice(len(pairs), min(count, len(pairs)), replace=False).tolist())
    contexts, replies = pairs.rows(rows)
    all_keys = pairs.reply_keys  # a property that normalises every reply: read it once
    keys = np.asarray([all_keys[r] for r in rows])
    started = time.perf_counter()
    cache = cache_contexts(model, tok, [spec["query_prefix"] + c for c in contexts])
    vectors = encode_replies(served, replies)  # [N, H]
    seconds = time.perf_counter() - started
    print(f"[poly] {'+'.join(names)}: {len(rows)} pairs encoded in {seconds:.0f}s", file=sys.stderr)
    near = np.zeros((len(rows), cfg.hard_pool), dtype=np.int64)
    for start in range(0, len(rows), 1024):
        scores = cache.vectors[start : start + 1024] @ vectors.T  # [b, N]
        top = scores.topk(cfg.hard_pool + 16, dim=1).indices.numpy()  # [b, hard_pool + 16]
        for i, candidates in enumerate(top):
            allowed = candidates[keys[candidates] != keys[start + i]][: cfg.hard_pool]
            near[start + i] = np.resize(allowed, cfg.hard_pool)  # a tiny sample may repeat some
    return LanguageSample(cache, vectors, near)


@dataclass
class DevSet:
    """Half A of one human dev set, encoded once: what every head's w is chosen on."""

    cache: TokenCache
    replies: torch.Tensor  # [N, H] unit
    bi: torch.Tensor  # [C, k] the bi-encoder's cosines of each context's top k
    top: torch.Tensor  # [C, k] their reply rows
    gold: list[list[int]]  # [C] the rows that are right for each context


def dev_half_a(model: DualEncoder, served: Encoder, tok, pack: Pack, depth: int) -> dict[str, DevSet]:
    spec = pack.meta["spec"]
    sets = {}
    for name, data in pack.texts()["dev_half_a"].items():
        replies = encode_replies(served, data["replies"])  # [N, H]
        cache = cache_contexts(model, tok, [spec["query_prefix"] + c for c in data["contexts"]])
        bi, top = (cache.vectors @ replies.T).topk(min(depth, len(replies)), dim=1)  # [C, k] each
        sets[name] = DevSet(cache, replies, bi, top, data["gold"])
    return sets


@torch.no_grad()
def r_at_1_by_weight(head: PolyHead, sets: dict[str, DevSet]) -> dict[str, dict[str, float]]:
    """name -> w -> R@1 over half A, each context's top k reranked."""
    table: dict[str, dict[str, float]] = {}
    for name, dev in sets.items():
        count = len(dev.top)
        vectors = torch.cat(
            [head(*dev.cache.batch(list(range(i, min(i + 128, count))))) for i in range(0, count, 128)]
        )  # [C, m, H]
        table[name] = {}
        for w in WEIGHTS:
            best = rescore(w, dev.bi, vectors, dev.replies[dev.top]).argmax(dim=1)  # [C]
            chosen = dev.top.gather(1, best[:, None])[:, 0].tolist()  # [C]
            table[name][str(w)] = round(sum(t in g for t, g in zip(chosen, dev.gold, strict=True)) / count, 4)
    return table


def mean_gain(table: dict[str, dict[str, float]], w: float) -> float:
    """The mean over the sets of R@1 at w less R@1 unreranked."""
    return float(np.mean([by_weight[str(w)] - by_weight["0.0"] for by_weight in table.values()]))


def cached_samples(
    model: DualEncoder, served: Encoder, tok, pack: Pack, cfg: PolyConfig, out: Path
) -> list[LanguageSample]:
    """English then Korean samples; kept in `out`, so a rerun (another step count) skips the encode."""
    key = {"contexts": cfg.contexts, "korean_share": cfg.korean_share, "seed": cfg.seed, "hard_pool": cfg.hard_pool,
           "bundle": served.manifest.checksum}  # fmt: skip
    path = out / SAMPLES_FILE
    if path.is_file():
        saved = torch.load(path, weights_only=False)
        if saved["key"] == key:
            return list(saved["samples"])
    korean = round(cfg.contexts * cfg.korean_share)
    samples = [
        sample_language(model, served, tok, pack, ("en", "persona-en"), cfg.contexts - korean, cfg),
        sample_language(model, served, tok, pack, ("ko", "persona-ko"), korean, cfg),
    ]
    out.mkdir(parents=True, exist_ok=True)
    torch.save({"key": key, "samples": samples}, path)
    return samples


def train_head(cfg: PolyConfig, samples: list[LanguageSample], steps: int, checkpoint: Path) -> tuple[PolyHead, dict]:
    """A head trained for `steps` (its own warmup and decay) on the cached samples."""
    torch.manual_seed(cfg.seed)
    head = PolyHead(samples[0].replies.shape[1], cfg.codes)
    korean_every = round(1 / cfg.korean_share) if cfg.korean_share > 0 else 0

    def batch_loss(step: int) -> torch.Tensor:
        sample = samples[1 if korean_every and step % korean_every == korean_every - 1 else 0]
        rng = np.random.default_rng((cfg.seed, step))
        size = len(sample.replies)
        rows = rng.choice(size, min(cfg.batch_size, size), replace=False).tolist()
        picks = rng.integers(0, cfg.hard_pool, (len(rows), cfg.hard))  # [B, hard]
        hard = sample.near[rows][np.arange(len(rows))[:, None], picks]  # [B, hard]
        hidden, mask = sample.cache.batch(rows)  # [B, T, H], [B, T]
        batch_replies = sample.replies[rows]  # [B, H]
        candidates = torch.cat(
            [batch_replies[None].expand(len(rows), -1, -1), sample.replies[torch.from_numpy(hard)]], dim=1
        )  # [B, B + hard, H]
        bi = torch.einsum("bh,bch->bc", sample.cache.vectors[rows], candidates)  # [B, B + hard]
        scores = rescore(head.weight, bi, head(hidden, mask), candidates)  # [B, B + hard]
        return F.cross_entropy(cfg.scale * scores, torch.arange(len(rows)))

    optimizer = torch.optim.AdamW(head.parameters(), lr=cfg.lr, weight_decay=0.01)
    stats = run_steps(
        "poly", {"head": head}, optimizer, steps, cfg.warmup_fraction, batch_loss, checkpoint, cfg.checkpoint_every
    )
    return head.eval(), stats


def train(cfg: PolyConfig, pack: Pack, layers_path: Path, bundle: Path, out: Path) -> dict[str, object]:
    """One head per step count of `steps_grid`; the (steps, w) with the largest mean half-A gain is kept."""
    model = encoder_model(pack, layers_path)
    served = Encoder(bundle, open_bundle(bundle))
    tok = tokeniser(pack)
    started = time.perf_counter()
    samples = cached_samples(model, served, tok, pack, cfg, out)
    dev = dev_half_a(model, served, tok, pack, cfg.depth)
    encoded_s = time.perf_counter() - started
    runs: dict[str, dict[str, object]] = {}
    best: tuple[float, int, float, PolyHead] | None = None
    for steps in cfg.steps_grid:
        head, stats = train_head(cfg, samples, steps, out / f"steps-{steps}" / "checkpoint.pt")
        table = r_at_1_by_weight(head, dev)
        w = max(WEIGHTS, key=lambda x: (round(mean_gain(table, x), 6), -x))
        gain = round(mean_gain(table, w), 6)
        runs[str(steps)] = {"train": stats, "learned_mix": round(float(head.weight.detach()), 4), "weight": w,
                            "mean_gain": gain, "half_a_r_at_1_by_weight": table}  # fmt: skip
        print(f"[poly] {steps} steps: w = {w}, mean half-A gain {gain:+.4f}", file=sys.stderr, flush=True)
        if best is None or gain > best[0]:  # ties keep the shorter run
            best = (gain, steps, w, head)
    assert best is not None
    gain, steps, weight, head = best
    np.savez(
        out / POLY_FILE,
        codes=head.codes.detach().numpy(),  # [m, H]
        project_weight=head.project.weight.detach().numpy(),  # [H, H]
        project_bias=head.project.bias.detach().numpy(),  # [H]
        weight=np.float32(weight),  # the served w, chosen on half A
    )
    figures: dict[str, object] = {
        "config": asdict(cfg),
        "encoder": str(layers_path),
        "bundle": str(bundle),
        "chosen": {"steps": steps, "weight": weight, "mean_half_a_gain": gain},
        "runs": runs,
        "encode_s": round(encoded_s, 1),
    }
    (out / FIGURES_FILE).write_text(json.dumps(figures, indent=2))
    return figures


def load_head(path: Path) -> tuple[PolyHead, float]:
    """A trained head from poly.npz, and its chosen w."""
    with np.load(path) as archive:
        codes = torch.from_numpy(archive["codes"])
        head = PolyHead(codes.shape[1], codes.shape[0])
        head.codes.data.copy_(codes)
        head.project.weight.data.copy_(torch.from_numpy(archive["project_weight"]))
        head.project.bias.data.copy_(torch.from_numpy(archive["project_bias"]))
        return head.eval(), round(float(archive["weight"]), 4)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pack", type=Path, default=PACK)
    parser.add_argument("--encoder", type=Path, default=DEFAULT_LAYERS, help="the tuned layers' layers.npz")
    parser.add_argument("--bundle", type=Path, default=DEFAULT_BUNDLE, help="the bundle those layers built")
    parser.add_argument("--out", type=Path, default=OUT)
    defaults = PolyConfig()
    for name, value in asdict(defaults).items():
        flag = f"--{name.replace('_', '-')}"
        if isinstance(value, tuple):
            parser.add_argument(flag, type=int, nargs="+", default=value)
        else:
            parser.add_argument(flag, type=type(value), default=value)
    args = parser.parse_args()
    cfg = PolyConfig(**{name: getattr(args, name) for name in asdict(defaults)})
    cfg = replace(cfg, steps_grid=tuple(cfg.steps_grid))
    print(json.dumps(train(cfg, Pack(args.pack), args.encoder, args.bundle, args.out), indent=2))


if __name__ == "__main__":
    main()
