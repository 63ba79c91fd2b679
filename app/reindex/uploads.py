"""Candidate uploads: JSON (an array, or {"records": [...]}), NDJSON, or CSV
with a header naming `reply` and optionally `query`, `id`, `language` and
`tags` (separated by "|") columns. Each
record is validated on its own, so every bad one is reported with its line
(its position in a JSON array) and field.

By default one invalid record rejects the whole upload. With
`on_invalid="skip"` the valid records go ahead and the skipped ones are
reported in the job, each by its line as a number: the record's first line
in NDJSON and CSV, its position in a JSON array. Nothing is ever truncated:
a reply over the limit, or a CSV row with more fields than the header (an
unquoted comma), is an invalid record. Duplicates, within the upload and
against the stored candidates, are reported by the reindex job with the
rule that resolves them (`index.candidates.duplicates`).
"""

from __future__ import annotations

import csv
import json
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    ConfigDict,
    Field,
    StringConstraints,
    TypeAdapter,
    ValidationError,
    WithJsonSchema,
    model_validator,
)

from app.schemas import CandidateId, Language, Strict, Tags, Turn
from core.records import Candidate

Mode = Literal["replace", "append", "delete"]
OnInvalid = Literal["reject", "skip"]
MetadataKey = Annotated[str, StringConstraints(min_length=1, max_length=64)]
MAX_METADATA_TEXT = 256


def _scalar(value: Any) -> Any:
    if isinstance(value, str) and len(value) > MAX_METADATA_TEXT:
        raise ValueError(f"must be at most {MAX_METADATA_TEXT} characters")
    if value is not None and not isinstance(value, str | int | float | bool):
        raise ValueError("must be a string, a number, a boolean or null")
    return value


# One value of a record's metadata: a scalar, so a record stays a few hundred bytes in the candidate store.
MetadataValue = Annotated[
    Any,
    AfterValidator(_scalar),
    WithJsonSchema({"type": ["string", "number", "boolean", "null"], "maxLength": MAX_METADATA_TEXT}),
]
MAX_METADATA_KEYS = 16  # kept per record in the candidate store; not a document store


MAX_REPORTED = 100  # a million bad lines get the first hundred reasons
CSV_COLUMNS = ("reply", "query", "id", "language", "tags")
CSV_TAG_SEPARATOR = "|"  # a CSV record's tags in one field: "kids|greeting"


class CandidateIn(Strict):
    # The rule _reaction_fields enforces, published: a reaction names its language and has no query.
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "if": {"properties": {"kind": {"const": "reaction"}}, "required": ["kind"]},
            "then": {
                "required": ["language"],
                "properties": {"language": {"type": "string"}, "query": {"type": "null"}},
            },
        },
    )

    reply: Turn
    query: Turn | None = None
    id: CandidateId | None = None
    metadata: Annotated[dict[MetadataKey, MetadataValue], Field(max_length=MAX_METADATA_KEYS)] | None = None
    # "reaction": a short reply ("ㅋㅋㅋ", "haha") served in `language`'s conversations when no
    # retrieved reply is sure enough, instead of the model's own reaction set.
    kind: Literal["reply", "reaction"] = "reply"
    # Filters select on these at request time (`filter` in /reply). A reaction's language is required.
    language: Language | None = None
    tags: Tags | None = None

    @model_validator(mode="after")
    def _reaction_fields(self) -> CandidateIn:
        if self.kind == "reaction" and self.language is None:
            raise ValueError('a reaction needs its language (e.g. "ko"): it only answers conversations in it')
        if self.kind == "reaction" and self.query is not None:
            raise ValueError("a reaction has no query: it answers when nothing else is sure")
        return self


class DeleteIn(Strict):
    id: CandidateId


# What an upload body may hold; in delete mode a full record names the candidate to delete too.
RECORD = TypeAdapter(CandidateIn | DeleteIn)
_CANDIDATE = TypeAdapter(CandidateIn)


