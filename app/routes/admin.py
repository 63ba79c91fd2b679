"""Admin: candidate uploads that reindex with zero downtime, each set's encoder, job status,
index info and rollback, for the default set (`/admin/candidates`, ...) and
for named sets (`/admin/sets/{name}/...`). Every route needs the bearer token."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Annotated, Literal

import anyio.to_thread
from fastapi import APIRouter, Depends, Path, Query, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from app import logs
from app.auth import admin_refusal, passed
from app.client.answers import IndexInfo, Job, JobList, RollbackResult, SetDeleted, SetList, UploadAccepted
from app.config import Settings
from app.deps import RuntimeDep, ServiceDep, SettingsDep
from app.engine import describe
from app.engine.runtime import Runtime
from app.engine.sets import DEFAULT_SET, SET_NAME, NotReady, check_set_name
from app.errors import COMMON, ApiError, ErrorKind, responses
from app.reindex.rollback import rollback as roll_back
from app.reindex.set_admin import Admin, SetAdmin
from app.reindex.uploads import Mode, OnInvalid, parse_upload, upload_body
from app.reindex.versions import previous_version
from app.upload_gate import ADMIN, CANDIDATES, DELETE, ENCODER_NAME, SET, check_encoder, refuse_before_body

ADMIN_ERRORS = (*COMMON, ErrorKind.unauthorized, ErrorKind.not_found, ErrorKind.conflict)
router = APIRouter(prefix=ADMIN, tags=["admin"], responses=responses(*ADMIN_ERRORS))
# Parses "Authorization: Bearer <token>" (any case of the scheme) and nothing
# else; auto_error=False so that every failure is our one 401 shape.
bearer = HTTPBearer(auto_error=False, description="CHITCHAT_ADMIN_TOKEN")


async def require_admin(  # async: a plain def would cost a thread hand-off (app/deps.py)
    request: Request,
    service: ServiceDep,
    settings: SettingsDep,
    _: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],  # for the OpenAPI security scheme
) -> Admin:
    if not passed(request.scope):  # `AdminGate` checks the token of a request with a body
        refusal = admin_refusal(settings.admin_token, request.headers.get("authorization"))
        if refusal is not None:
            raise refusal
    if service.admin is None:  # set before the runtime, which `settings` waited for
        raise NotReady("still loading the bundle and the index")
    return service.admin


AdminDep = Annotated[Admin, Depends(require_admin)]


async def set_name(
    name: Annotated[str, Path(min_length=1, max_length=32, pattern=f"^{SET_NAME.pattern}$")],
) -> str:
    """A set named in the path, checked (422) before it is used anywhere; the pattern is published."""
    return check_set_name(name)


SetNamePath = Annotated[str, Depends(set_name)]
EncoderQuery = Annotated[str | None, Query(min_length=1, max_length=64, pattern=ENCODER_NAME)]
RequiredEncoder = Annotated[str, Query(min_length=1, max_length=64, pattern=ENCODER_NAME)]


@dataclass(frozen=True)
class Submission:
    """What every upload route submits through: the request (its body, read once nothing refuses it),
    the admin side and the settings."""

    request: Request
    admin: Admin
    settings: Settings

    async def submit(self, name: str, mode: Mode, on_invalid: OnInvalid, encoder: str | None = None) -> UploadAccepted:
        return await _submit(self.request, self.admin, self.settings, name, mode, on_invalid, encoder)


async def submission(request: Request, admin: AdminDep, settings: SettingsDep) -> Submission:
    return Submission(request, admin, settings)


SubmissionDep = Annotated[Submission, Depends(submission)]


@router.post(CANDIDATES, status_code=202, openapi_extra={"requestBody": upload_body("upsert")})
async def upload(
    submission: SubmissionDep,
    mode: Literal["append", "replace"] = "append",
    on_invalid: OnInvalid = "reject",
    encoder: EncoderQuery = None,
) -> UploadAccepted:
    """Records {reply, query?, id?, metadata?, tags?, language?} as a JSON array, NDJSON or CSV, into
    the default set. Starts a reindex; poll the returned job. `on_invalid=skip` indexes the valid
    records and reports the rest. `encoder`: build with that shipped bundle (`GET /admin/sets` lists
    them); unset, the set keeps its own."""
    return await submission.submit(DEFAULT_SET, mode, on_invalid, encoder)


@router.post(CANDIDATES + DELETE, status_code=202, openapi_extra={"requestBody": upload_body("delete")})
async def delete(submission: SubmissionDep, on_invalid: OnInvalid = "reject") -> UploadAccepted:
    """Deletes candidates of the default set named by {id}, or by a whole record. Starts a reindex."""
    return await submission.submit(DEFAULT_SET, "delete", on_invalid)


@router.post(SET + CANDIDATES, status_code=202, openapi_extra={"requestBody": upload_body("upsert")})
async def upload_to_set(
    submission: SubmissionDep,
    name: SetNamePath,
    mode: Literal["append", "replace"] = "append",
    on_invalid: OnInvalid = "reject",
    encoder: EncoderQuery = None,
) -> UploadAccepted:
    """As `POST /admin/candidates`, into set `name`; the first upload creates the set, with `encoder`
    (default: the default encoder)."""
    return await submission.submit(name, mode, on_invalid, encoder)


@router.put(SET + CANDIDATES, status_code=202, openapi_extra={"requestBody": upload_body("upsert")})
async def replace_set(
    submission: SubmissionDep, name: SetNamePath, on_invalid: OnInvalid = "reject", encoder: EncoderQuery = None
) -> UploadAccepted:
    """Set `name`'s candidates become exactly these (mode=replace); the first upload creates the set."""
    return await submission.submit(name, "replace", on_invalid, encoder)


