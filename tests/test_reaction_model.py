"""The reaction model: a bundle of kind "reactions" whose classifier reads the last turn through its
own encoder, for every set, in place of each encoder's own head (docs/reactions.md). Tiny bundles."""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import pytest

from app.config import Settings
from app.engine.runtime import load_model, load_reaction_model
from core.bundle import RELEASE_REACTIONS, RELEASE_ROOT, BundleError, ReactionSpec, open_bundle, shipped_bundles
from core.encoder import Encoder
from core.reactions import ReactionClassifier
from tests.helpers import REACTION_LABELS, TINY_PARITY_TEXTS, AppFactory, bundle_of, settings_for
from tests.tiny_bundle import TinyReactions, build_tiny_bundle

pytestmark = pytest.mark.anyio

DIM = 16  # not the retrieving bundle's 32: the classifier must read the reader's vectors, not the context's


@pytest.fixture(scope="module")
def reader_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rng = np.random.default_rng(7)
    reactions = TinyReactions(
        ReactionSpec(labels=REACTION_LABELS, coverage=0.0),
        rng.normal(size=(len(REACTION_LABELS), DIM)).astype(np.float32) * 20,  # [C, D] sure of some turns
        np.zeros(len(REACTION_LABELS), np.float32),
    )
    root = tmp_path_factory.mktemp("reaction-model")
    return build_tiny_bundle(
        root, "tiny-reader", TINY_PARITY_TEXTS, seed=5, dim=DIM, reactions=reactions, kind="reactions"
    )


def test_only_a_bundle_of_kind_reactions_is_a_reaction_model(reader_dir: Path, artifacts: Path) -> None:
    with pytest.raises(BundleError, match="not a reaction model"):
        ReactionClassifier.reading(bundle_of(artifacts))
    assert ReactionClassifier.reading(reader_dir).reader is not None
    assert "tiny-reader" not in shipped_bundles(reader_dir.parent)  # no set may retrieve with it


def test_the_reaction_model_reads_the_turn_not_the_context_vector(reader_dir: Path) -> None:
    model = ReactionClassifier.reading(reader_dir)
    assert model.reader is not None
    turn = "my dog died this morning"
    context = np.ones(32, np.float32)  # [D'] the retrieving bundle's: ignored
    read = model.vector(turn, context)  # [D]
    np.testing.assert_allclose(read, model.reader.encode([turn], side="context")[0])
    own_head = ReactionClassifier.from_arrays(
        ReactionSpec(labels=REACTION_LABELS, coverage=0.0),
        {
            "weight": np.zeros((len(REACTION_LABELS), 32), np.float32),
            "bias": np.zeros(len(REACTION_LABELS), np.float32),
        },
    )
    assert own_head.vector(turn, context) is context  # a bundle's head reads the context vector


def test_every_encoder_shares_the_one_reaction_model(reader_dir: Path, artifacts: Path) -> None:
    settings = settings_for(artifacts, reactions_dir=reader_dir)
    shared = load_reaction_model(settings)
    model = load_model(settings, reaction_model=shared)
    assert model.reactions is shared
    assert load_model(settings_for(artifacts)).reactions is None  # the tiny bundle has no head of its own
    assert load_reaction_model(settings_for(artifacts)) is None


def test_the_reaction_model_and_the_encoders_share_one_tokenizer_per_file(reader_dir: Path, artifacts: Path) -> None:
    """The shipped reader reads with the default encoder's vocabulary: one loaded copy (some 23 MB a side)."""
    settings = settings_for(artifacts, reactions_dir=reader_dir)
    reader = load_reaction_model(settings)
    model = load_model(settings, reaction_model=reader)
    assert reader is not None and reader.reader is not None
    assert (reader_dir / "tokenizer.json").read_bytes() == (bundle_of(artifacts) / "tokenizer.json").read_bytes()
    for side in ("context", "reply"):
        assert reader.reader.tokenizers.by_side[side] is model.encoder.tokenizers.by_side[side]
    # Shared only as each would have set it up alone: the same cut.
    limit = reader.reader.tokenizers.by_side["context"].truncation
    assert limit is not None and limit["max_length"] == open_bundle(reader_dir).max_context_tokens


