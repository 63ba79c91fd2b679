"""The service's answers, one pydantic model each: defined once, for both sides.

The server declares them as its routes' response models, so that the OpenAPI schema publishes each answer's
shape; the client parses with them (app/client/models.py, under its own names). They live in the client because
the client imports nothing from the server: pydantic and the standard library only.

Parsed leniently, published as the server answers:

- Unknown fields are kept, not rejected: the server may add fields (a job's ``skipped``, say) before this client
  knows them, and they stay reachable through ``model_extra`` and in ``model_dump()``.
- Values the server may extend (a reply's source, a job's state or stage) parse as plain strings for the same
  reason; where the server publishes a fixed set of them, the schema lists it.
- A field an older server may not send has a default; the published schema still lists as required each field
  this server always sends, and leaves out those a route may omit (`_omittable`).
- A part the client has always handed out as a plain dict (`Info.model`, `Job.report`) stays one; the schema
  publishes the shape of its known keys (`_shaped`), more keys allowed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, GetPydanticSchema, WithJsonSchema

__all__ = [
    "Candidate",
    "Encoders",
    "Health",
    "IndexInfo",
    "Info",
    "Job",
    "JobList",
    "Readiness",
    "ReplyResponse",
    "RollbackResult",
    "SetDeleted",
    "SetInfo",
    "SetList",
    "SimilarQuery",
    "SimilarResponse",
    "UploadAccepted",
]

# Every other state is final; a state added later ends a wait instead of hanging it.
ACTIVE_STATES = frozenset({"queued", "running"})
# The server's own sets of values (core.retriever.Strategy, app.engine.kv.Status), which the client cannot
# import; tests/test_response_models.py holds them equal.
STRATEGIES = ("query_similarity", "reply_matching", "reaction")
REDIS_STATES = ("up", "down", "disabled")

StrategyName = Annotated[str, WithJsonSchema({"type": "string", "enum": list(STRATEGIES)})]
RedisState = Annotated[str, WithJsonSchema({"type": "string", "enum": list(REDIS_STATES)})]


def _omittable(*names: str) -> Callable[[dict[str, Any]], None]:
    """For `json_schema_extra`: fields a route leaves out of its answer (when null, or unknown), and so not
    required in the published schema."""

    def edit(schema: dict[str, Any]) -> None:
        required = [name for name in schema.get("required", []) if name not in names]
        if required:
            schema["required"] = required
        else:
            schema.pop("required", None)

    return edit


def _shaped(model: type[BaseModel]) -> GetPydanticSchema:
    """For a `dict[str, Any]` field: published with `model`'s shape, parsed as a plain dict and not held to
    it, so that `info.model["name"]` keeps working and an older server's fewer keys still parse.
    tests/test_response_models.py holds the server's answers to the shape."""
    return GetPydanticSchema(get_pydantic_json_schema=lambda _schema, handler: handler(model.__pydantic_core_schema__))


# Fields are declared in the order the server sends them: the server writes an answer in its model's order.
class _Model(BaseModel):
    model_config = ConfigDict(
        extra="allow",
        populate_by_name=True,
        # What the server answers: a field with a default is still always sent, unless `_omittable` says not.
        json_schema_serialization_defaults_required=True,
    )


# --- /reply, /similar ---------------------------------------------------------------------------------------


class Candidate(_Model):
    id: str
    text: str
    score: float
    source: StrategyName


class ReplyResponse(_Model):
    # Left out when null: `confidence` when reply matching did not run or the model has no confidence head,
    # `session_id` for a reply to a whole context.
    model_config = ConfigDict(json_schema_extra=_omittable("confidence", "session_id"))

    reply: str
    id: str
    source: StrategyName  # the strategy that answered
    score: float
    reranked: bool  # whether the poly head reordered the reply-matching candidates
    # Probability that reply matching's top reply is acceptable, when it ran and the model has a confidence
    # model; below the reaction threshold a reaction answers instead.
    confidence: float | None = None
    candidates: list[Candidate] = Field(default_factory=list)
    index_version: str
    set: str = "default"  # the candidate set it was answered from, at `index_version`
    session_id: str | None = None


class SimilarQuery(_Model):
    query: str
    reply: str
    score: float


