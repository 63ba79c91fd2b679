"""Session fixtures: a tiny random encoder exported through the real pipeline,
and a small synthetic index built with the real index builder."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path

import httpx
import numpy as np
import pytest
import redis
import torch
from fastapi import FastAPI

from app.config import Settings
from app.main import create_app
from core.bundle import MANIFEST, TOKENIZER_FILE, PolySpec, ReactionSpec, read_manifest
from core.encoder import Encoder
from core.records import Candidate
from core.store import IndexStore
from index.build import build_version
from models.encoder import DualEncoder, minilm_path, tiny_body
from models.export import ExportConfig, export_bundle
from models.poly import PolyHead
from models.reactions import ReactionModel

REDIS_URL = "redis://127.0.0.1:6379/15"  # a database of its own, flushed by the tests

PAIRS = [
    ("hi! how are you?", "i'm good thanks, how about you?"),
    ("what's your favourite food?", "pizza, no contest"),
    ("do you like dogs?", "i love dogs, i have a golden retriever"),
    ("where are you from?", "i grew up in utah"),
    ("good night", "night! sleep well"),
    ("what do you do for fun?", "mostly hiking and board games"),
    ("i just got a new job!", "congrats! that's awesome"),
    ("my cat is sick", "oh no, i hope she gets better soon"),
    ("have you seen any good movies lately?", "i watched dune last week, it was great"),
    ("what's the weather like there?", "sunny and way too hot"),
    ("are you a student?", "yeah, i study computer science"),
    ("do you play any sports?", "i play volleyball on weekends"),
]
REPLY_ONLY = ["lol", "haha that's funny", "oh really?", "no way", "that sounds fun", "same here"]
TINY_PARITY_TEXTS = [q for q, _ in PAIRS] + [r for _, r in PAIRS]


def tiny_candidates() -> list[Candidate]:
    return [Candidate(reply=r, query=q) for q, r in PAIRS] + [Candidate(reply=r) for r in REPLY_ONLY]


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"


def bundle_of(artifacts: Path) -> Path:
    """The one bundle a test artifacts/ directory holds."""
    return next(p for p in sorted((artifacts / "bundles").iterdir()) if (p / MANIFEST).is_file())


# The service's 250 ms Redis timeout is a latency bound; on a loaded CI machine a
# test that is about sessions or the cache would trip the bypass instead. Tests
# about timeouts set their own.
TEST_REDIS_TIMEOUT_MS = 1000


def settings_for(artifacts: Path, **overrides: object) -> Settings:
    """Settings serving the bundle under `artifacts` (not the release), with its index."""
    defaults = {
        "artifacts_dir": artifacts,
        "bundle_dir": bundle_of(artifacts),
        "redis_timeout_ms": TEST_REDIS_TIMEOUT_MS,
    }
    return Settings(**{**defaults, **overrides})  # type: ignore[arg-type]


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


REACTION_LABELS = ["lol", "oh no", "nice", "good night"]


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


def closed_port() -> int:
    """A port nothing listens on: bind, read the number, close."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


AppFactory = Callable[..., AbstractAsyncContextManager[httpx.AsyncClient]]


async def loaded(app: FastAPI, timeout_s: float = 60) -> None:
    """The lifespan starts serving at once and loads in the background; tests start once it is done."""
    for _ in range(int(timeout_s * 100)):
        if app.state.runtime is not None:
            return
        await asyncio.sleep(0.01)
    raise TimeoutError("the app did not finish loading")


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
