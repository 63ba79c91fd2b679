"""The rolling reaction share: the least confident share of recent turns, whatever the candidate set."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from app.engine.runtime import load_model, serve
from core import ann
from core.bundle import ConfidenceSpec, read_manifest
from core.confidence import ConfidenceModel, ShareThreshold
from core.encoder import Encoder
from core.records import Candidate
from core.store import IndexStore
from core.text import Signature, echoes
from index.build import build_version
from index.confidence_quantiles import quantiles, stored_reply_confidences
from tests.helpers import bundle_of, settings_for, tiny_candidates

# A confidence of top1 alone: sigmoid(top1), so a test can say which hit it saw.
TOP1_ONLY = ConfidenceSpec(["top1"], [0.0], [1.0], [1.0], 0.0, [i / 100 for i in range(101)], 0.7)


def test_until_warm_the_validation_threshold_holds() -> None:
    share = ShareThreshold(share=0.1, fallback=0.77, warmup=50)
    for value in np.linspace(0, 1, 49):
        share.observe(float(value))
    assert share.threshold() == 0.77


def test_the_threshold_keeps_the_share_when_scores_shift() -> None:
    rng = np.random.default_rng(0)
    share = ShareThreshold(share=0.1, fallback=0.77, window=1000, warmup=100)
    shifted = rng.uniform(0.2, 0.6, 3000)  # another candidate set: every confidence below the fitted 0.77
    below = []
    for value in shifted:
        below.append(value < share.threshold())
        share.observe(float(value))
    # The fitted threshold alone would have sent every turn to reactions; once warm, the rolling one about 10%.
    assert all(below[:100])
    assert 0.08 <= np.mean(below[100:]) <= 0.12


def test_the_window_forgets_what_came_before() -> None:
    share = ShareThreshold(share=0.5, fallback=0.0, window=100, warmup=10)
    for _ in range(100):
        share.observe(0.9)
    for _ in range(100):
        share.observe(0.1)
    assert share.threshold() == 0.1


def test_a_served_index_version_holds_the_share_over_its_own_turns(poly_artifacts: Path) -> None:
    """serve() gives each (bundle, index version) pair a window of its own when the bundle can react;
    CHITCHAT_REACTION_SHARE_WINDOW=0 keeps the fitted threshold alone."""
    settings = settings_for(poly_artifacts)
    model = load_model(settings)
    spec = ConfidenceSpec(["top1"], [0.5], [0.1], [1.0], 0.0, [i / 100 for i in range(101)], 0.7)
    model = replace(model, confidence=ConfidenceModel(spec))
    index = IndexStore(settings.indexes_root)
    version = index.load(index.latest_for(model.bundle.checksum) or "")
    version = replace(version, manifest=replace(version.manifest, confidence_quantiles=[]))  # built before them
    served = serve(model, version, settings)
    assert served.share is not None and served.share.share == 0.1 and served.share.fallback == 0.1
    assert serve(model, version, settings.model_copy(update={"reaction_share_window": 0})).share is None
    assert serve(replace(model, reactions=None), version, settings).share is None


def test_the_rolling_threshold_is_numpys_quantile_of_the_window() -> None:
    rng = np.random.default_rng(0)
    for window, share in [(1, 0.3), (5, 0.1), (50, 0.5), (2000, 0.1)]:
        rolling = ShareThreshold(share=share, fallback=-1.0, window=window, warmup=1)
        seen: list[float] = []
        for confidence in rng.random(3 * window + 7).tolist():
            rolling.observe(confidence)
            seen = [*seen, confidence][-window:]
            assert rolling.threshold() == pytest.approx(float(np.quantile(seen, share)), abs=1e-12)


def test_a_version_starts_from_its_own_stored_replies(poly_artifacts: Path) -> None:
    """Where the version has confidence quantiles of its own, the rolling share starts from them,
    not from the bundle's validation ones, and turns warm after 20 turns."""
    settings = settings_for(poly_artifacts)
    model = load_model(settings)
    model = replace(model, confidence=ConfidenceModel(TOP1_ONLY))
    index = IndexStore(settings.indexes_root)
    version = index.load(index.latest_for(model.bundle.checksum) or "")
    own = [0.5 + i / 1000 for i in range(101)]
    version = replace(version, manifest=replace(version.manifest, confidence_quantiles=own))
    served = serve(model, version, settings)
    assert served.share is not None and served.share.fallback == own[10] and served.share.warmup == 20
    # The fixed threshold (no window, or a replay such as `make eval`) stays the validation turns'.
    assert served.thresholds.reply_matching == 0.1
    still = serve(model, version, settings.model_copy(update={"reaction_share_window": 0}))
    assert still.share is None and still.thresholds.reply_matching == 0.1


