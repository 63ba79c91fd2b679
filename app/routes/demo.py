"""The demo chat page: one HTML file and its static assets, no build step.

The page only calls the public API (/reply, /info), so it shows exactly what a client sees."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse
from starlette.staticfiles import StaticFiles

STATIC_DIR = Path(__file__).resolve().parent.parent / "static"

router = APIRouter(tags=["demo"])

# Mounted by create_app: include_router does not carry a router's mounts over to the app.
# check_dir=False: setuptools ships only .py files unless package-data lists these, and a
# missing demo page must not stop the API from starting.
static_files = StaticFiles(directory=STATIC_DIR, check_dir=False)


@router.get("/", include_in_schema=False)
async def index() -> FileResponse:
    return FileResponse(STATIC_DIR / "index.html", media_type="text/html")
