from __future__ import annotations

from fastapi import APIRouter, Request

from app import logs
from app.client.answers import SimilarQuery, SimilarResponse
from app.deps import RuntimeDep
from app.engine import pipeline
from app.errors import COMMON, ApiError, ErrorKind, responses
from app.schemas import SimilarRequest

router = APIRouter(tags=["similarity"], responses=responses(*COMMON, ErrorKind.request_timeout, ErrorKind.not_found))


@router.post("/similar", response_model=SimilarResponse, response_model_exclude_none=True)
async def similar(body: SimilarRequest, runtime: RuntimeDep, request: Request) -> SimilarResponse:
    """`text`: the most similar stored queries and their replies. `pairs`: a cosine per pair."""
    if (body.text is None) == (body.pairs is None):
        raise ApiError(ErrorKind.validation, "give exactly one of text or pairs", "text")
    if body.pairs is not None:
        if body.k is not None:
            raise ApiError(ErrorKind.validation, "k applies to text, not pairs", "k")
        scores, version = await pipeline.pair_scores(runtime, body.pairs, body.set)
        logs.note(request.scope, index_version=version, set=body.set, pairs=len(body.pairs))
        return SimilarResponse(scores=scores, index_version=version, set=body.set)
    assert body.text is not None
    k = body.k or runtime.settings.default_k
    matches, version = await pipeline.similar_queries(runtime, body.text, k, body.set)
    logs.note(request.scope, index_version=version, set=body.set)
    return SimilarResponse(
        matches=[SimilarQuery(query=q, reply=r, score=s) for q, r, s in matches], index_version=version, set=body.set
    )
