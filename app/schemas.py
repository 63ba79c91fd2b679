"""Request and response models. Every limit lives here, on the field."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator

from app.engine.retriever import Strategy

MAX_TURNS = 20  # a reply looks at the last few turns; 20 is generous for any client
MAX_TURN_CHARS = 1000  # about 250 tokens, past the encoder's context window anyway
MAX_K = 50
MAX_PAIRS = 64  # one encoder batch
MAX_SESSION_ID_CHARS = 128
Cosine = Annotated[float, Field(ge=-1.0, le=1.0)]  # every threshold is on a cosine scale

Source = Strategy  # which strategy answered
Turn = Annotated[str, StringConstraints(min_length=1, max_length=MAX_TURN_CHARS)]
SessionId = Annotated[
    str, StringConstraints(min_length=1, max_length=MAX_SESSION_ID_CHARS, pattern=r"^[A-Za-z0-9._:-]+$")
]


def _not_blank(text: str) -> str:
    if not text.strip():
        raise ValueError("must not be blank")
    return text


class Strict(BaseModel):
    # Unknown fields are errors: a misspelt option must not be silently ignored.
    model_config = ConfigDict(extra="forbid")


class ThresholdOverrides(Strict):
    query_similarity: Cosine | None = Field(
        default=None, description="Serve the reply of the nearest stored query at or above this cosine."
    )
    reply_matching: Cosine | None = Field(
        default=None, description="Serve the best matched reply at or above this score, else fall back to a reaction."
    )

    def given(self) -> dict[str, float]:
        return {k: v for k, v in self.model_dump().items() if v is not None}


class ReplyRequest(Strict):
    context: list[Turn] | None = Field(
        default=None, min_length=1, max_length=MAX_TURNS, description="The conversation so far, oldest first."
    )
    session_id: SessionId | None = Field(default=None, description="Keep the context server-side under this id.")
    message: Turn | None = Field(default=None, description="The new user message, with session_id.")
    k: int | None = Field(default=None, ge=1, le=MAX_K, description="How many candidates to return.")
    strategies: list[Strategy] | None = Field(
        default=None, min_length=1, max_length=3, description="Strategies allowed, tried in the fixed order."
    )
    rerank: bool | None = Field(
        default=None, description="Rerank reply matching with the poly head; on by default when the model has one."
    )
    thresholds: ThresholdOverrides | None = Field(
        default=None, description="Override the model's calibrated thresholds for this request."
    )

    @field_validator("context")
    @classmethod
    def _turns_not_blank(cls, turns: list[str] | None) -> list[str] | None:
        for turn in turns or []:
            _not_blank(turn)
        return turns

    @field_validator("message")
    @classmethod
    def _message_not_blank(cls, message: str | None) -> str | None:
        return None if message is None else _not_blank(message)

    @field_validator("strategies")
    @classmethod
    def _unique(cls, strategies: list[str] | None) -> list[str] | None:
        if strategies is not None and len(set(strategies)) != len(strategies):
            raise ValueError("strategies must not repeat")
        return strategies


class Candidate(BaseModel):
    id: str
    text: str
    score: float
    source: Source


class ReplyResponse(BaseModel):
    reply: str
    id: str
    source: Source
    score: float
    reranked: bool  # whether the poly head reordered the reply-matching candidates
    candidates: list[Candidate]
    index_version: str
    session_id: str | None = None


class SimilarRequest(Strict):
    text: Turn | None = Field(default=None, description="Find the stored queries most similar to this.")
    pairs: list[tuple[Turn, Turn]] | None = Field(
        default=None, min_length=1, max_length=MAX_PAIRS, description="Sentence pairs to score."
    )
    k: int | None = Field(default=None, ge=1, le=MAX_K)


class SimilarQuery(BaseModel):
    query: str
    reply: str
    score: float


class SimilarResponse(BaseModel):
    matches: list[SimilarQuery] | None = None
    scores: list[float] | None = None  # one cosine per input pair, in order
    index_version: str


class Health(BaseModel):
    status: Literal["ok"]


class Readiness(BaseModel):
    ready: bool
    bundle: str | None
    index_version: str | None
    redis: Literal["up", "down", "disabled"]


class Info(BaseModel):
    model: dict[str, object]
    index: dict[str, object]
    redis: Literal["up", "down", "disabled"]
