"""Session fixtures: a tiny random encoder exported through the real pipeline,
and a small synthetic index built with the real index builder.

Fixtures only; what test modules share besides fixtures is in `tests/helpers.py`."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import numpy as np
import pytest
import redis
import torch

from app.main import create_app
from core.bundle import TOKENIZER_FILE, PolySpec, ReactionSpec, read_manifest
from core.encoder import Encoder
from core.store import IndexStore
from index.build import build_version
from models.encoder import DualEncoder, minilm_path, tiny_body
from models.export import ExportConfig, export_bundle
from models.poly import PolyHead
from models.reactions import ReactionModel
from tests.helpers import (
    REACTION_LABELS,
    REDIS_URL,
    TINY_PARITY_TEXTS,
    AppFactory,
    loaded,
    settings_for,
    tiny_candidates,
)


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"


def export_and_index(model: DualEncoder, config: ExportConfig, root: Path) -> Path:
    """root/bundles/<config.name> and one current index version of the tiny candidates built with it."""
    bundle_dir = export_bundle(model, config, root / "bundles", TINY_PARITY_TEXTS)
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
    config = ExportConfig(
        name="tiny-int8",
        model_id="tiny-random-bert",
        kind="tiny",
        tokenizer_path=minilm_path() / TOKENIZER_FILE,
        # A random 32-wide model quantises worse than a trained one; the
        # mechanism, not MiniLM's figure, is what is under test here.
        min_parity_cosine=0.95,
    )
    return export_and_index(DualEncoder(tiny_body(vocab_size=30522)), config, root)


@pytest.fixture(scope="session")
def poly_artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """artifacts/ with a tiny bundle that has a poly head and a reaction classifier."""
    root = tmp_path_factory.mktemp("poly-artifacts")
    model = DualEncoder(tiny_body(vocab_size=30522, seed=1))
    head = PolyHead(model.dim, codes=4)
    with torch.no_grad():
        head.mix.fill_(0.0)  # weight 0.5: the poly score moves the order visibly
        head.codes.normal_(0, 1)  # peaked attention, so the m vectors differ
    model.poly_head = head
    rng = np.random.default_rng(0)
    reactions = ReactionModel(
        ReactionSpec(labels=REACTION_LABELS, coverage=0.04),
        rng.normal(size=(len(REACTION_LABELS), model.dim)).astype(np.float32),
        np.zeros(len(REACTION_LABELS), dtype=np.float32),
    )
    config = ExportConfig(
        name="tiny-poly-fp32",
        model_id="tiny-random-bert + poly",
        kind="tiny",
        tokenizer_path=minilm_path() / TOKENIZER_FILE,
        quantize=False,  # fp32: the rerank order under test is the graph's, not quantisation noise
        poly=PolySpec(codes=4, weight=0.5),
        reactions=reactions,
    )
    return export_and_index(model, config, root)


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
