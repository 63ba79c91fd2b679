"""The reaction classifier's recipe: classes that take a side come with the axes and margin that gate them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from core.bundle import open_bundle
from core.encoder import Encoder
from core.reactions import ReactionClassifier
from models.dataset import TrainPairs
from models.export import add_reactions
from models.reaction_classes import REACTION_CLASSES
from models.reactions import MARGINS, train_class_reactions

pytestmark = pytest.mark.training


def test_the_recipe_writes_stances_the_service_gates_on(torch_artifacts: Path, tmp_path: Path) -> None:
    bundle = torch_artifacts / "bundles" / "tiny-int8"
    encoder = Encoder(bundle, open_bundle(bundle))
    replies = ["haha", "oh no", "congrats", "bye", "hi", "really", "me too", "thanks"] * 3
    pairs = TrainPairs([f"turn {i} about {r}" for i, r in enumerate(replies)], replies)
    model, stats = train_class_reactions(encoder, pairs)

    spec = model.spec
    assert spec.stances == [c.stance for c in REACTION_CLASSES]
    assert set(spec.axes) == {"valence", "phase"} and spec.stance_margin in MARGINS
    assert stats["held_out_triggers"]["crossed"] == 0 or spec.stance_margin == MARGINS[-1]

    copy = tmp_path / "bundle"
    copy.mkdir()
    for f in bundle.iterdir():
        (copy / f.name).write_bytes(f.read_bytes())
    manifest = add_reactions(copy, model)
    assert manifest.reactions is not None
    served = ReactionClassifier.load(copy, manifest.reactions, Encoder(copy, manifest))
    contexts = encoder.encode(["my dog died", "I won the lottery", "good night"], side="context")  # [3, D]
    for context in contexts:
        allowed = served.allowed(context)  # [C]
        assert all(allowed[c] for c, _ in served.top(context, len(spec.labels)))
        assert np.any(allowed)  # the classes that take no side are always there
