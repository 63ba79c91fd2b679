"""A typed client for the chit-chat retrieval service, sync and async, on httpx.

It imports nothing from the server: only the standard library, httpx, pydantic and tqdm.

    from app.client import ChitchatClient

    with ChitchatClient("http://127.0.0.1:8000") as chitchat:
        print(chitchat.reply(["hi! how are you?"]).reply)
"""

from app.client._async import AsyncChitchatClient
from app.client._sync import ChitchatClient
from app.client.errors import (
    ChitchatError,
    Conflict,
    ConnectionFailed,
    InternalError,
    MethodNotAllowed,
    NoCandidate,
    NotFound,
    NotReady,
    Overloaded,
    PayloadTooLarge,
    Unauthorized,
    UnexpectedResponse,
    ValidationError,
)
from app.client.models import (
    Candidate,
    Health,
    IndexInfo,
    Info,
    Job,
    JobList,
    Readiness,
    ReplyResult,
    RollbackResult,
    SetInfo,
    SetList,
    SimilarMatch,
    SimilarResult,
    UploadAccepted,
)

__all__ = [
    "AsyncChitchatClient",
    "Candidate",
    "ChitchatClient",
    "ChitchatError",
    "Conflict",
    "ConnectionFailed",
    "Health",
    "IndexInfo",
    "Info",
    "InternalError",
    "Job",
    "JobList",
    "MethodNotAllowed",
    "NoCandidate",
    "NotFound",
    "NotReady",
    "Overloaded",
    "PayloadTooLarge",
    "Readiness",
    "ReplyResult",
    "RollbackResult",
    "SetInfo",
    "SetList",
    "SimilarMatch",
    "SimilarResult",
    "Unauthorized",
    "UnexpectedResponse",
    "UploadAccepted",
    "ValidationError",
]
