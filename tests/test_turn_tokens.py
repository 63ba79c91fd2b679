"""Contexts tokenised turn by turn give exactly the ids of the whole context."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
from tokenizers import Tokenizer

from core.bundle import RELEASE_BUNDLE, RELEASE_ROOT, TOKENIZER_FILE, open_bundle
from core.encoder import Tokenizers
from core.turn_tokens import TURN_MEMO, TurnTokenizer
from index.corpus import load_pairs

ODD_TURNS = [
    "[SEP]",
    "x[SEP]y",
    "a [SEP] b",
    "",
    " ",
    "\x00\x07",
    "tab\tand\nnewline",
    "Ça va? Über café",
    "괜찮아요 ㅋㅋ 😂",
    "我很好谢谢",
    "word " * 200,
    "supercalifragilisticexpialidocious" * 5,
]


MINILM = RELEASE_ROOT / "minilm"  # the shipped bundle whose WordPiece contexts are assembled turn by turn


@pytest.fixture(scope="module")
def release() -> tuple[Tokenizer, TurnTokenizer]:
    tokenizers = Tokenizers.load(MINILM, open_bundle(MINILM))
    assert tokenizers.turns is not None
    return tokenizers.by_side["context"], tokenizers.turns


def test_a_prefixed_sentencepiece_bundle_tokenises_its_context_whole() -> None:
    """The default encoder (e5: "query: " prefix, SentencePiece) is not one where turns assemble exactly."""
    assert Tokenizers.load(RELEASE_BUNDLE, open_bundle(RELEASE_BUNDLE)).turns is None


def test_the_release_tokenizer_gives_the_same_ids_on_held_out_contexts(
    release: tuple[Tokenizer, TurnTokenizer],
) -> None:
    whole, turns = release
    contexts = [turns.separator.join(p.context) for p in load_pairs("validation", 3)[:3000]]
    assert [turns.ids(c) for c in contexts] == [whole.encode(c).ids for c in contexts]


def test_odd_turns_give_the_same_ids(release: tuple[Tokenizer, TurnTokenizer]) -> None:
    whole, turns = release
    for window in itertools.product([*ODD_TURNS[:6], "hi there"], repeat=3):
        context = turns.separator.join(window)
        assert turns.ids(context) == whole.encode(context).ids, window
    for turn in ODD_TURNS:
        for context in (turn, turns.separator.join(["hello", turn]), turns.separator.join([turn, "hello"])):
            assert turns.ids(context) == whole.encode(context).ids, context


def test_turns_past_the_limit_are_not_tokenised_and_turns_are_tokenised_once() -> None:
    tokenizer = Tokenizer.from_file(str(MINILM / TOKENIZER_FILE))
    tokenizer.enable_truncation(max_length=16, direction="left")
    tokenizer.no_padding()
    turns = TurnTokenizer(tokenizer, " [SEP] ", 16)
    long = "one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen"
    turns.ids(turns.separator.join(["never read", long]))
    assert list(turns._memo) == [long]
    turns.ids(turns.separator.join(["how are you?", "fine"]))
    turns.ids(turns.separator.join(["fine", "and you?"]))
    assert sorted(turns._memo) == sorted([long, "how are you?", "fine", "and you?"])  # "fine" once


def test_the_turn_memo_is_bounded(release: tuple[Tokenizer, TurnTokenizer]) -> None:
    whole, _ = release
    turns = TurnTokenizer(whole, " [SEP] ", 64)
    for i in range(TURN_MEMO + 10):
        turns.ids(f"turn {i}")
    assert len(turns._memo) == TURN_MEMO and "turn 0" not in turns._memo


def test_a_bundle_with_a_query_prefix_tokenises_whole() -> None:
    manifest = open_bundle(MINILM)
    tokenizer = Tokenizer.from_file(str(MINILM / TOKENIZER_FILE))
    assert TurnTokenizer.for_bundle(tokenizer, replace(manifest, query_prefix="query: ")) is None
    assert TurnTokenizer.for_bundle(tokenizer, replace(manifest, turn_separator=" | ")) is None
