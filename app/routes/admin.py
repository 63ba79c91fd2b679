"""Admin: candidate uploads that reindex with zero downtime, job status,
index info and rollback. Every route needs the bearer token."""

from __future__ import annotations

import hmac
from dataclasses import asdict
from typing import Annotated, Any, Literal

import anyio.to_thread
from fastapi import APIRouter, Depends, Query, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from app import logs
from app.admin import Admin
from app.config import Settings
from app.deps import RuntimeDep, SettingsDep
from app.engine.reindex import Busy
from app.engine.rollback import rollback as roll_back
from app.engine.versions import previous_version
from app.errors import COMMON, ApiError, ErrorKind, responses
from app.uploads import Mode, OnInvalid, parse_upload, upload_body

ADMIN_ERRORS = (*COMMON, ErrorKind.unauthorized, ErrorKind.not_found, ErrorKind.conflict)
router = APIRouter(prefix="/admin", tags=["admin"], responses=responses(*ADMIN_ERRORS))
# Parses "Authorization: Bearer <token>" (any case of the scheme) and nothing
# else; auto_error=False so that every failure is our one 401 shape.
bearer = HTTPBearer(auto_error=False, description="CHITCHAT_ADMIN_TOKEN")


async def require_admin(  # async: a plain def would cost a thread hand-off (app/deps.py)
    request: Request,
    settings: SettingsDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> Admin:
    token = settings.admin_token.get_secret_value() if settings.admin_token else ""
    if not token:
        raise ApiError(ErrorKind.unauthorized, "admin is disabled: set CHITCHAT_ADMIN_TOKEN", "authorization")
    given = credentials.credentials if credentials is not None else ""
    if not hmac.compare_digest(given.encode(), token.encode()):  # constant time: no length or prefix leaks
        raise ApiError(ErrorKind.unauthorized, "a valid bearer token is required", "authorization")
    admin: Admin = request.app.state.admin
    return admin


AdminDep = Annotated[Admin, Depends(require_admin)]


@router.post("/candidates", status_code=202, openapi_extra={"requestBody": upload_body("upsert")})
async def upload(
    request: Request,
    admin: AdminDep,
    settings: SettingsDep,
    mode: Literal["append", "replace"] = "append",
    on_invalid: OnInvalid = "reject",
) -> dict[str, Any]:
    """Records {reply, query?, id?, metadata?} as a JSON array, NDJSON or CSV. Starts a reindex;
    poll the returned job. `on_invalid=skip` indexes the valid records and reports the rest."""
    return await _submit(request, admin, settings, mode, on_invalid)


@router.post("/candidates/delete", status_code=202, openapi_extra={"requestBody": upload_body("delete")})
async def delete(
    request: Request, admin: AdminDep, settings: SettingsDep, on_invalid: OnInvalid = "reject"
) -> dict[str, Any]:
    """Deletes candidates named by {id}, or by a whole record. Starts a reindex; poll the returned job."""
    return await _submit(request, admin, settings, "delete", on_invalid)


async def _submit(
    request: Request, admin: Admin, settings: Settings, mode: Mode, on_invalid: OnInvalid
) -> dict[str, Any]:
    holder = await anyio.to_thread.run_sync(admin.reindexer.lock.holder)
    if holder is not None:  # before the body is read and parsed: a refused upload costs nothing
        raise Busy(f"reindex job {holder} is running")
    body = await request.body()
    content_type = request.headers.get("content-type", "")
    parsed = await anyio.to_thread.run_sync(
        parse_upload, body, content_type, mode, settings.admin_max_records, on_invalid
    )
    job = await anyio.to_thread.run_sync(admin.reindexer.submit, mode, parsed.records, parsed.report())
    logs.note(request.scope, job_id=job.id, records=len(parsed.records), skipped=parsed.skipped_count)
    return {
        "job_id": job.id,
        "state": job.state,
        "mode": mode,
        "records": len(parsed.records),
        "skipped": parsed.skipped_count,
        "status": f"/admin/jobs/{job.id}",
    }


@router.get("/jobs")
async def jobs(admin: AdminDep, limit: Annotated[int, Query(ge=1, le=100)] = 20) -> dict[str, list[dict[str, Any]]]:
    """The newest jobs first, each as `/admin/jobs/{job_id}` returns it."""
    await anyio.to_thread.run_sync(admin.sweep)
    found = await anyio.to_thread.run_sync(admin.jobs.recent, limit)
    return {"jobs": [asdict(j) for j in found]}


@router.get("/jobs/{job_id}")
async def job(job_id: str, admin: AdminDep) -> dict[str, Any]:
    await anyio.to_thread.run_sync(admin.sweep)
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
        "previous": previous_version(runtime.store, serving.bundle.checksum, manifest.version),
        "versions": versions,
        "replies": manifest.replies,
        "queries": manifest.queries,
        "source": manifest.source,
        "model_checksum": manifest.bundle_checksum,
        "stored_candidates": await anyio.to_thread.run_sync(admin.candidates.count),
    }


@router.post("/rollback")
async def rollback(admin: AdminDep) -> dict[str, Any]:
    """Serve the version before the current one (this model's), on every replica.
    `after_swap` says whether the other replicas were told at once (they follow the pointer anyway)."""
    try:
        before, after, steps = await anyio.to_thread.run_sync(roll_back, admin.reindexer)
    except LookupError as error:
        raise ApiError(ErrorKind.conflict, str(error)) from error
    return {"from": before, "to": after, "after_swap": steps}
