"""Liveness, readiness and info are separate: an orchestrator restarts on the
first, routes traffic on the second, and people read the third."""

from __future__ import annotations

from dataclasses import asdict

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from app.deps import RuntimeDep
from app.engine.runtime import QUERY_SIMILARITY_OFF, Runtime
from app.errors import ErrorKind, responses
from app.schemas import Health, Info, Readiness
from core.retriever import Serving
from core.text import SCRIPT_OF_LANGUAGE

router = APIRouter(tags=["health"])


@router.get("/livez", response_model=Health)
@router.get("/healthz", response_model=Health)
async def livez() -> Health:
    """Alive: the process answers. Touches nothing (no Redis, no model), so it stays fast whatever else is slow."""
    return Health(status="ok")


@router.get("/readyz", response_model=Readiness, responses={503: {"model": Readiness}})
async def readyz(request: Request) -> JSONResponse:
    """Ready when a bundle and an index are loaded and the server is not draining for a shutdown.
    Redis is reported, not required."""
    runtime: Runtime | None = request.app.state.runtime
    serving = runtime.serving if runtime is not None else None
    if runtime is not None and runtime.kv.status != "disabled":
        await runtime.kv.ping()
    draining = bool(request.app.state.draining)
    problem: str | None
    if runtime is None:
        load_error = getattr(request.app.state, "load_error", None)
        problem = f"load failed: {load_error}" if load_error else "loading"
    elif draining:
        problem = "draining: shutting down"
    else:
        problem = runtime.problem if serving is None else None
    body = Readiness(
        ready=serving is not None and not draining,
        bundle=serving.bundle.name if serving else None,
        index_version=serving.index_version if serving else None,
        redis=runtime.kv.status if runtime is not None else "disabled",
        problem=problem,
    )
    return JSONResponse(body.model_dump(), status_code=200 if body.ready else 503)


def _thresholds_from(serving: Serving) -> str:
    if serving.bundle.calibration:
        return "calibrated on validation turns (see calibration)"
    if serving.thresholds.query_similarity >= QUERY_SIMILARITY_OFF:
        query = "query similarity off: this index version has fewer than 2 stored queries to set its threshold from"
    else:
        query = "query similarity at the 99th percentile of stored-query neighbour cosines of this index version"
    reply = "reply matching always answers" if _no_reply_threshold(serving) else "reply matching: see reaction_fallback"
    return f"not calibrated: {query}; {reply}"


def _no_reply_threshold(serving: Serving) -> bool:
    return serving.share is None and serving.thresholds.reply_matching <= -1


def _reaction_fallback(serving: Serving) -> str:
    """Which conversations a reaction can answer, and when one does (`retriever.walk`)."""
    scripts = sorted({s for s in (SCRIPT_OF_LANGUAGE.get(r.language) for r in serving.reaction_sets()) if s})
    if not scripts:
        return "off: no reaction set (the model has none, and this index version's candidates brought none)"
    default = SCRIPT_OF_LANGUAGE.get(serving.bundle.language)
    no_letters = f"counts as {default}" if default in scripts else "gets none"
    if serving.share is not None:
        when = f"reply matching's confidence is among the least sure {serving.share.share:.0%} of recent turns"
    elif not _no_reply_threshold(serving):
        score = "confidence" if serving.confidence is not None else "top score"
        when = f"reply matching's {score} is under {serving.thresholds.reply_matching}"
    else:
        # walk(): with a threshold of -1 every matched reply is sure enough.
        when = (
            "a request sets a reply_matching threshold its best reply misses, or leaves reply matching out:"
            " with no threshold of its own, reply matching answers every turn"
        )
    return (
        f"on for conversations in {' or '.join(scripts)} script, off for others"
        f" (a window without letters {no_letters}); a reaction answers when {when}"
    )


@router.get("/info", response_model=Info, responses=responses(ErrorKind.not_ready))
async def info(runtime: RuntimeDep) -> Info:
    serving = runtime.current()
    bundle, index = serving.bundle, serving.index.manifest
    return Info(
        model={
            "name": bundle.name,
            "model_id": bundle.model_id,
            "kind": bundle.kind,
            "checksum": bundle.checksum,
            "dim": bundle.dim,
            "layers": bundle.num_layers,
            "quantization": bundle.quantization,
            "max_context_turns": bundle.max_context_turns,
            "poly": asdict(bundle.poly) if bundle.poly else None,
            "language": bundle.language,
            "languages": bundle.languages or [bundle.language],
            "reactions": {
                "labels": bundle.reactions.labels,
                "language": bundle.reactions.language,
                "translations": bundle.reactions.translations,
            }
            if bundle.reactions
            else None,
            "reaction_sets": [asdict(s) for s in serving.reaction_sets()],
            "reaction_fallback": _reaction_fallback(serving),
            "confidence": {"features": bundle.confidence.features, "validation_auroc": bundle.confidence.auroc}
            if bundle.confidence
            else None,
            # What this server applies: the reply-matching threshold follows CHITCHAT_REACTION_SHARE.
            "thresholds": asdict(serving.thresholds),
            "thresholds_from": _thresholds_from(serving),
            "reaction_share": {
                "share": serving.share.share,
                "of": f"the last {serving.share.window} turns of this index version",
                "threshold_now": round(serving.share.threshold(), 4),
                "validation_threshold": serving.share.fallback,
            }
            if serving.share is not None
            else None,
            "calibration": bundle.calibration,
            "eval": bundle.eval,
            "release": bundle.release or None,
            "training": {k: bundle.training.get(k) for k in ("profile", "seconds_total", "hardware")}
            if bundle.training
            else None,
        },
        index={
            "version": index.version,
            "replies": index.replies,
            "queries": index.queries,
            "source": index.source,
            "created_at": index.created_at,
            "ann": index.ann,
            "profile": index.profile,
            "versions": runtime.store.versions(),
        },
        redis=runtime.kv.status,
    )
