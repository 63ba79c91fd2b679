"""Response models: the service's own (app/client/answers.py, which the server declares as its response
models), under the names this client has always given them.

Unknown fields are kept, not rejected: the server may add fields (a job's ``skipped``, say) before this client
knows them, and they stay reachable through ``model_extra`` and in ``model_dump()``. Values the server may
extend (a reply's source, a job's state or stage) are plain strings for the same reason.
"""

from __future__ import annotations

from app.client.answers import ACTIVE_STATES as ACTIVE_STATES  # kept importable from here, where it was
from app.client.answers import (
    Candidate,
    Encoders,
    Health,
    IndexInfo,
    Info,
    Job,
    JobList,
    Readiness,
    ReplyResponse,
    RollbackResult,
    SetInfo,
    SetList,
    SimilarQuery,
    SimilarResponse,
    UploadAccepted,
)

__all__ = [
    "Candidate",
    "Encoders",
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

# The server's names are the schema's (`ReplyResponse` in /openapi.json); the client's read as what a call returns.
ReplyResult = ReplyResponse
SimilarMatch = SimilarQuery
SimilarResult = SimilarResponse