def test_stored_replies_said_as_contexts_never_find_themselves(artifacts: Path) -> None:
    """Each sampled reply is said as a one-turn context; its best hit is the best stored reply
    that does not echo it, as the service blocks a reply that repeats the user."""
    bundle_dir = bundle_of(artifacts)
    encoder = Encoder(bundle_dir, replace(read_manifest(bundle_dir), confidence=TOP1_ONLY))
    replies = list(dict.fromkeys(c.reply for c in tiny_candidates()))
    stored = encoder.encode(replies, "reply")  # [R, D]
    values = stored_reply_confidences(ann.exact(stored), replies, encoder)  # [R]: the sample is every reply
    said = encoder.encode([encoder.join_context([r]) for r in replies], "context")  # [R, D]
    scores = said @ stored.T  # [R, R]
    for i, reply in enumerate(replies):
        scores[i, [j for j, other in enumerate(replies) if echoes(other, [Signature.of(reply)])]] = -np.inf
    expected = 1 / (1 + np.exp(-scores.max(axis=1)))  # [R]
    assert len(values) == len(replies)
    np.testing.assert_allclose(np.sort(values), np.sort(expected), atol=1e-5)
    assert quantiles(values)[0] == pytest.approx(expected.min(), abs=1e-5) and len(quantiles(values)) == 101


def test_no_confidence_model_no_stored_confidences(artifacts: Path) -> None:
    bundle_dir = bundle_of(artifacts)
    encoder = Encoder(bundle_dir, replace(read_manifest(bundle_dir), confidence=None))
    values = stored_reply_confidences(ann.exact(encoder.encode(["hi", "hey"], "reply")), ["hi", "hey"], encoder)
    assert quantiles(values) == []


def test_a_build_keeps_its_replies_confidences_and_an_append_carries_them(artifacts: Path, tmp_path: Path) -> None:
    """A full build takes the sample's context vectors from its own encoding pass; an append of a
    few texts keeps the earlier version's figures rather than encode a new sample of 500."""
    bundle_dir = bundle_of(artifacts)
    manifest = read_manifest(bundle_dir)
    encoder = Encoder(bundle_dir, replace(manifest, confidence=TOP1_ONLY))
    store = IndexStore(tmp_path / "indexes")
    replies = [f"reply {i} about {topic}" for i in range(30) for topic in ("dogs", "rain", "pizza", "exams")]
    first = build_version([Candidate(reply=r) for r in replies], encoder, manifest.checksum, store, "t", progress=False)
    assert len(first.confidence_quantiles) == 101
    direct = quantiles(stored_reply_confidences(store.load(first.version).reply_index, replies, encoder))
    np.testing.assert_allclose(first.confidence_quantiles, direct, atol=1e-4)

    appended = [*replies, "one more reply", "and another"]  # 2 new texts of 122: carried
    second = build_version(
        [Candidate(reply=r) for r in appended], encoder, manifest.checksum, store, "t", progress=False
    )
    assert second.encoded == 2 and second.confidence_quantiles == first.confidence_quantiles

    others = [f"something else {i}, {w}" for i in range(40) for w in ("yes", "no")]  # mostly new: measured again
    third = build_version([Candidate(reply=r) for r in others], encoder, manifest.checksum, store, "t", progress=False)
    assert third.confidence_quantiles != first.confidence_quantiles
    direct = quantiles(stored_reply_confidences(store.load(third.version).reply_index, others, encoder))
    np.testing.assert_allclose(third.confidence_quantiles, direct, atol=1e-4)
