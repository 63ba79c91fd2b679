"""Upload parsing (app/reindex/uploads.py) and the duplicates report (index/candidates.py), without an app."""

from __future__ import annotations

import json
import tracemalloc
from typing import Any

import pytest

from app.reindex.uploads import UploadError, parse_upload
from core.records import Candidate
from index.candidates import apply, duplicates


def parse(body: bytes, content_type: str, on_invalid: str = "reject") -> Any:
    return parse_upload(body, content_type, "append", 1000, on_invalid)  # type: ignore[arg-type]


SPILLED = b"query,reply\nhi there,hello, how are you today\nhow are you?,fine thanks\n"


def test_an_unquoted_comma_in_csv_is_an_invalid_line_not_a_truncated_reply() -> None:
    with pytest.raises(UploadError) as rejected:
        parse(SPILLED, "text/csv")
    assert rejected.value.field == "line 2"
    assert "1 more field than the header; quote fields that contain commas" in rejected.value.message

    upload = parse(SPILLED, "text/csv", on_invalid="skip")
    assert [c.reply for c in upload.records] == ["fine thanks"]  # never "hello"
    assert upload.skipped_count == 1
    assert upload.skipped == [
        {"line": 2, "field": "line 2", "reason": "1 more field than the header; quote fields that contain commas"}
    ]

    two_more = parse(b"reply\na,b,c\nok\n", "text/csv", on_invalid="skip")
    assert "2 more fields than the header" in two_more.skipped[0]["reason"]


def test_a_csv_header_that_repeats_a_column_is_refused() -> None:
    with pytest.raises(UploadError) as error:
        parse(b"query,reply,reply\nhi,hello,hey\n", "text/csv")
    assert error.value.field == "body" and "reply" in error.value.message and "repeat" in error.value.message
    with pytest.raises(UploadError):
        parse(b"reply, reply\nhello,hey\n", "text/csv")  # the same once stripped


def test_a_multi_line_csv_record_is_reported_at_its_first_line() -> None:
    body = b'query,reply\n"one\ntwo\nthree",\n\nhi,ok\nbye,\n'
    with pytest.raises(UploadError) as error:
        parse(body, "text/csv")
    assert error.value.field == "line 2.reply"
    assert [d["field"] for d in error.value.details] == ["line 2.reply", "line 7.reply"]
    upload = parse(body, "text/csv", on_invalid="skip")
    assert [r["line"] for r in upload.skipped] == [2, 7]
    assert upload.lines == [6]  # the valid record, after the blank line 5


@pytest.mark.parametrize(
    ("body", "content_type", "expected"),
    [
        (b'{"reply": "ok"}\n{"reply": ""}\n{oops\n', "application/x-ndjson", [(2, "line 2.reply"), (3, "line 3")]),
        (
            json.dumps([{"reply": "ok"}, {"reply": ""}, {"reply": "a", "nope": 1}]).encode(),
            "application/json",
            [(2, "record 2.reply"), (3, "record 3.nope")],
        ),
        (b'reply\nok\n""\n"a,b",c\n', "text/csv", [(3, "line 3.reply"), (4, "line 4")]),
    ],
    ids=["ndjson", "json", "csv"],
)
def test_skipped_records_name_their_line_as_a_number(
    body: bytes, content_type: str, expected: list[tuple[int, str]]
) -> None:
    upload = parse(body, content_type, on_invalid="skip")
    assert upload.skipped_count == 2
    assert [(r["line"], r["field"]) for r in upload.skipped] == expected


def test_a_records_object_is_its_array_and_a_skip_reports_the_first_hundred() -> None:
    """candidates.md, Bring your own replies: a file is a JSON array or `{"records": [...]}`;
    `--on-invalid skip` reports each skipped record (line, field, reason; the first 100)."""
    body = json.dumps({"records": [{"reply": ""}] * 150 + [{"reply": "ok"}]}).encode()
    upload = parse(body, "application/json", on_invalid="skip")
    assert [c.reply for c in upload.records] == ["ok"] and upload.skipped_count == 150
    assert len(upload.skipped) == 100 and upload.skipped[-1]["field"] == "record 100.reply"


def test_json_records_are_numbered_by_position() -> None:
    body = json.dumps([{"reply": "ok"}, {"reply": ""}, {"reply": "fine"}]).encode()
    upload = parse(body, "application/json", on_invalid="skip")
    assert [(r["line"], r["field"]) for r in upload.skipped] == [(2, "record 2.reply")]
    assert upload.lines == [1, 3]


# --- duplicates, as the reindex job reports them ---------------------------------------------------------


def report(stored: list[Candidate], mode: str, upload: list[Candidate], lines: list[int] | None) -> dict[str, Any]:
    return duplicates(stored, mode, upload, apply(stored, mode, upload), lines)


