"""The poly-encoder head (Humeau et al., ICLR 2020) over the serving encoder's token outputs.

    python -m models.poly --encoder artifacts/student/layers.npz --device cuda
                                              # -> artifacts/poly/poly.npz, figures.json
    python -m models.poly --steps 2 --out /tmp/poly             # a smoke run on the CPU

m learned codes attend over the context's token outputs and give m context
vectors; each candidate's stored reply vector attends over those m vectors to
build its own context vector. The served score mixes that cosine with the
bi-encoder's, (1 - w) * bi + w * poly, over FAISS's top-k (`core/reranker.py`
is the numpy twin of `rescore` below; tests/test_rerank.py holds them equal).

The encoder stays frozen: the head learns on its token outputs, so the bundle's
vectors, index and thresholds are the encoder's own. Each step's candidates
for a context are the batch's replies (in-batch negatives) and `hard`
replies drawn from the encoder's own top `hard_pool` for it over every
training reply of its language (what FAISS would hand the head), its true
reply and any reply spelled alike left out. Drawn from the top 50 rather than
taken from the top 8: in chit-chat the very nearest are mostly fitting replies too.

After training, w is chosen on half A of the human dev sets (the gain in R@1
over both, reranking each context's top `depth` among every distinct reply);
half B is read only through the live API (`python -m bench.poly`).
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
from torch import nn

from models.e5_pack import OUT as PACK
from models.e5_pack import Pack
from models.e5_weights import bert_body, keep_layers
from models.encoder import DualEncoder, mean_pool
from models.loop import run_steps
from models.teacher import PairBatches, autocast, tokeniser
from models.trained_layers import read_layers
from models.validate import encode

OUT = Path("artifacts/poly")
POLY_FILE = "poly.npz"
FIGURES_FILE = "figures.json"
WEIGHTS = tuple(round(0.05 * i, 2) for i in range(21))  # the w grid chosen on half A


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
    steps: int = 3000
    batch_size: int = 64
    hard: int = 8  # hard negatives a context, on top of the batch's replies
    hard_pool: int = 50  # drawn from this many of the encoder's nearest replies (FAISS's k)
    lr: float = 1e-3  # only the head learns: ~0.15M parameters from a fresh start
    warmup_fraction: float = 0.05
    scale: float = 50.0  # as the encoder's own loss (models/teacher.py)
    depth: int = 50  # the top-k reranked when w is chosen: the service's rerank_top_k bound
    length_group: int = 16
    korean_every: int = 4
    checkpoint_every: int = 500
    seed: int = 0
    # The step count the shipped run's time budget cut `steps` to (models/loop.py: run_steps), at
    # the same step: a rebuild follows the shipped schedule on any machine. 0: run `steps`, or
    # what --budget-s fits.
    probed_total: int = 165


def encoder_model(pack: Pack, layers_path: Path, device: str) -> DualEncoder:
    """The serving encoder: a student's layers.npz (6 layers) or a teacher's (its top layers over the package's)."""
    from models.trained_layers import overlay

    weights = pack.weights()
    layers = read_layers(layers_path)
    count = len({n.split(".")[2] for n in layers if n.startswith("encoder.layer.")})
    if count < weights.shape.layers and "encoder.layer.0.output.dense.weight" in layers:
        weights = keep_layers(weights, tuple(range(count)))  # a student: every layer is in the file
    model = DualEncoder(bert_body(overlay(weights, layers))).to(device).eval()
    model.requires_grad_(False)
    return model


def choose_weight(
    model: DualEncoder, head: PolyHead, pack: Pack, depth: int, device: str
) -> tuple[float, dict[str, dict[str, float]]]:
    """The w of the grid with the largest mean R@1 gain over half A of the human dev sets."""
    tok = tokeniser(pack)
    spec = pack.meta["spec"]
    table: dict[str, dict[str, float]] = {}
    for name, data in pack.texts()["dev_half_a"].items():
        contexts = [spec["query_prefix"] + c for c in data["contexts"]]
        replies = encode(model, tok, [spec["passage_prefix"] + r for r in data["replies"]], "reply")  # [N, D]
        context = encode(model, tok, contexts, "context")  # [C, D]
        bi, top = (context @ replies.T).topk(min(depth, len(replies)), dim=1)  # [C, k] each
        vectors = torch.cat(
            [poly_vectors(model, head, tok, contexts[i : i + 128], device) for i in range(0, len(contexts), 128)]
        )
        scores = {w: rescore(w, bi, vectors, replies[top]).argmax(dim=1) for w in WEIGHTS}  # w -> [C]
        chosen = {w: top.gather(1, s[:, None])[:, 0].tolist() for w, s in scores.items()}
        table[name] = {
            str(w): round(sum(t in g for t, g in zip(rows, data["gold"], strict=True)) / len(rows), 4)
            for w, rows in chosen.items()
        }
    gains = {w: float(np.mean([table[n][str(w)] - table[n]["0.0"] for n in table])) for w in WEIGHTS}
    best = max(WEIGHTS, key=lambda w: (round(gains[w], 6), -w))
    return best, table


@torch.no_grad()
def poly_vectors(model: DualEncoder, head: PolyHead, tok, contexts: list[str], device: str) -> torch.Tensor:
    ids, mask = (t.to(device) for t in tok.contexts(contexts))
    return head(model.hidden(ids, mask).float(), mask)  # [B, m, H]


def train(
    cfg: PolyConfig, pack: Pack, layers_path: Path, out: Path, device: str, budget_s: float | None
) -> dict[str, object]:
    torch.manual_seed(cfg.seed)
    model = encoder_model(pack, layers_path, device)
    head = PolyHead(model.dim, cfg.codes).to(device)
    tok = tokeniser(pack)
    spec = pack.meta["spec"]
    batches = PairBatches(pack, cfg.batch_size, cfg.length_group, cfg.korean_every, cfg.seed)
    started = time.perf_counter()
    # Every training reply's vector, per language: the pool hard negatives come from.
    pools = {}
    for pairs in (batches.english, batches.korean):
        pools[id(pairs)] = encode(
            model, tok, [spec["passage_prefix"] + r for r in pairs.replies], "reply"
        ).half()  # [N, D]
    encoded_s = time.perf_counter() - started

    def batch_loss(step: int) -> torch.Tensor:
        pairs, rows = batches.rows(step)
        contexts, _ = pairs.rows(rows)
        keys = pairs.reply_keys
        pool = pools[id(pairs)]  # [N, D]
        ids, mask = (t.to(device) for t in tok.contexts([spec["query_prefix"] + c for c in contexts]))
        with torch.no_grad(), autocast(device):
            hidden = model.hidden(ids, mask)  # [B, T, H]
        hidden = hidden.float()
        context = F.normalize(mean_pool(hidden, mask), dim=-1)  # [B, H]: the bi-encoder's context vector
        near = (context.half() @ pool.T).topk(cfg.hard_pool, dim=1).indices.tolist()  # [B, hard_pool]
        rng = np.random.default_rng((cfg.seed, step))
        hard = []
        for row, candidates in zip(rows, near, strict=True):
            allowed = [c for c in candidates if keys[c] != keys[row]]
            hard.append([allowed[i] for i in rng.choice(len(allowed), cfg.hard, replace=len(allowed) < cfg.hard)])
        batch_replies = pool[torch.tensor(rows, device=device)].float()  # [B, H]
        hard_replies = pool[torch.tensor(hard, device=device)].float()  # [B, hard, H]
        candidates = torch.cat([batch_replies[None].expand(len(rows), -1, -1), hard_replies], dim=1)  # [B, B + hard, H]
        bi = torch.einsum("bh,bch->bc", context, candidates)  # [B, B + hard]
        scores = rescore(head.weight, bi, head(hidden, mask), candidates)  # [B, B + hard]
        return F.cross_entropy(cfg.scale * scores, torch.arange(len(rows), device=device))

    optimizer = torch.optim.AdamW(head.parameters(), lr=cfg.lr, weight_decay=0.01)
    stats = run_steps(
        "poly", {"head": head}, optimizer, cfg.steps, cfg.warmup_fraction, batch_loss,
        out / "checkpoint.pt", cfg.checkpoint_every,
        budget_s=float("inf") if cfg.probed_total and budget_s is None else budget_s,
        probed_total=cfg.probed_total or None,
    )  # fmt: skip
    weight, half_a = choose_weight(model, head, pack, cfg.depth, device)
    print(f"[poly] w = {weight} on half A: {half_a}", file=sys.stderr, flush=True)
    out.mkdir(parents=True, exist_ok=True)
    np.savez(
        out / POLY_FILE,
        codes=head.codes.detach().cpu().numpy(),  # [m, H]
        project_weight=head.project.weight.detach().cpu().numpy(),  # [H, H]
        project_bias=head.project.bias.detach().cpu().numpy(),  # [H]
        weight=np.float32(weight),  # the served w, chosen on half A
    )
    figures: dict[str, object] = {
        "config": asdict(cfg),
        "encoder": str(layers_path),
        "learned_mix": round(float(head.weight.detach()), 4),
        "weight": weight,
        "half_a_r_at_1_by_weight": half_a,
        "pool_encode_s": round(encoded_s, 1),
        "train": stats,
        "device": device,
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
    parser.add_argument("--encoder", type=Path, default=Path("artifacts/student/layers.npz"), help="a layers.npz")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--budget-s", type=float)
    defaults = PolyConfig()
    for name, value in asdict(defaults).items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=value)
    args = parser.parse_args()
    cfg = PolyConfig(**{name: getattr(args, name) for name in asdict(defaults)})
    print(json.dumps(train(cfg, Pack(args.pack), args.encoder, args.out, args.device, args.budget_s), indent=2))


if __name__ == "__main__":
    main()
