"""Session fixtures: tiny random encoder bundles (built without torch, `tests/tiny_bundle.py`)
and a small synthetic index built with the real index builder.

Fixtures only; what test modules share besides fixtures is in `tests/helpers.py`.
Nothing here may import torch: the service's tests run in a venv without it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import numpy as np
import pytest
import redis

from app.main import create_app
from core.bundle import PolySpec, ReactionSpec, read_manifest
from core.encoder import Encoder
from core.store import IndexStore
from index.build import build_version
from tests.helpers import (
    REACTION_LABELS,
    REDIS_URL,
    TINY_PARITY_TEXTS,
    AppFactory,
    loaded,
    settings_for,
    tiny_candidates,
)
from tests.tiny_bundle import TinyReactions, build_tiny_bundle, tiny_combiner


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"


def index_tiny_candidates(root: Path, bundle_dir: Path) -> Path:
    """One current index version of the tiny candidates under root/indexes, built with the bundle."""
    bundle = read_manifest(bundle_dir)
    store = IndexStore(root / "indexes")
    manifest = build_version(
        tiny_candidates(), Encoder(bundle_dir, bundle), bundle.checksum, store, "tests", progress=False
    )
    store.set_current(manifest.version)
    return root


@pytest.fixture(scope="session")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """artifacts/ with one tiny int8 bundle and one index version built with it."""
    root = tmp_path_factory.mktemp("artifacts")
    bundle_dir = build_tiny_bundle(root / "bundles", "tiny-int8", TINY_PARITY_TEXTS, seed=0)
    return index_tiny_candidates(root, bundle_dir)


@pytest.fixture(scope="session")
def prefixed_artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """artifacts/ with a tiny bundle that prefixes its sides as e5 does, so a text's context and
    reply vectors differ, and one index version built with it."""
    root = tmp_path_factory.mktemp("prefixed-artifacts")
    bundle_dir = build_tiny_bundle(
        root / "bundles", "tiny-prefixed-int8", TINY_PARITY_TEXTS, seed=2, prefixes=("query: ", "passage: ")
    )
    return index_tiny_candidates(root, bundle_dir)


@pytest.fixture(scope="session")
def per_turn_artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """artifacts/ with a tiny e5-style bundle that serves per turn (a combiner), and one index version."""
    root = tmp_path_factory.mktemp("per-turn-artifacts")
    bundle_dir = build_tiny_bundle(
        root / "bundles",
        "tiny-per-turn-int8",
        TINY_PARITY_TEXTS,
        seed=3,
        prefixes=("query: ", "passage: "),
        combiner=tiny_combiner(32),
    )
    return index_tiny_candidates(root, bundle_dir)


@pytest.fixture(scope="session")
def poly_artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """artifacts/ with a tiny bundle that has a poly head and a reaction classifier."""
    root = tmp_path_factory.mktemp("poly-artifacts")
    dim = 32
    rng = np.random.default_rng(0)
    reactions = TinyReactions(
        ReactionSpec(labels=REACTION_LABELS, coverage=0.04),
        rng.normal(size=(len(REACTION_LABELS), dim)).astype(np.float32),
        np.zeros(len(REACTION_LABELS), dtype=np.float32),
    )
    bundle_dir = build_tiny_bundle(
        root / "bundles",
        "tiny-poly-fp32",
        TINY_PARITY_TEXTS,
        seed=1,
        dim=dim,
        quantize=False,  # fp32: the rerank order under test is the graph's, not quantisation noise
        poly=PolySpec(codes=4, weight=0.5),  # weight 0.5: the poly score moves the order visibly
        reactions=reactions,
    )
    return index_tiny_candidates(root, bundle_dir)


@pytest.fixture(scope="session")
def redis_client() -> redis.Redis:
    """The real server at 127.0.0.1:6379 (.ci/run starts one). Never mocked."""
    client = redis.Redis.from_url(REDIS_URL, socket_timeout=2)
    client.ping()
    return client


@pytest.fixture
def clean_redis(redis_client: redis.Redis) -> redis.Redis:
    redis_client.flushdb()
    return redis_client


@pytest.fixture
def make_client(artifacts: Path) -> AppFactory:
    """make_client(**settings) -> an httpx client on a fresh app, lifespan run."""

    @asynccontextmanager
    async def factory(**overrides: object) -> AsyncIterator[httpx.AsyncClient]:
        settings = settings_for(artifacts, **overrides)
        app = create_app(settings)
        async with app.router.lifespan_context(app):
            await loaded(app)
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
                yield client

    return factory


@pytest.fixture
async def client(make_client: AppFactory) -> AsyncIterator[httpx.AsyncClient]:
    """The embedded default: no Redis configured."""
    async with make_client() as c:
        yield c
