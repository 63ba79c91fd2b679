"""Annotated dependency aliases, one per resource a route needs."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from app.config import Settings
from app.engine.runtime import NotReady, Runtime


def get_runtime(request: Request) -> Runtime:
    runtime: Runtime | None = request.app.state.runtime
    if runtime is None:
        raise NotReady("still loading the bundle and the index")
    return runtime


def get_app_settings(request: Request) -> Settings:
    """The settings this app was created with (tests create apps with their own)."""
    return get_runtime(request).settings


RuntimeDep = Annotated[Runtime, Depends(get_runtime)]
SettingsDep = Annotated[Settings, Depends(get_app_settings)]
