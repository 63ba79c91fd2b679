"""Response models.

Unknown fields are kept, not rejected: the server may add fields (a job's ``skipped``, say) before this client
knows them, and they stay reachable through ``model_extra`` and in ``model_dump()``. Values the server may
extend (a reply's source, a job's state or stage) are plain strings for the same reason.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "Candidate",
    "Health",
    "IndexInfo",
    "Info",
    "Job",
    "JobList",
    "Readiness",
    "ReplyResult",
    "RollbackResult",
    "SetInfo",
    "SetList",
    "SimilarMatch",
    "SimilarResult",
    "UploadAccepted",
]

# Every other state is final; a state added later ends a wait instead of hanging it.
ACTIVE_STATES = frozenset({"queued", "running"})


class _Model(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)


class Candidate(_Model):
    id: str
    text: str
    score: float
    source: str  # query_similarity, reply_matching or reaction


class ReplyResult(_Model):
    reply: str
    id: str
    source: str  # the strategy that answered
    score: float
    reranked: bool
    # Probability that reply matching's top reply is acceptable; absent when reply matching did not run
    # or the model has no confidence head.
    confidence: float | None = None
    candidates: list[Candidate] = Field(default_factory=list)
    index_version: str
    set: str = "default"  # the candidate set it was answered from
    session_id: str | None = None


class SimilarMatch(_Model):
    query: str
    reply: str
    score: float


class SimilarResult(_Model):
    """`matches` for a text query, `scores` (one per pair, in order) for pairs; the other is None."""

    matches: list[SimilarMatch] | None = None
    scores: list[float] | None = None
    index_version: str
    set: str = "default"


class Health(_Model):
    status: str


class Readiness(_Model):
    ready: bool
    bundle: str | None = None
    index_version: str | None = None
    redis: str | None = None  # up, down or disabled
    problem: str | None = None  # why not ready: loading, draining, or what failed to load


class Info(_Model):
    model: dict[str, Any]
    index: dict[str, Any]
    redis: str


class UploadAccepted(_Model):
    """The 202 an upload gets: the reindex job was queued."""

    job_id: str
    set: str = "default"  # the candidate set the upload goes to
    state: str
    mode: str
    records: int  # the records that go ahead
    skipped: int = 0  # invalid records dropped (on_invalid="skip"); the job's report names them
    status: str  # the job's path: /admin/jobs/<job_id>, or /admin/sets/<set>/jobs/<job_id>


class Job(_Model):
    id: str
    mode: str
    state: str  # queued, running, succeeded, failed
    stage: str = "queued"  # queued, load, encode, index, validate, commit, swap, done
    progress: float = 0.0  # of the current stage, 0..1
    counts: dict[str, int] = Field(default_factory=dict)
    # {"skipped": n, "skipped_records": [{line, field, reason}, ...], "duplicates": {rule name: {records,
    # lines, rule}}}: what the upload dropped and which duplicates were resolved, and how.
    report: dict[str, Any] = Field(default_factory=dict)
    version: str | None = None  # the index version it built
    previous_version: str | None = None  # what served before it
    error: str | None = None
    created_at: float | None = None  # Unix seconds
    updated_at: float | None = None

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
    set: str = "default"
    current: str
    previous: str | None = None
    versions: list[str] = Field(default_factory=list)  # oldest first
    replies: int
    queries: int
    source: str
    model_checksum: str
    stored_candidates: int


class RollbackResult(_Model):
    """The version that served before (`from` in JSON) and the one that serves now."""

    set: str = "default"
    from_version: str = Field(alias="from")
    to_version: str = Field(alias="to")
    # "publish" and "prune", each "done" or "failed: ...": the rollback serves either way.
    after_swap: dict[str, str] = Field(default_factory=dict)


class SetInfo(_Model):
    """One candidate set, as GET /admin/sets lists it; counts absent while it has no index version."""

    name: str
    ready: bool
    version: str | None = None
    replies: int | None = None
    queries: int | None = None
    reactions: int | None = None
    tags: int | None = None  # distinct tags on its replies
    index_bytes: int | None = None  # its FAISS indexes, held in each replica's memory
    problem: str | None = None


class SetList(_Model):
    sets: list[SetInfo] = Field(default_factory=list)
    limits: dict[str, int] = Field(default_factory=dict)  # max_sets, max_total_candidates