def test_an_upload_that_repeats_stored_records_says_so() -> None:
    stored = [Candidate(reply="an old oak", id="oak"), Candidate(reply="pizza", id="food")]
    upload = [
        Candidate(reply="pizza!!", id="food"),  # line 2: replaces the stored record
        Candidate(reply="An  OLD oak", id="tree"),  # line 3: the stored oak's text, another id
        Candidate(reply="an old oak", id="oak"),  # line 5: the stored oak again, both id and text
        Candidate(reply="hello", id="greeting"),  # line 6: new
        Candidate(reply="Hello", id="hi"),  # line 7: the same text as line 6
        Candidate(reply="x", id="dup"),  # line 8: replaced by line 9
        Candidate(reply="y", id="dup"),  # line 9
    ]
    found = report(stored, "append", upload, [2, 3, 5, 6, 7, 8, 9])
    assert {name: (d["records"], d["lines"]) for name, d in found.items()} == {
        "ids": (1, [8]),
        "stored_ids": (2, [2, 5]),  # line 5 once, though its text is the stored one's too
        "texts": (1, [7]),
        "stored_texts": (1, [3]),
    }
    assert "replaces the stored record" in found["stored_ids"]["rule"]
    assert "first id wins" in found["texts"]["rule"] and "stored record's id" in found["stored_texts"]["rule"]


def test_replace_mode_and_reactions() -> None:
    stored = [Candidate(reply="hello", id="greeting")]
    upload = [
        Candidate(reply="hello", id="greeting"),
        Candidate(reply="ㅋㅋㅋ", kind="reaction", language="ko", id="r1"),
        Candidate(reply="ㅋㅋㅋ", kind="reaction", language="ko", id="r2"),  # reactions are not deduplicated by text
    ]
    found = report(stored, "replace", upload, None)
    assert sum(d["records"] for d in found.values()) == 0
    found = report(stored, "append", upload, None)
    assert found["stored_ids"]["lines"] == [1]  # without lines: positions
    assert found["texts"]["records"] == 0


# --- the record limit and oversized fields -----------------------------------------------------------------


def bodies(records: int, content_type: str) -> bytes:
    """`records` valid records in the format `content_type` names."""
    if content_type == "text/csv":
        return b"reply,id\n" + b"".join(b"reply number %d,r%d\n" % (i, i) for i in range(records))
    lines = [b'{"reply": "reply number %d", "id": "r%d"}' % (i, i) for i in range(records)]
    if content_type == "application/x-ndjson":
        return b"\n".join(lines) + b"\n"
    return b"[" + b",".join(lines) + b"]"


FORMATS = ["application/json", "application/x-ndjson", "text/csv"]


@pytest.mark.parametrize("content_type", FORMATS)
def test_the_record_limit_is_counted_while_parsing_and_memory_stays_bounded(content_type: str) -> None:
    """api.md, Errors and limits, and candidates.md, Admin (`CHITCHAT_ADMIN_MAX_RECORDS`): an upload of more
    records than the limit is 413 naming `records`. A parse that built every record before counting
    them grew memory ~57 times the body's size (a 4 MiB body of 2M records: 228 MiB) before its 413:
    the count now stops the parse at the limit's first record past it."""
    body = bodies(100_000, content_type)
    tracemalloc.start()
    try:
        with pytest.raises(UploadError) as refused:
            parse_upload(body, content_type, "append", 100, "reject")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert refused.value.too_large and refused.value.field == "records"
    assert "100" in refused.value.message
    # At most one decoded copy of the body (JSON's), and the first 101 records: not 100,000 of them.
    assert peak < len(body) + (1 << 20), f"{peak:,} bytes at peak for a body of {len(body):,}"


@pytest.mark.parametrize(
    ("content_type", "tail"),
    [("application/json", b"!not JSON at all"), ("text/csv", b"\xff\xfe not UTF-8\n")],
    ids=["json", "csv"],
)
def test_the_parse_stops_at_the_record_past_the_limit(content_type: str, tail: bytes) -> None:
    """What follows the limit's first record past it is never read: a body broken after it is 413
    naming `records`, not the 422 its break would give were it read."""
    body = bodies(11, content_type)
    body = body[:-1] + tail if content_type == "application/json" else body + tail
    with pytest.raises(UploadError) as refused:
        parse_upload(body, content_type, "append", 10, "reject")
    assert refused.value.too_large and refused.value.field == "records", refused.value.message
    assert len(parse_upload(bodies(10, content_type), content_type, "append", 10, "reject").records) == 10


@pytest.mark.parametrize(
    "body",
    [
        b"reply,id\nfine,a\n" + b"x" * 140_000 + b",b\nalso fine,c\n",
        b'reply,id\nfine,a\n"' + b"x" * 140_000 + b'\nstill the same field",b\nalso fine,c\n',
    ],
    ids=["one-line", "quoted-across-lines"],
)
def test_a_csv_field_over_the_csv_modules_limit_is_an_invalid_record_not_a_500(body: bytes) -> None:
    """A field of more than 131,072 characters (the csv module's own limit) raised csv.Error, which
    nothing caught: a 500, with or without on_invalid=skip. It is a record like any other now:
    refused naming its line and field, or skipped; a quoted field that spans lines is still one record
    (its second line never becomes a reply of its own)."""
    with pytest.raises(UploadError) as refused:
        parse(body, "text/csv")
    assert refused.value.field == "line 3.reply" and not refused.value.too_large, refused.value.message
    upload = parse(body, "text/csv", on_invalid="skip")
    assert [c.reply for c in upload.records] == ["fine", "also fine"]
    assert [(r["line"], r["field"]) for r in upload.skipped] == [(3, "line 3.reply")]
