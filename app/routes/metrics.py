"""Prometheus metrics (`app/metrics.py` says what they are)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST

from app.deps import MetricsDep

router = APIRouter(tags=["health"])


@router.get("/metrics", response_class=Response, responses={200: {"content": {"text/plain": {}}}})
async def metrics(metrics: MetricsDep) -> Response:
    """Requests, answers by source, the encoder queue, the cache, Redis, reindex jobs, the served version."""
    return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)