def test_a_tokenizer_is_shared_only_where_its_file_and_cut_are_the_same(tmp_path: Path, artifacts: Path) -> None:
    plain = bundle_of(artifacts)
    prefixed = build_tiny_bundle(
        tmp_path, "tiny-prefixed", TINY_PARITY_TEXTS, seed=5, prefixes=("query: ", "passage: ")
    )
    assert not open_bundle(plain).query_prefix and open_bundle(prefixed).query_prefix
    mine, theirs = (Encoder(d, open_bundle(d)).tokenizers.by_side for d in (plain, prefixed))
    assert mine["reply"] is theirs["reply"]  # the same file, cut alike
    # A prefixed context is tokenised whole and cut around its prefix; a plain one is cut by the tokenizer.
    assert mine["context"] is not theirs["context"]
    assert mine["context"].truncation is not None and theirs["context"].truncation["max_length"] == 1 << 30


def test_an_empty_setting_names_no_reaction_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHITCHAT_REACTIONS_DIR", "")
    assert Settings().reactions_dir is None


async def test_the_service_answers_a_reaction_from_the_last_turn(reader_dir: Path, make_client: AppFactory) -> None:
    model = ReactionClassifier.reading(reader_dir)
    turns = ["i lost my job today", "we won the final!", "good night everyone"]
    async with make_client(reactions_dir=reader_dir) as client:
        info = (await client.get("/info")).json()["model"]
        for turn in turns:
            # Two conversations ending on the same turn: the reader reads that turn alone.
            for earlier in (["hi there"], ["what a week", "tell me about it"]):
                body = {"context": [*earlier, turn], "strategies": ["reaction"], "k": 1}
                response = await client.post("/reply", json=body)
                assert response.status_code == 200, response.text
                answer = response.json()
                first = model.top(model.vector(turn, np.zeros(0, np.float32)), len(REACTION_LABELS))[0][0]
                assert answer["source"] == "reaction"
                assert answer["reply"] == REACTION_LABELS[first], (turn, earlier)
    assert info["reaction_model"] == {
        "name": "tiny-reader",
        "checksum": model.reader.manifest.checksum,
        "reads": "the last turn",
    }  # type: ignore[union-attr]
    assert info["reactions"]["labels"] == REACTION_LABELS


async def test_the_readers_pass_is_a_stage_of_its_own(reader_dir: Path, make_client: AppFactory) -> None:
    """Timed as read_turn, not inside the reactions or in no stage (`bench.profile` shows its share)."""
    async with make_client(reactions_dir=reader_dir) as client:
        body = {"context": ["hi there", "i lost my job today"], "strategies": ["reaction"], "k": 1}
        assert (await client.post("/reply", json=body)).status_code == 200
        metrics = (await client.get("/metrics")).text
    assert 'chitchat_stage_seconds_count{stage="read_turn"} 1.0' in metrics


async def test_without_a_reaction_model_a_bundle_without_a_head_has_no_reactions(client: httpx.AsyncClient) -> None:
    info = (await client.get("/info")).json()["model"]
    assert info["reaction_model"] is None and info["reactions"] is None


def test_the_shipped_reaction_model_is_a_checked_release_bundle_that_no_set_retrieves_with() -> None:
    manifest = open_bundle(RELEASE_REACTIONS)  # its files match their checksums
    assert manifest.kind == "reactions" and not manifest.servable
    assert "reactions" not in shipped_bundles(RELEASE_ROOT)
    assert sum(f.stat().st_size for f in RELEASE_REACTIONS.iterdir()) <= 40_000_000  # a release bundle's limit
    assert manifest.training["reactions"]["gates"]["half_a_wrong"] == 0
    assert Settings().reactions_dir == RELEASE_REACTIONS  # what a fresh clone serves
