"""Liveness, readiness and info are separate: an orchestrator restarts on the
first, routes traffic on the second, and people read the third."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from app.deps import RuntimeDep
from app.engine import describe
from app.engine.runtime import Runtime
from app.errors import ErrorKind, responses
from app.schemas import Health, Info, Readiness

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


@router.get("/info", response_model=Info, responses=responses(ErrorKind.not_ready))
async def info(runtime: RuntimeDep) -> Info:
    serving = runtime.current()
    return Info(
        model=describe.model_info(serving),
        index=describe.index_info(serving, runtime.store.versions()),
        redis=runtime.kv.status,
    )
