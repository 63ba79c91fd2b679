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
import io
import json
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
from index.candidates import RECORD_LINES

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
        """The job's report. RECORD_LINES is the reindexer's, to name the lines of the duplicates it
        finds against the stored candidates; it takes it out before the job is saved."""
        return {"skipped": self.skipped_count, "skipped_records": self.skipped, RECORD_LINES: self.lines}


@dataclass
class _Invalid:
    line: int
    field: str  # "line 2.reply", "record 2.reply": the 422's field, and the skipped record's
    message: str


def _json_items(body: bytes) -> list[tuple[int, Any]]:
    try:
        parsed = json.loads(body)
    except ValueError as error:
        raise UploadError(f"body is not JSON: {error}", "body", []) from error
    except RecursionError as error:  # json's parser recurses once per nesting level
        raise UploadError("body is nested too deeply to be a list of records", "body", []) from error
    if isinstance(parsed, dict) and set(parsed) == {"records"}:
        parsed = parsed["records"]
    if not isinstance(parsed, list):
        raise UploadError('expected a JSON array of records, or {"records": [...]}', "body", [])
    return list(enumerate(parsed, start=1))


def _ndjson_items(body: bytes) -> tuple[list[tuple[int, Any]], list[_Invalid]]:
    items, errors = [], []
    for number, line in enumerate(body.split(b"\n"), start=1):
        if not line.strip():
            continue
        try:
            items.append((number, json.loads(line)))
        except ValueError as error:
            errors.append(_Invalid(number, f"line {number}", f"invalid JSON: {error}"))
        except RecursionError:  # json's parser recurses once per nesting level
            errors.append(_Invalid(number, f"line {number}", "nested too deeply to be a record"))
    return items, errors


def _csv_rows(text: str) -> Iterator[tuple[int, list[str]]]:
    """(first line, fields) per record. A quoted field may span lines: the record is named by its first,
    where an editor shows it starting; csv's line_num is its last."""
    reader = csv.reader(io.StringIO(text, newline=""))
    first = 1
    for row in reader:
        if row:  # csv reads a blank line as []
            yield first, row
        first = reader.line_num + 1


def _csv_items(body: bytes) -> tuple[list[tuple[int, Any]], list[_Invalid]]:
    try:
        text = body.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise UploadError(f"CSV is not UTF-8: {error}", "body", []) from error
    rows = _csv_rows(text)
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
    items, errors = [], []
    for number, row in rows:
        if len(row) > len(columns):
            # An unquoted comma splits a field in two: keeping the columns that fit would index half a reply.
            extra = len(row) - len(columns)
            reason = f"{extra} more field{'s' if extra > 1 else ''} than the header; quote fields that contain commas"
            errors.append(_Invalid(number, f"line {number}", reason))
            continue
        record: dict[str, Any] = {c: v for c, v in zip(columns, row, strict=False) if v != ""}
        if "tags" in record:
            record["tags"] = record["tags"].split(CSV_TAG_SEPARATOR)
        items.append((number, record))
    return items, errors


def parse_upload(body: bytes, content_type: str, mode: Mode, max_records: int, on_invalid: OnInvalid) -> Upload:
    kind = (
        "csv" if "csv" in content_type else "ndjson" if "ndjson" in content_type or "jsonl" in content_type else "json"
    )
    errors: list[_Invalid] = []
    if kind == "csv":
        items, errors = _csv_items(body)
    elif kind == "ndjson":
        items, errors = _ndjson_items(body)
    else:
        items = _json_items(body)
    label = "record" if kind == "json" else "line"
    count = len(items) + len({e.line for e in errors})  # the unparsable lines were records too
    if count > max_records:
        raise UploadError(f"{count} records; the limit is {max_records}", "records", [], too_large=True)
    adapter: TypeAdapter[Any] = RECORD if mode == "delete" else _CANDIDATE
    accepted: list[tuple[int, Any]] = []
    for number, item in items:
        try:
            accepted.append((number, adapter.validate_python(item)))
        except ValidationError as error:
            for e in error.errors():
                where = ".".join(str(p) for p in e["loc"] if p not in ("CandidateIn", "DeleteIn"))
                errors.append(_Invalid(number, f"{label} {number}" + (f".{where}" if where else ""), e["msg"]))
    errors.sort(key=lambda e: e.line)  # stable: a record's fields stay in pydantic's order
    details = [{"field": e.field, "message": e.message} for e in errors[:MAX_REPORTED]]
    if errors and on_invalid == "reject":
        first = errors[0]
        message = f"{len(errors)} invalid fields; first: {first.field}: {first.message}"
        hint = " (send ?on_invalid=skip to index the valid records and report the rest)"
        raise UploadError(message + hint, first.field, details)
    if not accepted:
        raise UploadError("no valid records", "records", details)
    records = [
        Candidate(
            reply=r.reply,
            query=r.query,
            id=r.id,
            metadata=dict(r.metadata) if r.metadata else None,
            kind=r.kind,
            language=r.language,
            tags=tuple(r.tags or ()),
        )
        if isinstance(r, CandidateIn)
        else Candidate(reply="", id=r.id)  # deleting by id: the reply is a placeholder
        for _, r in accepted
    ]
    return Upload(
        records=records,
        lines=[number for number, _ in accepted],
        skipped=[{"line": e.line, "field": e.field, "reason": e.message} for e in errors[:MAX_REPORTED]],
        skipped_count=len({e.line for e in errors}),
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
