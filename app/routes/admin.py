"""Admin: candidate uploads that reindex with zero downtime, job status,
index info and rollback. Every route needs the bearer token."""

from __future__ import annotations

import hmac
from dataclasses import asdict
from typing import Annotated, Any

import anyio.to_thread
from fastapi import APIRouter, Depends, Request

from app.admin import Admin
from app.deps import RuntimeDep, SettingsDep
from app.engine.reindex import previous_version
from app.errors import ApiError, ErrorKind
from app.uploads import Mode, parse_upload

router = APIRouter(prefix="/admin", tags=["admin"])


def require_admin(request: Request, settings: SettingsDep) -> Admin:
    token = settings.admin_token.get_secret_value() if settings.admin_token else ""
    if not token:
        raise ApiError(ErrorKind.unauthorized, "admin is disabled: set CHITCHAT_ADMIN_TOKEN", "authorization")
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.encode(), token.encode()):
        raise ApiError(ErrorKind.unauthorized, "a valid bearer token is required", "authorization")
    admin: Admin = request.app.state.admin
    return admin


AdminDep = Annotated[Admin, Depends(require_admin)]


@router.post("/candidates", status_code=202)
async def upload(request: Request, admin: AdminDep, settings: SettingsDep, mode: Mode = "append") -> dict[str, Any]:
    """JSON array or NDJSON of {reply, query?, id?, metadata?} ({id} to delete).
    Starts a reindex; poll the returned job."""
    body = await request.body()
    content_type = request.headers.get("content-type", "")
    records = await anyio.to_thread.run_sync(parse_upload, body, content_type, mode, settings.admin_max_records)
    job = await anyio.to_thread.run_sync(admin.reindexer.submit, mode, records)
    return {
        "job_id": job.id,
        "state": job.state,
        "mode": mode,
        "records": len(records),
        "status": f"/admin/jobs/{job.id}",
    }


@router.get("/jobs/{job_id}")
async def job(job_id: str, admin: AdminDep) -> dict[str, Any]:
    found = await anyio.to_thread.run_sync(admin.jobs.get, job_id)
    if found is None:
        raise ApiError(ErrorKind.not_found, f"no job {job_id!r}", "job_id")
    return asdict(found)


@router.get("/index")
async def index(admin: AdminDep, runtime: RuntimeDep) -> dict[str, Any]:
    serving = runtime.current()
    manifest = serving.index.manifest
    versions = runtime.store.versions()
    return {
        "current": manifest.version,
        "previous": previous_version(runtime, serving),
        "versions": versions,
        "replies": manifest.replies,
        "queries": manifest.queries,
        "source": manifest.source,
        "model_checksum": manifest.bundle_checksum,
        "stored_candidates": await anyio.to_thread.run_sync(admin.candidates.count),
    }


@router.post("/rollback")
async def rollback(admin: AdminDep) -> dict[str, str]:
    """Serve the version before the current one (this model's), on every replica."""
    try:
        before, after = await anyio.to_thread.run_sync(admin.reindexer.rollback)
    except LookupError as error:
        raise ApiError(ErrorKind.conflict, str(error)) from error
    return {"from": before, "to": after}
