"""Liveness, readiness and info are separate: an orchestrator restarts on the
first, routes traffic on the second, and people read the third."""

from __future__ import annotations

from dataclasses import asdict

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from app.deps import RuntimeDep
from app.schemas import Health, Info, Readiness

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health)
async def healthz() -> Health:
    return Health(status="ok")


@router.get("/readyz", response_model=Readiness, responses={503: {"model": Readiness}})
async def readyz(runtime: RuntimeDep) -> JSONResponse:
    """Ready when a bundle and an index are loaded. Redis is reported, not required."""
    if runtime.kv.status != "disabled":
        await runtime.kv.ping()
    serving = runtime.serving
    body = Readiness(
        ready=serving is not None,
        bundle=serving.bundle.name if serving else None,
        index_version=serving.index_version if serving else None,
        redis=runtime.kv.status,
    )
    return JSONResponse(body.model_dump(), status_code=200 if serving else 503)


@router.get("/info", response_model=Info)
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
            "thresholds": asdict(bundle.thresholds),
            "calibration": bundle.calibration,
            "poly_codes": bundle.poly.codes if bundle.poly else None,
            "reactions": len(bundle.reactions.labels) if bundle.reactions else None,
            "eval": bundle.eval,
        },
        index={
            "version": index.version,
            "replies": index.replies,
            "queries": index.queries,
            "source": index.source,
            "created_at": index.created_at,
            "ann": index.ann,
            "versions": runtime.store.versions(),
        },
        redis=runtime.kv.status,
    )