@router.put("/sets/{name}/encoder", status_code=202)
async def set_encoder(admin: AdminDep, name: SetNamePath, encoder: RequiredEncoder) -> UploadAccepted:
    """Re-encodes every candidate of set `name` with another shipped encoder: a reindex job; the
    version before serves until the swap, and rolling back returns to it only through a new job."""
    check_encoder(admin.runtime, encoder)
    target = await anyio.to_thread.run_sync(admin.of, name)
    job = await anyio.to_thread.run_sync(target.reindexer.submit, "reencode", [], None, encoder)
    return _accepted(name, job.id, job.state, "reencode", 0, 0)


@router.post(SET + CANDIDATES + DELETE, status_code=202, openapi_extra={"requestBody": upload_body("delete")})
async def delete_from_set(
    submission: SubmissionDep, name: SetNamePath, on_invalid: OnInvalid = "reject"
) -> UploadAccepted:
    """As `POST /admin/candidates/delete`, in set `name`."""
    return await submission.submit(name, "delete", on_invalid)


def _accepted(name: str, job_id: str, state: str, mode: str, records: int, skipped: int) -> UploadAccepted:
    return UploadAccepted(
        job_id=job_id,
        set=name,
        state=state,
        mode=mode,
        records=records,
        skipped=skipped,
        status=f"/admin/jobs/{job_id}" if name == DEFAULT_SET else f"/admin/sets/{name}/jobs/{job_id}",
    )


async def _submit(
    request: Request,
    admin: Admin,
    settings: Settings,
    name: str,
    mode: Mode,
    on_invalid: OnInvalid,
    encoder: str | None = None,
) -> UploadAccepted:
    # Asked before the body is read (`RefuseBeforeBody` asks it before the body reader does), and
    # again here: a job may have started since.
    await refuse_before_body(admin, name, mode == "delete", encoder)
    body = await request.body()
    content_type = request.headers.get("content-type", "")
    parsed = await anyio.to_thread.run_sync(
        parse_upload, body, content_type, mode, settings.admin_max_records, on_invalid
    )
    # The limits on sets and candidates are counted, and the job submitted, in one step: a new set is
    # only made once the upload is known good, and a refused one leaves nothing behind.
    _, job = await anyio.to_thread.run_sync(
        admin.admit, name, mode, parsed.records, parsed.report(), encoder, parsed.lines
    )
    logs.note(request.scope, job_id=job.id, records=len(parsed.records), skipped=parsed.skipped_count, set=name)
    return _accepted(name, job.id, job.state, mode, len(parsed.records), parsed.skipped_count)


@router.get("/jobs")
async def jobs(admin: AdminDep, limit: Annotated[int, Query(ge=1, le=100)] = 20) -> JobList:
    """The default set's newest jobs first, each as `/admin/jobs/{job_id}` returns it."""
    return await _jobs(admin.default, limit)


@router.get("/jobs/{job_id}")
async def job(job_id: str, admin: AdminDep) -> Job:
    """A job of any set."""
    await anyio.to_thread.run_sync(admin.sweep)
    found = await anyio.to_thread.run_sync(admin.find_job, job_id)
    if found is None:
        raise ApiError(ErrorKind.not_found, f"no job {job_id!r}", "job_id")
    return Job.model_validate(asdict(found))


@router.get("/sets/{name}/jobs")
async def set_jobs(admin: AdminDep, name: SetNamePath, limit: Annotated[int, Query(ge=1, le=100)] = 20) -> JobList:
    """Set `name`'s newest jobs first."""
    return await _jobs(await anyio.to_thread.run_sync(admin.of, name), limit)


