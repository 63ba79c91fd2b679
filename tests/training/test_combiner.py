"""The combiner recipe (models/e5/combiner.py): what it trains is what the service computes."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from core.bundle import COMBINER_FILE
from core.context import Combiner, unit
from models.e5 import combiner as recipe
from models.e5.combiner import CombinerConfig, DevSet, Pairs, Table, TorchCombiner, reply_side, train

pytestmark = pytest.mark.training

DIM = 16


def synthetic(n: int, seed: int = 0) -> tuple[list[str], dict[str, np.ndarray], Pairs]:
    """Texts whose reply vector is near its context's newest turn, with three turns before each reply."""
    rng = np.random.default_rng(seed)
    texts = [f"turn {i}" + "!" * (i % 7) for i in range(4 * n)]
    context = unit(rng.normal(size=(4 * n, DIM)).astype(np.float32))
    reply = context.copy()
    for i in range(n):  # reply 4i+3 answers the window (4i, 4i+1, 4i+2), mostly its newest turn
        reply[4 * i + 3] = unit(context[4 * i + 2] + 0.3 * context[4 * i + 1] + 0.2 * rng.normal(size=DIM))
    turns = np.full((n, 8), -1, dtype=np.int32)
    turns[:, :3] = np.stack([4 * np.arange(n) + 2, 4 * np.arange(n) + 1, 4 * np.arange(n)], axis=1)
    pairs = Pairs(turns, (4 * np.arange(n) + 3).astype(np.int32), ["synthetic"] * n)
    return texts, {"context": context.astype(np.float16), "reply": reply.astype(np.float16)}, pairs


def test_the_torch_combiner_computes_what_the_numpy_one_serves(tmp_path: Path) -> None:
    config = CombinerConfig(turns=3)
    model = TorchCombiner(config, DIM)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(0.1 * torch.randn_like(p))
    combiner = model.export(reply_side(config))
    combiner.save(tmp_path / "c.npz")
    served = Combiner.load(tmp_path / "c.npz")
    rng = np.random.default_rng(0)
    windows = [["a", "bb b", "ccc cc"], ["only one"], ["two", "turns here"]]
    vectors = np.zeros((3, 3, DIM), dtype=np.float32)  # [B, N, D] newest first
    lengths = np.zeros((3, 3), dtype=np.float32)
    present = np.zeros((3, 3), dtype=np.float32)
    for i, w in enumerate(windows):
        for p, text in enumerate(reversed(w)):
            vectors[i, p] = unit(rng.normal(size=DIM).astype(np.float32))
            lengths[i, p], present[i, p] = np.log1p(len(text)) / 4.0, 1.0
    ours = served.combine_many(vectors, windows)
    theirs = model(torch.from_numpy(vectors), torch.from_numpy(lengths), torch.from_numpy(present)).detach().numpy()
    assert np.allclose(ours, theirs, atol=1e-5)
    # Oldest first, one window at a time, as the service calls it:
    assert np.allclose(served.combine(vectors[0][::-1], windows[0]), ours[0], atol=1e-6)


def test_training_learns_to_lean_on_the_newest_turn() -> None:
    texts, vectors, pairs = synthetic(2000)
    config = CombinerConfig(turns=3, epochs=3, batch_size=100, head=False)
    model, figures = train(config, Table(texts, vectors), pairs, texts)
    assert figures["final_loss"] < figures["first_loss"]
    gates = model.gate_bias.detach().numpy()
    assert gates[0] > gates[2]  # the newest turn weighs more than the oldest


def test_the_rebuild_check_judges_both_combiners_on_this_cpus_vectors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    texts, vectors, pairs = synthetic(400)
    table = Table(texts, vectors)
    config = CombinerConfig(turns=3, epochs=2, batch_size=100, head=False)
    trained = train(config, table, pairs, texts)[0].export(reply_side(config))
    rng = np.random.default_rng(1)
    scrambled = Combiner(  # a head of noise ten times the pooled turns: it finds nothing
        trained.gate_bias, trained.gate_newest, trained.gate_own,
        10 * rng.normal(size=(DIM, DIM)).astype(np.float32), trained.head_bias, trained.reply_side,
    )  # fmt: skip
    windows = [[texts[4 * i], texts[4 * i + 1], texts[4 * i + 2]] for i in range(100)]
    dev = DevSet("synthetic", windows, [texts[4 * i + 3] for i in range(100)], [{i} for i in range(100)],
                 np.array(["A", "B"] * 50))  # fmt: skip
    row = {t: i for i, t in enumerate(texts)}
    monkeypatch.setattr(recipe, "load", lambda bundle: (None, texts, row, table, pairs, [dev]))
    # What each manifest recorded where it was trained: far from these vectors' figures, and unread.
    recorded = {"synthetic": {"A": 0.0, "B": 0.0}}
    spec = SimpleNamespace(combiner=SimpleNamespace(training={"half_a_b": recorded}))
    monkeypatch.setattr(recipe, "open_bundle", lambda bundle: spec)
    bundles = {}
    for name, combiner in (("release", trained), ("rebuild", trained), ("noise", scrambled)):
        bundles[name] = tmp_path / name
        bundles[name].mkdir()
        combiner.save(bundles[name] / COMBINER_FILE)
    assert recipe.check(bundles["rebuild"], bundles["release"]) == 0
    assert recipe.check(bundles["noise"], bundles["release"]) == 1
