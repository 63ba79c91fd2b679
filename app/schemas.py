"""Request models. Every limit lives here, on the field.

The response models are in app/client/answers.py: the client parses with them too, and it imports nothing
of the server's."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import Query
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    WithJsonSchema,
    field_validator,
)

from app.engine.sets import DEFAULT_SET, SET_NAME
from core.filters import Filter
from core.retriever import Strategy
from core.text import SCRIPT_OF_LANGUAGE

MAX_TURNS = 20  # a reply looks at the last few turns; 20 is generous for any client
MAX_TURN_CHARS = 1000  # about 250 tokens, past the encoder's context window anyway
MAX_K = 50
MAX_PAIRS = 64  # one encoder batch
MAX_SESSION_ID_CHARS = 128
MAX_TAGS = 16  # on a record, and in each list of a filter
MAX_EXCLUDE_IDS = 256  # a client excluding what it said recently needs tens, not thousands
MAX_ID_CHARS = 128

# The largest body the encoder routes' schemas allow, as json.dumps writes it by default
# (ensure_ascii): a character outside the BMP takes 12 bytes ("\ud83d\ude00"), a Hangul syllable 6.
# The body limit must let it through: at 64 KiB, twenty turns of 1,000 Korean characters from a
# Python client (120 kB) would be refused with 413 though their schema lets them through.
ESCAPED_CHAR_BYTES = 12
OTHER_FIELDS_BYTES = 16 * 1024  # every other field at its limit, and JSON's punctuation, with room to spare
BODY_LIMITS = {
    "/reply": MAX_TURNS * MAX_TURN_CHARS * ESCAPED_CHAR_BYTES
    + MAX_EXCLUDE_IDS * (MAX_ID_CHARS + 4)
    + OTHER_FIELDS_BYTES,
    "/similar": MAX_PAIRS * 2 * MAX_TURN_CHARS * ESCAPED_CHAR_BYTES + OTHER_FIELDS_BYTES,
}

# Strict: JSON `true` is not a k of 1, nor "0.5" a threshold.
Cosine = Annotated[float, Field(ge=-1.0, le=1.0, strict=True)]  # every threshold is on a cosine scale

# A line of chat: no control characters but tab and newline, and at least one
# character that is not whitespace or an invisible format character (zero-width
# spaces and joiners, byte-order marks, direction marks). One pattern, checked
# here and published in the OpenAPI schema, so that clients and fuzzers see
# the rule the service applies.
_CONTROL = r"\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f"
_INVISIBLE = r"\s\xa0\xad\u1680\u180e\u2000-\u200f\u2028-\u202f\u205f-\u2064\u2066-\u206f\u3000\ufeff"
TEXT_PATTERN = f"^[^{_CONTROL}]*[^{_CONTROL}{_INVISIBLE}][^{_CONTROL}]*$"
_TEXT = re.compile(TEXT_PATTERN)
_HAS_CONTROL = re.compile(f"[{_CONTROL}]")


def _visible_text(text: str) -> str:
    if _TEXT.fullmatch(text) is None:
        raise ValueError("must not contain control characters" if _HAS_CONTROL.search(text) else "must not be blank")
    return text


Turn = Annotated[
    str,
    StringConstraints(min_length=1, max_length=MAX_TURN_CHARS),
    AfterValidator(_visible_text),
    Field(json_schema_extra={"pattern": TEXT_PATTERN}),
]
SessionId = Annotated[
    str, StringConstraints(min_length=1, max_length=MAX_SESSION_ID_CHARS, pattern=r"^[A-Za-z0-9._:-]+$")
]


def _whole_number(value: object) -> object:
    """JSON's integers: 5 and 5.0, not true, not "5"."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError("must be an integer")
    if isinstance(value, float):
        if not value.is_integer():
            raise ValueError("must be an integer")
        return int(value)
    return value


