"""The out-of-domain dev sets (models/ood.py) and what keeps them out of training."""

from __future__ import annotations

import itertools
import json
from dataclasses import asdict

import pytest

from core.text import normalize
from index.corpus import load_pairs
from models.broad_text import GLOSS_SHARES, BroadText, prose_sentences, wordnet_glosses
from models.ood import STS_DIR, available_human, available_sts, chatterbot_set, half, held_out_keys, human_set, sts_set
from models.reactions.mining import reaction_key
from models.written_korean import TRANSLATED, WRITTEN, written_conversations

pytestmark = pytest.mark.training


def test_chatterbot_english_is_every_distinct_reply_and_each_context_knows_its_answers() -> None:
    data = chatterbot_set("en")
    assert len(data.replies) == len({normalize(r) for r in data.replies}) > 1000
    assert all(len(r) <= 1000 for r in data.replies)  # the API's limit on a turn
    assert len(data.contexts) == len(data.gold) > 1000
    assert all(1 <= len(c) <= 3 for c in data.contexts)
    # A context that several conversations share takes any of their replies as right.
    assert max(len(g) for g in data.gold) > 1
    first = data.gold[0]
    assert data.hit(0, next(r for r in data.replies if normalize(r) in first))
    assert not data.hit(0, "a reply no conversation has")


def test_chatterbot_korean_is_in_korean() -> None:
    data = chatterbot_set("ko")
    assert len(data.replies) > 600 and any("안녕" in r for r in data.replies)


@pytest.mark.skipif(not STS_DIR.is_dir(), reason=f"no STS sets at {STS_DIR}")
def test_sts_sets_skip_unscored_rows_and_read_korsts_columns() -> None:
    assert set(available_sts()) == {"sts15_headlines", "sts15_images", "korsts_dev"}
    headlines = sts_set("sts15_headlines")
    assert len(headlines.pairs) == len(headlines.gold) == 750
    assert all(0.0 <= g <= 5.0 for g in headlines.gold)
    korean = sts_set("korsts_dev")
    assert korean.language == "ko" and len(korean.pairs) == 1500
    assert "남자" in korean.pairs[0][0]


def test_no_training_text_is_a_line_of_an_out_of_domain_set() -> None:
    held_out = held_out_keys()
    assert normalize("What is AI?") in held_out  # chatterbot's English folder
    assert normalize("안녕") in held_out or any("안녕" in k for k in held_out)
    korean = [t for path in (WRITTEN, TRANSLATED) for turns in written_conversations(path) for t in turns]
    prose = prose_sentences("eng") + prose_sentences("kor")
    pools = BroadText({"en-prose": prose, "ko-chat": korean}, {"en-prose": 0.5, "ko-chat": 0.5}, 0)
    # broad_text() drops these; here the raw pools show how few there are to drop.
    overlap = [t for t in pools.texts if normalize(t) in held_out]
    assert len(overlap) < 0.01 * len(pools.texts)


def test_broad_batches_are_a_function_of_the_step_with_each_pool_its_share() -> None:
    pools = BroadText(
        {"en-chat": [f"e{i}" for i in range(50)], "ko-chat": [f"k{i}" for i in range(30)], "ko-prose": ["p"] * 5},
        {"en-chat": 0.5, "ko-chat": 0.25, "ko-prose": 0.25},
        seed=3,
    )
    batch = pools.batch(7, 8)
    assert batch == pools.batch(7, 8) and batch != pools.batch(8, 8)
    texts = [pools.texts[i] for i in batch]
    assert [t[0] for t in texts] == ["e"] * 4 + ["k"] * 2 + ["p"] * 2  # English first, as the relation loss reads them
    assert pools.english_rows()[batch].sum() == 4


def test_the_prose_keeps_no_preamble_of_the_model_that_wrote_it() -> None:
    english = prose_sentences("eng")
    assert len(english) > 5000 and not any(reaction_key(s).startswith("of course") for s in english)
    assert not any(s.startswith("물론입니다") for s in prose_sentences("kor"))


def test_wordnet_glosses_are_its_definitions_and_examples_without_the_licence_or_quotes() -> None:
    glosses = wordnet_glosses()
    assert len(glosses) > 100_000 and len(set(glosses)) == len(glosses)
    assert any(g.startswith("A member of the genus Canis") for g in glosses)  # dog's definition
    assert not any(g.startswith(("1 This software", '"')) or g.endswith('"') for g in glosses)
    assert abs(sum(GLOSS_SHARES.values()) - 1) < 1e-9


def _training_pairs() -> set[tuple[str, str]]:
    """(last context turn, reply), normalised, of everything the shipped tune can train on: the
    chitchat train split and both Korean files whole (before their own held-out filter)."""
    pairs = {(normalize(p.context[-1]), normalize(p.reply)) for p in load_pairs("train", 1)}
    for path in (WRITTEN, TRANSLATED):
        for line in path.read_text(encoding="utf-8").splitlines():
            turns = json.loads(line)["turns"] if line.strip() else []
            pairs.update((normalize(a), normalize(b)) for a, b in itertools.pairwise(turns))
    return pairs


@pytest.mark.skipif(not available_human(), reason="no human chit-chat dev sets in ../shared/data/dev")
def test_no_human_dev_pair_is_a_training_pair_and_halves_are_fixed_and_even() -> None:
    trained = _training_pairs()
    for name in available_human():
        data = human_set(name)
        for context, gold in zip(data.contexts, data.gold, strict=True):
            assert not {(normalize(context[-1]), reply) for reply in gold} & trained, (name, context)
        share_a = data.halves.count("A") / len(data.halves)
        assert 0.45 < share_a < 0.55, (name, share_a)
        assert half(data.contexts[0]) == half(tuple(data.contexts[0]))  # a function of the context alone


def test_the_teacher_trains_on_no_chatterbot_and_the_tracked_layers_did_not() -> None:
    from models.e5.teacher import TeacherConfig
    from models.trained_layers import RELEASE_LAYERS, read_release, saw_chatterbot

    assert not any("chatterbot" in name for name in asdict(TeacherConfig()))  # no switch to turn it on
    record = read_release(RELEASE_LAYERS)[1]
    assert not saw_chatterbot(record)  # what the tracked layers trained on