class UploadError(Exception):
    def __init__(self, message: str, field: str, details: list[dict[str, Any]], too_large: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.details = details
        self.too_large = too_large


@dataclass
class Upload:
    """The records that go ahead, and what the job should report about the rest."""

    records: list[Candidate]
    lines: list[int] = field(default_factory=list)  # each record's line (its position in a JSON array)
    skipped: list[dict[str, Any]] = field(default_factory=list)  # the first MAX_REPORTED: line, field, reason
    skipped_count: int = 0

    def report(self) -> dict[str, Any]:
        """What the job reports of the upload. Not `lines`: a line per record, too big to keep in the
        job, goes to the job on its own, to name the lines of the duplicates it finds."""
        return {"skipped": self.skipped_count, "skipped_records": self.skipped}


@dataclass
class _Invalid:
    line: int
    field: str  # "line 2.reply", "record 2.reply": the 422's field, and the skipped record's
    message: str


# What a format's reader yields for each record, in order: its line (its position in a JSON array)
# and what it holds, or why it could not be read at all. A reader is lazy: the parse stops reading
# the body once it has seen more records than it may take.
Item = tuple[int, Any] | _Invalid

# The csv module refuses a field longer than 131,072 characters with an error that says nothing of
# the record, and its reader then takes the rest of a quoted field's lines for records of their own.
# A field is never longer than the body, which its own limit bounds: let the field through, and let
# the record's validation refuse it (a reply is at most 1,000 characters) like any other too long.
csv.field_size_limit(max(csv.field_size_limit(), 2**31 - 1))

_JSON = json.JSONDecoder()
_SPACE = re.compile(r"[ \t\n\r]*")
NOT_RECORDS = 'expected a JSON array of records, or {"records": [...]}'


def _json_items(body: bytes) -> Iterator[Item]:
    """Each element of the array (or of `{"records": [...]}`) decoded on its own, in turn: never the
    whole list at once. Broken JSON anywhere is the body's error: past it nothing can be told apart."""
    try:
        text = body.decode(json.detect_encoding(body), "surrogatepass")  # as json.loads reads bytes
    except UnicodeDecodeError as error:
        raise UploadError(f"body is not JSON: {error}", "body", []) from error

    def value(at: int) -> tuple[Any, int]:
        try:
            return _JSON.raw_decode(text, at)
        except ValueError as error:
            raise UploadError(f"body is not JSON: {error}", "body", []) from error
        except RecursionError as error:  # json's parser recurses once per nesting level
            raise UploadError("body is nested too deeply to be a list of records", "body", []) from error

    def skip(at: int) -> int:
        return _SPACE.match(text, at).end()  # type: ignore[union-attr]  # matches at least ""

    at = skip(0)
    wrapped = text.startswith("{", at)
    if wrapped:  # {"records": [...]}, that key alone
        at = skip(at + 1)
        key, at = value(at) if text.startswith('"', at) else (None, at)
        at = skip(at)
        if key != "records" or not text.startswith(":", at):
            raise UploadError(NOT_RECORDS, "body", [])
        at = skip(at + 1)
    if not text.startswith("[", at):
        value(at)  # not JSON at all says so; JSON that is not a list of records says that
        raise UploadError(NOT_RECORDS, "body", [])
    at, number = skip(at + 1), 0
    if text.startswith("]", at):
        at += 1
    else:
        while True:
            item, at = value(at)
            number += 1
            yield number, item
            at = skip(at)
            if text.startswith(",", at):
                at = skip(at + 1)
                continue
            if not text.startswith("]", at):
                raise UploadError(f"body is not JSON: expected ',' or ']' at character {at}", "body", [])
            at += 1
            break
    at = skip(at)
    if wrapped:
        if not text.startswith("}", at):
            raise UploadError(NOT_RECORDS, "body", [])
        at = skip(at + 1)
    if at != len(text):
        raise UploadError(f"body is not JSON: extra data at character {at}", "body", [])


def _lines(body: bytes, ends: bytes) -> Iterator[bytes]:
    """The body's lines, each with its line end, one at a time (`ends`: the bytes that end one)."""
    for match in re.finditer(rb"[^" + ends + rb"]*(?:\r\n|[" + ends + rb"])|[^" + ends + rb"]+", body):
        yield match.group()


def _ndjson_items(body: bytes) -> Iterator[Item]:
    for number, line in enumerate(_lines(body, rb"\n"), start=1):
        if not line.strip():
            continue
        try:
            yield number, json.loads(line)
        except ValueError as error:
            yield _Invalid(number, f"line {number}", f"invalid JSON: {error}")
        except RecursionError:  # json's parser recurses once per nesting level
            yield _Invalid(number, f"line {number}", "nested too deeply to be a record")


def _csv_text(body: bytes) -> Iterator[str]:
    """The body's lines as text, decoded one at a time, each with its line end (LF, CRLF or a lone CR,
    as `open(newline="")` splits them): csv reads a quoted field across lines from them."""
    for number, line in enumerate(_lines(body, rb"\r\n"), start=1):
        try:
            yield line.decode("utf-8-sig" if number == 1 else "utf-8")
        except UnicodeDecodeError as error:
            raise UploadError(f"CSV is not UTF-8: line {number}: {error}", "body", []) from error


def _csv_rows(body: bytes) -> Iterator[tuple[int, list[str]]]:
    """(first line, fields) per record. A quoted field may span lines: the record is named by its first,
    where an editor shows it starting; csv's line_num is its last."""
    reader = csv.reader(_csv_text(body))
    first = 1
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as error:  # not a table csv can read on: nothing after it can be told apart
            raise UploadError(f"CSV cannot be read from line {first}: {error}", f"line {first}", []) from error
        if row:  # csv reads a blank line as []
            yield first, row
        first = reader.line_num + 1


def _csv_items(body: bytes) -> Iterator[Item]:
    rows = _csv_rows(body)
    _, header = next(rows, (0, []))
    columns = [c.strip() for c in header]
    if "reply" not in columns:
        raise UploadError(
            f"CSV needs a header with a reply column (and optionally {', '.join(CSV_COLUMNS[1:])}); got {columns}",
            "body",
            [],
        )
    unknown = sorted(set(columns) - set(CSV_COLUMNS))
    if unknown:
        raise UploadError(f"unknown CSV columns {unknown}; expected {list(CSV_COLUMNS)}", "body", [])
    # Which of two reply columns is the reply? Neither guess is safe.
    repeated = sorted(c for c, n in Counter(columns).items() if n > 1)
    if repeated:
        raise UploadError(f"the CSV header repeats {repeated}; name each column once", "body", [])
    for number, row in rows:
        if len(row) > len(columns):
            # An unquoted comma splits a field in two: keeping the columns that fit would index half a reply.
            extra = len(row) - len(columns)
            reason = f"{extra} more field{'s' if extra > 1 else ''} than the header; quote fields that contain commas"
            yield _Invalid(number, f"line {number}", reason)
            continue
        record: dict[str, Any] = {c: v for c, v in zip(columns, row, strict=False) if v != ""}
        if "tags" in record:
            record["tags"] = record["tags"].split(CSV_TAG_SEPARATOR)
        yield number, record


def _candidate(record: CandidateIn | DeleteIn) -> Candidate:
    if isinstance(record, DeleteIn):
        return Candidate(reply="", id=record.id)  # deleting by id: the reply is a placeholder
    return Candidate(
        reply=record.reply,
        query=record.query,
        id=record.id,
        metadata=dict(record.metadata) if record.metadata else None,
        kind=record.kind,
        language=record.language,
        tags=tuple(record.tags or ()),
    )


def parse_upload(body: bytes, content_type: str, mode: Mode, max_records: int, on_invalid: OnInvalid) -> Upload:
    """The upload's records, validated one by one as they are read. More than `max_records` records
    (invalid ones included) is a 413 naming `records` as soon as the first one past the limit is
    read: what follows is never parsed, so memory holds the body and at most the limit's records."""
    kind = (
        "csv" if "csv" in content_type else "ndjson" if "ndjson" in content_type or "jsonl" in content_type else "json"
    )
    items = _csv_items(body) if kind == "csv" else _ndjson_items(body) if kind == "ndjson" else _json_items(body)
    label = "record" if kind == "json" else "line"
    adapter: TypeAdapter[Any] = RECORD if mode == "delete" else _CANDIDATE
    records: list[Candidate] = []
    lines: list[int] = []
    reported: list[_Invalid] = []  # the first MAX_REPORTED invalid fields
    invalid_fields = invalid_records = count = 0
    for item in items:
        count += 1
        if count > max_records:
            raise UploadError(
                f"more than {max_records:,} records: the limit per upload (CHITCHAT_ADMIN_MAX_RECORDS); "
                "split the file, or append it in parts",
                "records",
                [],
                too_large=True,
            )
        if isinstance(item, _Invalid):
            errors = [item]
        else:
            number, raw = item
            try:
                record = adapter.validate_python(raw)
            except ValidationError as error:
                errors = []
                for e in error.errors():
                    where = ".".join(str(p) for p in e["loc"] if p not in ("CandidateIn", "DeleteIn"))
                    errors.append(_Invalid(number, f"{label} {number}" + (f".{where}" if where else ""), e["msg"]))
            else:
                if not (invalid_records and on_invalid == "reject"):  # a refused upload keeps nothing
                    records.append(_candidate(record))
                    lines.append(number)
                continue
        invalid_records += 1
        invalid_fields += len(errors)
        reported += errors[: MAX_REPORTED - len(reported)]
    details = [{"field": e.field, "message": e.message} for e in reported]
    if reported and on_invalid == "reject":
        first = reported[0]
        message = f"{invalid_fields} invalid fields; first: {first.field}: {first.message}"
        hint = " (send ?on_invalid=skip to index the valid records and report the rest)"
        raise UploadError(message + hint, first.field, details)
    if not records:
        raise UploadError("no valid records", "records", details)
    return Upload(
        records=records,
        lines=lines,
        skipped=[{"line": e.line, "field": e.field, "reason": e.message} for e in reported],
        skipped_count=invalid_records,
    )


def upload_body(kind: Literal["upsert", "delete"]) -> dict[str, Any]:
    """The OpenAPI request body of an upload (records) or a deletion (ids or records), the JSON form record by record.
    NDJSON (`application/x-ndjson`: one such record per line) and CSV
    (`text/csv`: a header naming reply, query, id, language, tags) are accepted too; a
    schema cannot describe their lines, so they are named, not published."""
    schema = (RECORD if kind == "delete" else _CANDIDATE).json_schema()
    definitions = schema.pop("$defs", {})
    # Inlined: a "#/$defs/..." reference inside an OpenAPI document would point at the document's root.
    branches = schema.get("anyOf", [schema])
    record = {"anyOf": [definitions[b["$ref"].rsplit("/", 1)[1]] if "$ref" in b else b for b in branches]}
    return {
        "required": True,
        "description": (
            "Also accepted: application/x-ndjson (one record per line) and text/csv "
            "(reply, query, id, language, tags separated by |)."
        ),
        "content": {"application/json": {"schema": {"type": "array", "minItems": 1, "items": record}}},
    }