Count = Annotated[int, Field(ge=1, le=MAX_K), BeforeValidator(_whole_number)]
# A candidate set's name (app/engine/sets.py): it becomes a directory name, so it is checked first.
SetName = Annotated[str, StringConstraints(min_length=1, max_length=32, pattern=f"^{SET_NAME.pattern}$")]
SetQuery = Annotated[SetName, Query(description="A candidate set; the default set unless named.")]
# A candidate's id, as uploaded or as /reply returns it ("reaction:3" for the model's reactions).
CandidateId = Annotated[str, StringConstraints(min_length=1, max_length=MAX_ID_CHARS, pattern=r"^[A-Za-z0-9._:-]+$")]
# A tag on a candidate ("kids", "campaign-2026", "persona:mina"): a short slug, compared exactly.
Tag = Annotated[str, StringConstraints(min_length=1, max_length=32, pattern=r"^[A-Za-z0-9._:-]+$")]


def _known_language(code: str) -> str:
    if code not in SCRIPT_OF_LANGUAGE:
        raise ValueError(f"must be one of {sorted(SCRIPT_OF_LANGUAGE)}: the languages whose script is known")
    return code


Language = Annotated[
    str, AfterValidator(_known_language), WithJsonSchema({"type": "string", "enum": sorted(SCRIPT_OF_LANGUAGE)})
]
# A filter's language: one of them, or "any", for replies in every language.
ANY_LANGUAGE = "any"


def _known_language_or_any(code: str) -> str:
    return code if code == ANY_LANGUAGE else _known_language(code)


FilterLanguage = Annotated[
    str,
    AfterValidator(_known_language_or_any),
    WithJsonSchema({"type": "string", "enum": [ANY_LANGUAGE, *sorted(SCRIPT_OF_LANGUAGE)]}),
]


def _no_repeats(items: list[str]) -> list[str]:
    if len(set(items)) != len(items):
        raise ValueError("must not repeat")
    return items


Tags = Annotated[
    list[Tag],
    Field(min_length=1, max_length=MAX_TAGS, json_schema_extra={"uniqueItems": True}),
    AfterValidator(_no_repeats),
]


class Strict(BaseModel):
    # Unknown fields are errors: a misspelt option must not be silently ignored.
    model_config = ConfigDict(extra="forbid")


def _without_nulls(one_of: list[dict[str, Any]] | None = None) -> Callable[[dict[str, Any]], None]:
    """Publishes optional fields as optional, not as nullable: the schema lists
    only the value's own type, as the service accepts it. With `one_of`, also
    which fields must come together."""

    def edit(schema: dict[str, Any]) -> None:
        for name, prop in schema.get("properties", {}).items():
            branches = prop.get("anyOf", [])
            kept = [b for b in branches if b != {"type": "null"}]
            if len(kept) < len(branches):
                del prop["anyOf"]
                prop.pop("default", None)
                schema["properties"][name] = {**(kept[0] if len(kept) == 1 else {"anyOf": kept}), **prop}
        if one_of:
            schema["oneOf"] = one_of

    return edit


class Options(Strict):
    """A request whose optional fields are left out when not given, never sent as
    null: the published schema says so, and a null is an error naming its field."""

    model_config = ConfigDict(extra="forbid", json_schema_extra=_without_nulls())

    @field_validator("*", mode="before")
    @classmethod
    def _not_null(cls, value: object) -> object:
        if value is None:
            raise ValueError("leave the field out rather than sending null")
        return value


class ThresholdOverrides(Options):
    query_similarity: Cosine | None = Field(
        default=None, description="Serve the reply of the nearest stored query at or above this cosine."
    )
    reply_matching: Cosine | None = Field(
        default=None, description="Serve the best matched reply at or above this score, else fall back to a reaction."
    )

    def given(self) -> dict[str, float]:
        return {k: v for k, v in self.model_dump().items() if v is not None}


