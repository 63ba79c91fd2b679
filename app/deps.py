"""Annotated dependency aliases, one per resource a route needs.

The dependencies are `async def` though they never await: FastAPI runs a
plain `def` dependency in its thread pool, a thread hand-off per request for
a dictionary lookup."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from app.config import Settings
from app.engine.runtime import Runtime
from app.engine.sets import NotReady


async def get_runtime(request: Request) -> Runtime:
    return runtime_of(request)


def runtime_of(request: Request) -> Runtime:
    runtime: Runtime | None = request.app.state.runtime
    if runtime is None:
        raise NotReady("still loading the bundle and the index")
    return runtime


async def get_app_settings(request: Request) -> Settings:
    """The settings this app was created with (tests create apps with their own)."""
    return runtime_of(request).settings


RuntimeDep = Annotated[Runtime, Depends(get_runtime)]
SettingsDep = Annotated[Settings, Depends(get_app_settings)]
