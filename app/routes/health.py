"""Liveness, readiness and info are separate: an orchestrator restarts on the
first, routes traffic on the second, and people read the third."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from app.client.answers import Health, Info, Readiness
from app.deps import RuntimeDep, ServiceDep
from app.engine import describe
from app.engine.sets import DEFAULT_SET
from app.errors import ErrorKind, responses
from app.schemas import SetQuery

router = APIRouter(tags=["health"])


@router.get("/livez", response_model=Health)
@router.get("/healthz", response_model=Health)
async def livez() -> Health:
    """Alive: the process answers. Touches nothing (no Redis, no model), so it stays fast whatever else is slow."""
    return Health(status="ok")


@router.get("/readyz", response_model=Readiness, responses={503: {"model": Readiness}})
async def readyz(service: ServiceDep) -> JSONResponse:
    """Ready when the bundle and an index version of some set are loaded and the server is not
    draining for a shutdown. Each set's version is listed; Redis is reported, not required: as last
    pinged, at most `readyz_redis_cache_s` ago, or as a call since found it (down, bypassed)."""
    runtime = service.runtime
    sets = runtime.sets if runtime is not None and runtime.model is not None else {}
    serving = next((s.serving for s in sets.values() if s.serving is not None), None)
    # Pinged at most once a readyz_redis_cache_s, one ping at a time: a flood of probes, outside the
    # in-flight limit, once took every pooled connection, and the guard read that as Redis down.
    redis = await runtime.kv.readiness(runtime.settings.readyz_redis_cache_s) if runtime is not None else "disabled"
    draining = service.draining
    problem: str | None
    if runtime is None:
        problem = f"load failed: {service.load_error}" if service.load_error else "loading"
    elif draining:
        problem = "draining: shutting down"
    elif serving is None:
        problem = runtime.problem or (runtime.default.problem if runtime.sets else None) or "no set has an index"
    else:
        problem = None
    default = sets.get(DEFAULT_SET)
    body = Readiness(
        ready=serving is not None and not draining,
        bundle=serving.bundle.name if serving else None,
        index_version=default.serving.index_version if default and default.serving else None,
        sets={name: s.serving.index_version if s.serving else None for name, s in sets.items()},
        redis=redis,
        problem=problem,
    )
    return JSONResponse(body.model_dump(), status_code=200 if body.ready else 503)


@router.get("/info", response_model=Info, responses=responses(ErrorKind.not_ready, ErrorKind.not_found))
async def info(service: ServiceDep, runtime: RuntimeDep, set: SetQuery = DEFAULT_SET) -> Info:
    """The model, and the index version of set `set` (the default set unless named)."""
    candidates = runtime.candidate_set(set)
    serving = runtime.current(set)
    building = service.first_build
    return Info(
        model=describe.model_info(serving, runtime.settings.rerank_by_default),
        index={"set": set, **describe.index_info(serving, candidates.store.versions())},
        redis=runtime.kv.status,
        first_build=building.describe() if building is not None and set == DEFAULT_SET else None,
    )
