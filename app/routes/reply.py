from __future__ import annotations

from fastapi import APIRouter, Request

from app import logs
from app.client.answers import Candidate, ReplyResponse
from app.deps import MetricsDep, RuntimeDep
from app.engine import pipeline
from app.errors import COMMON, ApiError, ErrorKind, responses
from app.schemas import ReplyRequest
from core.retriever import STRATEGY_ORDER, Scored

# request_timeout: the body did not arrive within its deadline (app/limits.py).
# no_candidate: every candidate was excluded (the bot's recent replies in a session, echoes of the
# user), or the request's filter admits none. not_found: no such set.
router = APIRouter(
    tags=["reply"], responses=responses(*COMMON, ErrorKind.request_timeout, ErrorKind.no_candidate, ErrorKind.not_found)
)


def _candidate(hit: Scored) -> Candidate:
    return Candidate(id=hit.id, text=hit.text, score=round(hit.score, 6), source=hit.source)


@router.post("/reply", response_model=ReplyResponse, response_model_exclude_none=True)
async def reply(body: ReplyRequest, runtime: RuntimeDep, metrics: MetricsDep, request: Request) -> ReplyResponse:
    """The best next reply for a conversation: pass `context`, or `session_id` + `message`."""
    options = pipeline.ReplyOptions(
        k=body.k or runtime.settings.default_k,
        strategies=body.strategies or list(STRATEGY_ORDER),
        rerank=runtime.settings.rerank_by_default if body.rerank is None else body.rerank,
        thresholds=body.thresholds.given() if body.thresholds else None,
        rerank_depth=runtime.settings.rerank_depth,
        rule=body.rule(),
        set_name=body.set,
        route_language=body.route_language,
    )
    if body.context is not None:
        if body.session_id is not None or body.message is not None:
            raise ApiError(ErrorKind.validation, "give either context, or session_id with message, not both", "context")
        outcome = await pipeline.reply(runtime, body.context, options, exclude=set())
    elif body.session_id is None or body.message is None:
        missing = "message" if body.session_id is not None else "session_id" if body.message is not None else "context"
        raise ApiError(
            ErrorKind.validation, f"{missing} is required (send context, or session_id with message)", missing
        )
    else:

        async def still_wanted() -> bool:
            return not await request.is_disconnected()

        outcome = await pipeline.session_reply(runtime, body.session_id, body.message, options, still_wanted)
    best = outcome.answer.best
    metrics.answers.labels(best.source).inc()
    logs.note(
        request.scope,
        source=best.source,
        index_version=outcome.index_version,
        set=body.set,
        reranked=outcome.answer.reranked,
        confidence=outcome.answer.confidence,
        session=logs.session_digest(body.session_id) if body.session_id else None,
        **({"text": body.context or body.message, "reply": best.text} if runtime.settings.log_text else {}),
    )
    return ReplyResponse(
        reply=best.text,
        id=best.id,
        source=best.source,
        score=round(best.score, 6),
        reranked=outcome.answer.reranked,
        confidence=None if outcome.answer.confidence is None else round(outcome.answer.confidence, 4),
        candidates=[_candidate(h) for h in outcome.answer.candidates],
        index_version=outcome.index_version,
        set=body.set,
        session_id=body.session_id,
    )
