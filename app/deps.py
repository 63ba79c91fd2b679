"""Annotated dependency aliases, one per resource a route needs, all read from the app's one
`ServiceState` (app/state.py).

The dependencies are `async def` though they never await: FastAPI runs a
plain `def` dependency in its thread pool, a thread hand-off per request for
a dictionary lookup."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from app.config import Settings
from app.engine.runtime import Runtime
from app.engine.sets import NotReady
from app.metrics import Metrics
from app.state import ServiceState, service_state


async def get_service(request: Request) -> ServiceState:
    return service_state(request.app)


async def get_runtime(request: Request) -> Runtime:
    return runtime_of(service_state(request.app))


def runtime_of(service: ServiceState) -> Runtime:
    if service.runtime is None:
        raise NotReady("still loading the bundle and the index")
    return service.runtime


async def get_app_settings(request: Request) -> Settings:
    """The settings this app was created with (tests create apps with their own)."""
    return runtime_of(service_state(request.app)).settings


async def get_metrics(request: Request) -> Metrics:
    return service_state(request.app).metrics


ServiceDep = Annotated[ServiceState, Depends(get_service)]
RuntimeDep = Annotated[Runtime, Depends(get_runtime)]
SettingsDep = Annotated[Settings, Depends(get_app_settings)]
MetricsDep = Annotated[Metrics, Depends(get_metrics)]