class ReplyFilter(Options):
    """Which candidates may answer: every condition given must hold."""

    tags_any: Tags | None = Field(default=None, description="Only candidates with at least one of these tags.")
    tags_all: Tags | None = Field(default=None, description="Only candidates with every one of these tags.")
    tags_none: Tags | None = Field(default=None, description="No candidate with any of these tags.")
    language: FilterLanguage | None = Field(
        default=None,
        description='Only candidates uploaded with this language; "any": every language. Left out, a set whose '
        "every reply carries a language (the default set: English and Korean) answers from the replies in the "
        "conversation's language.",
    )

    def rule(self, exclude_ids: list[str] | None = None) -> Filter:
        return Filter(
            tags_any=frozenset(self.tags_any or ()),
            tags_all=frozenset(self.tags_all or ()),
            tags_none=frozenset(self.tags_none or ()),
            language=None if self.language == ANY_LANGUAGE else self.language,
            exclude_ids=frozenset(exclude_ids or ()),
        )


class ReplyRequest(Options):
    # Either a whole context, or a session id with the new message.
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra=_without_nulls(
            [
                {"required": ["context"], "not": {"anyOf": [{"required": ["session_id"]}, {"required": ["message"]}]}},
                {"required": ["session_id", "message"], "not": {"required": ["context"]}},
            ]
        ),
    )

    context: Annotated[list[Turn], Field(min_length=1, max_length=MAX_TURNS)] | None = Field(
        default=None, description="The conversation so far, oldest first."
    )
    session_id: SessionId | None = Field(default=None, description="Keep the context server-side under this id.")
    message: Turn | None = Field(default=None, description="The new user message, with session_id.")
    k: Count | None = Field(default=None, description="How many candidates to return.")
    strategies: (
        Annotated[list[Strategy], Field(min_length=1, max_length=3, json_schema_extra={"uniqueItems": True})] | None
    ) = Field(default=None, description="Strategies allowed, tried in the fixed order; no repeats.")
    rerank: Annotated[bool, Field(strict=True)] | None = Field(
        default=None,
        description="Rerank reply matching with the poly head, where the model has one (`reranked` in the "
        "answer says whether it ran); absent: the service's default, off unless CHITCHAT_RERANK_BY_DEFAULT is set.",
    )
    thresholds: ThresholdOverrides | None = Field(
        default=None, description="Override the model's calibrated thresholds for this request."
    )
    set: SetName = Field(default=DEFAULT_SET, description="The candidate set to answer from.")
    filter: ReplyFilter | None = Field(default=None, description="Answer only from candidates that match.")
    exclude_ids: Annotated[list[CandidateId], Field(min_length=1, max_length=MAX_EXCLUDE_IDS)] | None = Field(
        default=None, description="Never answer with these candidate ids (as /reply returns them)."
    )

    def rule(self) -> Filter | None:
        """The request's filter and exclusions as one rule; None when it has neither."""
        if self.filter is None and self.exclude_ids is None:
            return None
        return (self.filter or ReplyFilter()).rule(self.exclude_ids)

    @property
    def route_language(self) -> bool:
        """Whether the conversation's language chooses the replies searched: unless the filter says "any"
        (or names a language, which then chooses)."""
        return self.filter is None or self.filter.language != ANY_LANGUAGE

    @field_validator("strategies")
    @classmethod
    def _unique(cls, strategies: list[str] | None) -> list[str] | None:
        if strategies is not None and len(set(strategies)) != len(strategies):
            raise ValueError("strategies must not repeat")
        return strategies


class SimilarRequest(Options):
    model_config = ConfigDict(
        extra="forbid",
        # Either a text (and a k), or pairs.
        json_schema_extra=_without_nulls(
            [
                {"required": ["text"], "not": {"required": ["pairs"]}},
                {"required": ["pairs"], "not": {"anyOf": [{"required": ["text"]}, {"required": ["k"]}]}},
            ]
        ),
    )

    text: Turn | None = Field(default=None, description="Find the stored queries most similar to this.")
    pairs: Annotated[list[tuple[Turn, Turn]], Field(min_length=1, max_length=MAX_PAIRS)] | None = Field(
        default=None, description="Sentence pairs to score."
    )
    k: Count | None = Field(default=None, description="How many stored queries to return (with text).")
    set: SetName = Field(default=DEFAULT_SET, description="The candidate set whose stored queries to search.")
