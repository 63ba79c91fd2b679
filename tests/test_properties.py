"""Properties over generated inputs (hypothesis): session keys, text normalisation, and the hits the
retriever keeps."""

from __future__ import annotations

import re
import unicodedata

from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter, ValidationError

from app.engine.cache import EmbeddingCache
from app.engine.kv import open_store
from app.engine.sessions import SessionStore
from app.schemas import MAX_SESSION_ID_CHARS, SessionId
from core.retriever import Avoid, Scored, distinct, in_script, kept
from core.text import Signature, near_copy, normalize

SESSION_ID = TypeAdapter(SessionId)
valid_ids = st.from_regex(r"\A[A-Za-z0-9._:-]{1,128}\Z")


@given(valid_ids, valid_ids)
def test_distinct_session_ids_never_share_a_key(a: str, b: str) -> None:
    assert (SessionStore._key(a) == SessionStore._key(b)) == (a == b)
    assert len(SessionStore._key(a)) <= len("session:") + MAX_SESSION_ID_CHARS


@given(st.text(max_size=300))
def test_any_string_is_either_a_valid_session_id_or_refused(candidate: str) -> None:
    try:
        accepted = SESSION_ID.validate_python(candidate)
    except ValidationError:
        return
    # What passes stays within the alphabet and the bound: no separators, spaces, newlines or wildcards.
    assert 1 <= len(accepted) <= MAX_SESSION_ID_CHARS
    assert set(accepted) <= set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._:-")


@given(st.text(max_size=200))
@settings(max_examples=300)
def test_normalize_is_idempotent_and_trimmed(text: str) -> None:
    once = normalize(text)
    assert normalize(once) == once
    assert once == once.strip() and "  " not in once


@given(st.text(max_size=100))
def test_normalize_does_not_depend_on_the_unicode_form(text: str) -> None:
    # Not NFKC/NFKD: they fold Hangul compatibility jamo ("ㅋㅠ" -> "큐"),
    # which normalize() keeps as typed, so nothing can undo them.
    for form in ("NFC", "NFD"):
        assert normalize(unicodedata.normalize(form, text)) == normalize(text)


@given(st.text(alphabet=st.characters(max_codepoint=127), max_size=100), st.booleans())
def test_the_ascii_shortcut_normalises_as_the_full_path_does(text: str, lowercase: bool) -> None:
    # normalize() skips NFKC and the jamo split for ASCII. The full path, spelled out:
    full = unicodedata.normalize("NFKC", text)
    full = re.sub(r"\s+", " ", full.lower() if lowercase else full).strip()
    assert normalize(text, lowercase) == full


@given(st.text(max_size=100), st.text(max_size=100))
def test_cache_keys_follow_the_normalised_text(a: str, b: str) -> None:
    cache = EmbeddingCache(open_store(None, 50, 1.0, 0), 0, 60, lowercase=True)
    same = cache.key("model", "context", a) == cache.key("model", "context", b)
    assert same == (normalize(a) == normalize(b))
    assert cache.key("model", "context", a) != cache.key("other-model", "context", a)


@given(st.text(min_size=1, max_size=80), st.text(min_size=1, max_size=80))
def test_near_copy_is_symmetric_and_reflexive(a: str, b: str) -> None:
    x, y = Signature.of(a), Signature.of(b)
    assert near_copy(x, y) == near_copy(y, x)
    assert near_copy(x, x)


LINES = ["hi there", "hi there!", "안녕하세요", "electric sheep을 꿨습니다.", "😂", "see you tomorrow", "내일 봐"]


@given(
    st.lists(st.tuples(st.integers(0, 5), st.sampled_from(LINES)), max_size=12),
    st.sampled_from([None, "Latin", "Hangul"]),
    st.lists(st.sampled_from(LINES), max_size=3),
)
def test_kept_is_the_script_then_distinct_filter_one_check_a_hit(
    rows: list[tuple[int, str]], script: str | None, turns: list[str]
) -> None:
    hits = [Scored(row, f"r{row}", text, 1.0 - i / 100, "reply_matching") for i, (row, text) in enumerate(rows)]
    avoid = Avoid.of(turns)
    assert list(kept(hits, script, avoid)) == distinct(in_script(hits, script, avoid), len(hits), avoid)