class SimilarResponse(_Model):
    """`matches` for a text query, `scores` (one per pair, in order) for pairs; the other is left out."""

    model_config = ConfigDict(json_schema_extra=_omittable("matches", "scores", "index_version"))

    matches: list[SimilarQuery] | None = None
    scores: list[float] | None = None  # one cosine per input pair, in order
    index_version: str | None = None  # left out: pairs scored by a set that serves no version yet
    set: str = "default"


# --- /healthz, /readyz, /info -------------------------------------------------------------------------------


class Health(_Model):
    status: Annotated[str, WithJsonSchema({"type": "string", "const": "ok"})]


class Readiness(_Model):
    ready: bool
    bundle: str | None = None
    index_version: str | None = None  # the default set's
    sets: dict[str, str | None] = Field(default_factory=dict)  # each set's index version, None while it has none
    # Parsed when absent or null, published as what this server always sends.
    redis: Annotated[str | None, WithJsonSchema({"type": "string", "enum": list(REDIS_STATES)})] = None
    problem: str | None = None  # why not ready: loading, draining, or what failed to load


class ContextWay(_Model):
    """How a conversation becomes its context vector on this server (core/context.py)."""

    model_config = ConfigDict(json_schema_extra=_omittable("why", "bot_turns_read_as"))

    way: str  # "joined" or "per_turn"
    turns: int
    why: str | None = None  # joined: why not per turn
    bot_turns_read_as: str | None = None  # per turn: "reply" or "context"


class PolyHead(_Model):
    codes: int
    weight: float


class Reactions(_Model):
    labels: list[str]
    language: str
    translations: dict[str, list[str]]


class ReactionModel(_Model):
    name: str
    checksum: str
    reads: str


class ReactionSetInfo(_Model):
    source: str  # "model" or "upload"
    language: str
    count: int


class ConfidenceHead(_Model):
    features: list[str]
    validation_auroc: float


class Thresholds(_Model):
    query_similarity: float
    reply_matching: float


class ReactionShare(_Model):
    share: float
    of: str
    threshold_now: float
    starting_threshold: float
    warmup_turns: int
    validation_threshold: float


class ModelInfo(_Model):
    """`/info`'s `model`: the bundle, and what this server applies of it."""

    encoder: str  # what a set names it by
    name: str
    model_id: str
    kind: str
    checksum: str
    dim: int
    layers: int
    quantization: str
    encoder_sessions: dict[str, Any] | None
    max_context_turns: int
    context: ContextWay
    poly: PolyHead | None
    rerank_by_default: bool  # whether a request that does not say is reranked
    language: str
    languages: list[str]
    reactions: Reactions | None
    reaction_model: ReactionModel | None
    reaction_sets: list[ReactionSetInfo]
    reaction_fallback: str
    confidence: ConfidenceHead | None
    thresholds: Thresholds  # what this server applies
    thresholds_from: str
    reaction_share: ReactionShare | None
    calibration: dict[str, Any]
    eval: dict[str, Any]
    release: dict[str, Any] | None
    training: dict[str, Any] | None


class AnnInfo(_Model):
    kind: str
    ef_search: int
    recall_at_10: float
    nprobe: int


class IndexVersionInfo(_Model):
    """`/info`'s `index`: the set's served index version."""

    set: str
    version: str
    replies: int
    queries: int
    source: str
    created_at: str
    ann: dict[str, AnnInfo]  # "replies", "queries"
    profile: dict[str, float]
    versions: list[str]  # every version in the store


class FirstBuild(_Model):
    model_config = ConfigDict(json_schema_extra=_omittable("error"))

    state: str  # pending, building, done, failed, dropped
    job_id: str | None
    replies_indexed_of_total: list[int]  # [indexed, total]
    seconds_left: int | None
    error: str | None = None


class Info(_Model):
    model: Annotated[dict[str, Any], _shaped(ModelInfo)]
    index: Annotated[dict[str, Any], _shaped(IndexVersionInfo)]
    redis: RedisState
    # While the default set serves a first slice (`make run` on a fresh clone): the full build behind
    # it, its replies indexed of the total and the seconds left at the current rate. Null otherwise.
    first_build: Annotated[dict[str, Any], _shaped(FirstBuild)] | None = None


# --- /admin -------------------------------------------------------------------------------------------------


