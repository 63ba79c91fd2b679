"""Candidate uploads: JSON (an array, or {"records": [...]}) or NDJSON, one
record per line, each validated on its own so every bad line is reported
with its number and reason."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import StringConstraints, TypeAdapter, ValidationError, field_validator

from app.schemas import Strict, Turn
from index.build import Candidate

Mode = Literal["replace", "append", "delete"]
RecordId = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._:-]+$")]
MAX_METADATA_BYTES = 4096  # kept per record in the candidate store; not a document store
MAX_REPORTED_ERRORS = 100  # a million bad lines get the first hundred reasons


class CandidateIn(Strict):
    reply: Turn
    query: Turn | None = None
    id: RecordId | None = None
    metadata: dict[str, Any] | None = None

    @field_validator("reply", "query")
    @classmethod
    def _not_blank(cls, text: str | None) -> str | None:
        if text is not None and not text.strip():
            raise ValueError("must not be blank")
        return text

    @field_validator("metadata")
    @classmethod
    def _small(cls, metadata: dict[str, Any] | None) -> dict[str, Any] | None:
        if metadata is not None and len(json.dumps(metadata)) > MAX_METADATA_BYTES:
            raise ValueError(f"must serialise to at most {MAX_METADATA_BYTES} bytes")
        return metadata


class DeleteIn(Strict):
    id: RecordId


_CANDIDATE = TypeAdapter(CandidateIn)
_DELETE = TypeAdapter(DeleteIn)


class UploadError(Exception):
    def __init__(self, message: str, field: str, details: list[dict[str, Any]], too_large: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.details = details
        self.too_large = too_large


def _items(body: bytes, ndjson: bool) -> list[tuple[int, Any]]:
    """(line or record number, parsed JSON) pairs; raises on a body that is not JSON at all."""
    if ndjson:
        items = []
        errors = []
        for number, line in enumerate(body.split(b"\n"), start=1):
            if not line.strip():
                continue
            try:
                items.append((number, json.loads(line)))
            except ValueError as error:
                errors.append({"field": f"line {number}", "message": f"invalid JSON: {error}"})
        if errors:
            raise UploadError(f"{len(errors)} lines are not JSON", errors[0]["field"], errors[:MAX_REPORTED_ERRORS])
        return items
    try:
        parsed = json.loads(body)
    except ValueError as error:
        raise UploadError(f"body is not JSON: {error}", "body", []) from error
    if isinstance(parsed, dict) and set(parsed) == {"records"}:
        parsed = parsed["records"]
    if not isinstance(parsed, list):
        raise UploadError('expected a JSON array of records, or {"records": [...]}', "body", [])
    return list(enumerate(parsed, start=1))


def parse_upload(body: bytes, content_type: str, mode: Mode, max_records: int) -> list[Candidate]:
    ndjson = "ndjson" in content_type or "jsonlines" in content_type
    items = _items(body, ndjson)
    label = "line" if ndjson else "record"
    if not items:
        raise UploadError("no records", "records", [])
    if len(items) > max_records:
        raise UploadError(f"{len(items)} records; the limit is {max_records}", "records", [], too_large=True)
    adapter: TypeAdapter[Any] = _DELETE if mode == "delete" else _CANDIDATE
    records = []
    errors: list[dict[str, Any]] = []
    for number, item in items:
        try:
            records.append(adapter.validate_python(item))
        except ValidationError as error:
            for e in error.errors():
                where = ".".join(str(p) for p in e["loc"])
                errors.append({"field": f"{label} {number}" + (f".{where}" if where else ""), "message": e["msg"]})
    if errors:
        first = errors[0]
        message = f"{len(errors)} invalid fields; first: {first['field']}: {first['message']}"
        raise UploadError(message, first["field"], errors[:MAX_REPORTED_ERRORS])
    if mode == "delete":
        # Only the id matters when deleting; the reply is a placeholder.
        return [Candidate(reply="", id=r.id) for r in records]
    return [Candidate(reply=r.reply, query=r.query, id=r.id, metadata=r.metadata) for r in records]