@router.get("/sets/{name}/jobs/{job_id}")
async def set_job(admin: AdminDep, name: SetNamePath, job_id: str) -> Job:
    target = await anyio.to_thread.run_sync(admin.of, name)
    await anyio.to_thread.run_sync(target.sweep)
    found = await anyio.to_thread.run_sync(target.jobs.get, job_id)
    if found is None:
        raise ApiError(ErrorKind.not_found, f"no job {job_id!r} in set {name!r}", "job_id")
    return Job.model_validate(asdict(found))


async def _jobs(target: SetAdmin, limit: int) -> JobList:
    await anyio.to_thread.run_sync(target.sweep)
    found = await anyio.to_thread.run_sync(target.jobs.recent, limit)
    return JobList(jobs=[Job.model_validate(asdict(j)) for j in found])


@router.get("/index")
async def index(admin: AdminDep, runtime: RuntimeDep) -> IndexInfo:
    """The default set's versions and counts."""
    return await _index(admin.default, runtime)


@router.get("/sets/{name}/index")
async def set_index(admin: AdminDep, runtime: RuntimeDep, name: SetNamePath) -> IndexInfo:
    return await _index(await anyio.to_thread.run_sync(admin.of, name), runtime)


async def _index(target: SetAdmin, runtime: Runtime) -> IndexInfo:
    runtime.current_model()  # the service itself still loading: 503, as on every route
    store = target.candidate_set.store
    serving = target.candidate_set.serving
    counts = {
        "set": target.candidate_set.name,
        "versions": store.versions(),
        "stored_candidates": await anyio.to_thread.run_sync(target.candidates.count),
    }
    if serving is None:
        # A set whose first version is not built yet, or failed to build: nothing is current, which
        # is this route's answer, not an outage (a 503 here read as the service being down).
        return IndexInfo.model_validate(
            {
                **counts,
                "current": None,
                "previous": None,
                "replies": 0,
                "queries": 0,
                "source": None,
                "model_checksum": None,
                "problem": target.candidate_set.problem,
            }
        )
    manifest = serving.index.manifest
    return IndexInfo.model_validate(
        {
            **counts,
            "current": manifest.version,
            "previous": previous_version(store, serving.bundle.checksum, manifest.version),
            "replies": manifest.replies,
            "queries": manifest.queries,
            "source": manifest.source,
            "model_checksum": manifest.bundle_checksum,
            "problem": None,
        }
    )


@router.post("/rollback")
async def rollback(admin: AdminDep) -> RollbackResult:
    """Serve the default set's version before the current one (this model's), on every replica.
    `after_swap` says whether the other replicas were told at once (they follow the pointer anyway)."""
    return await _rollback(admin.default)


@router.post("/sets/{name}/rollback")
async def set_rollback(admin: AdminDep, name: SetNamePath) -> RollbackResult:
    """As `POST /admin/rollback`, for set `name`."""
    return await _rollback(await anyio.to_thread.run_sync(admin.of, name))


async def _rollback(target: SetAdmin) -> RollbackResult:
    try:
        before, after, steps = await anyio.to_thread.run_sync(roll_back, target.reindexer)
    except LookupError as error:
        raise ApiError(ErrorKind.conflict, str(error), "set") from error
    # By the JSON names: `from` is a Python keyword.
    return RollbackResult.model_validate(
        {"set": target.candidate_set.name, "from": before, "to": after, "after_swap": steps}
    )


# Unset, not null: a set with no index version yet is listed without the counts it does not have.
@router.get("/sets", response_model_exclude_unset=True)
async def sets(admin: AdminDep, runtime: RuntimeDep) -> SetList:
    """Every set: its version, counts and index size, and the service's limits on sets."""
    return SetList.model_validate(
        {
            "sets": [describe.set_info(s) for s in runtime.sets.values()],
            "encoders": describe.encoders(runtime),
            "limits": {
                "max_sets": admin.settings.max_sets,
                "max_total_candidates": admin.settings.max_total_candidates,
            },
        }
    )


@router.delete("/sets/{name}")
async def delete_set(admin: AdminDep, name: SetNamePath) -> SetDeleted:
    """Removes set `name` on every replica: its candidates, index versions and jobs' lock.
    409 while one of its jobs runs; the default set cannot be deleted."""
    try:
        await anyio.to_thread.run_sync(admin.delete, name)
    except ValueError as error:
        raise ApiError(ErrorKind.conflict, str(error), "name") from error
    return SetDeleted(deleted=name)