class UploadAccepted(_Model):
    """The 202 an upload gets: the reindex job was queued."""

    job_id: str
    set: str = "default"  # the candidate set the upload goes to
    state: str
    mode: str
    records: int  # the records that go ahead
    skipped: int = 0  # invalid records dropped (on_invalid="skip"); the job's report names them
    status: str  # the job's path: /admin/jobs/<job_id>, or /admin/sets/<set>/jobs/<job_id>


class SkippedRecord(_Model):
    line: int
    field: str
    reason: str


class Duplicates(_Model):
    records: int
    lines: list[int]  # the first few
    rule: str


class JobReport(_Model):
    """A job's `report`: what the upload dropped, which duplicates were resolved and how, and what the
    steps after the swap did; each part once the job has it."""

    model_config = ConfigDict(
        json_schema_extra=_omittable("skipped", "skipped_records", "encoder", "duplicates", "after_swap")
    )

    skipped: int = 0
    skipped_records: list[SkippedRecord] = Field(default_factory=list)
    encoder: str | None = None
    duplicates: dict[str, Duplicates] = Field(default_factory=dict)  # rule name -> what it found
    after_swap: dict[str, str] = Field(default_factory=dict)  # step -> "done" or "failed: ..."


class Job(_Model):
    id: str
    mode: str
    state: str  # queued, running, succeeded, failed
    stage: str = "queued"  # queued, load, encode, index, validate, commit, swap, done
    progress: float = 0.0  # of the current stage, 0..1
    counts: dict[str, int] = Field(default_factory=dict)
    report: Annotated[dict[str, Any], _shaped(JobReport)] = Field(default_factory=dict)
    version: str | None = None  # the index version it built
    previous_version: str | None = None  # what served before it
    error: str | None = None
    created_at: float | None = None  # Unix seconds
    updated_at: float | None = None
    owner: str = ""  # "replica/boot" of the process that ran it

    @property
    def done(self) -> bool:
        return self.state not in ACTIVE_STATES

    @property
    def succeeded(self) -> bool:
        return self.state == "succeeded"


class JobList(_Model):
    """GET /admin/jobs: the most recent jobs, newest first."""

    jobs: list[Job] = Field(default_factory=list)


class IndexInfo(_Model):
    """A set's versions and counts; nothing current (`problem` says why) while it has no version yet."""

    set: str = "default"
    versions: list[str] = Field(default_factory=list)  # oldest first
    stored_candidates: int
    current: str | None
    previous: str | None = None
    replies: int
    queries: int
    source: str | None
    model_checksum: str | None
    problem: str | None = None  # why nothing is current


class RollbackResult(_Model):
    """The version that served before (`from` in JSON) and the one that serves now."""

    set: str = "default"
    from_version: str = Field(alias="from")
    to_version: str = Field(alias="to")
    # "store", "publish" and "prune", each "done" or "failed: ...": the rollback serves either way.
    after_swap: dict[str, str] = Field(default_factory=dict)


class SetInfo(_Model):
    """One candidate set, as GET /admin/sets lists it: `problem` while it has no index version, what it
    serves otherwise."""

    model_config = ConfigDict(
        json_schema_extra=_omittable(
            "problem", "encoder", "replies", "queries", "reactions", "tags", "index_bytes", "created_at", "source"
        )
    )

    name: str
    ready: bool
    problem: str | None = None  # sent only by a set with no index version, before its `version` (null)
    encoder: str | None = None  # the shipped bundle it is encoded with
    version: str | None = None
    replies: int | None = None
    queries: int | None = None
    reactions: int | None = None
    tags: int | None = None  # distinct tags on its replies
    index_bytes: int | None = None  # its FAISS indexes, held in each replica's memory
    created_at: str | None = None  # of its version
    source: str | None = None


class Encoders(_Model):
    default: str
    available: list[str]  # the shipped bundles a set may name
    loaded: list[str]  # those a set uses


class SetList(_Model):
    sets: list[SetInfo] = Field(default_factory=list)
    encoders: Encoders | None = None  # None from a server that predates a set's own encoder
    limits: dict[str, int] = Field(default_factory=dict)  # max_sets, max_total_candidates


class SetDeleted(_Model):
    deleted: str  # the set's name
