"""app.client and the chitchat CLI against the real app: in process for the async client, under uvicorn on a
loopback port for the sync client and the CLI. Retries and request shapes on mock transports."""

from __future__ import annotations

import ast
import json
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from app import cli
from app.client import (
    AsyncChitchatClient,
    ChitchatClient,
    ChitchatError,
    Conflict,
    ConnectionFailed,
    InternalError,
    Job,
    NotFound,
    NotReady,
    Overloaded,
    PayloadTooLarge,
    Unauthorized,
    UnexpectedResponse,
    UploadAccepted,
    ValidationError,
    _base,
)
from app.client.errors import from_response
from app.main import create_app
from tests.helpers import loaded, settings_for

pytestmark = pytest.mark.anyio

TOKEN = "s3cret-token"
ROOT = Path(__file__).resolve().parents[1]
TACOS = {"query": "do you like tacos?", "reply": "tacos are life", "id": "taco-1"}


@pytest.fixture
def own_artifacts(artifacts: Path, tmp_path: Path) -> Path:
    """A private copy: uploads write versions, pointers and stores."""
    copy = tmp_path / "artifacts"
    shutil.copytree(artifacts, copy)
    return copy


@asynccontextmanager
async def in_process(artifacts: Path, **settings: object) -> AsyncIterator[AsyncChitchatClient]:
    app = create_app(settings_for(artifacts, **settings))
    async with app.router.lifespan_context(app):
        await loaded(app)
        transport = httpx.ASGITransport(app=app)
        async with AsyncChitchatClient("http://test", TOKEN, transport=transport) as client:
            yield client


@contextmanager
def serving(artifacts: Path, **settings: object) -> Iterator[str]:
    """The app under uvicorn in a thread, on a socket bound here (no race for the port). Yields its URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(create_app(settings_for(artifacts, **settings)), log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert thread.is_alive(), "uvicorn exited during startup"
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    url = f"http://127.0.0.1:{port}"
    try:
        with ChitchatClient(url) as client:
            client.wait_until_ready(timeout=60, poll_interval=0.05)  # uvicorn serves while the app loads
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


@pytest.fixture
def live_url(own_artifacts: Path) -> Iterator[str]:
    with serving(own_artifacts, admin_token=TOKEN) as url:
        yield url


# --- what the client imports -------------------------------------------------------------------------------

ALLOWED = {"httpx", "pydantic", "tqdm"} | set(sys.stdlib_module_names)


def _imports(path: Path) -> list[tuple[str, bool]]:
    """(module, at top level) for every import in `path`; relative imports resolved against app.client."""
    tree = ast.parse(path.read_text())
    top = {id(node) for node in tree.body}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, id(node) in top) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            assert node.level in (0, 1), f"{path.name}: import from above app.client"
            module = f"app.client.{node.module or ''}".rstrip(".") if node.level else str(node.module)
            found.append((module, id(node) in top))
    return found


def _allowed(module: str) -> bool:
    return module == "app.client" or module.startswith("app.client.") or module.split(".")[0] in ALLOWED


def test_the_client_imports_nothing_from_the_server() -> None:
    files = sorted((ROOT / "app" / "client").glob("*.py"))
    assert len(files) >= 4
    for path in files:
        bad = [module for module, _ in _imports(path) if not _allowed(module)]
        assert bad == [], f"{path.name} imports {bad}"


def test_the_cli_imports_only_the_client_and_uvicorn_only_to_serve() -> None:
    imports = _imports(ROOT / "app" / "cli.py")
    assert [m for m, top in imports if top and not _allowed(m)] == []
    assert [m for m, top in imports if not top] == ["uvicorn"]


def test_importing_the_client_and_cli_loads_no_server_module() -> None:
    server = "fastapi starlette uvicorn onnxruntime faiss numpy redis torch tokenizers pydantic_settings index models"
    code = (
        "import sys, app.client, app.cli\n"
        f"heavy = set({server.split()!r})\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy"
        " or (m.startswith('app.') and not m.startswith(('app.client', 'app.cli')))))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# --- the async client, in process --------------------------------------------------------------------------


async def test_reply_to_a_context_and_in_a_session(artifacts: Path) -> None:
    async with in_process(artifacts) as client:
        result = await client.reply(["my cat is sick"], k=3)
        assert result.reply == "oh no, i hope she gets better soon"
        assert result.source == "query_similarity" and result.score == pytest.approx(1.0, abs=1e-3)
        assert result.candidates[0].text == result.reply and len(result.candidates) <= 3
        assert result.index_version.startswith("v") and result.session_id is None

        only = await client.reply("do you play any sports?", strategies=["reply_matching"], rerank=False)
        assert only.source == "reply_matching" and {c.source for c in only.candidates} == {"reply_matching"}

        first = await client.reply(session_id="s-1", message="hi! how are you?")
        second = await client.reply(session_id="s-1", message="what's your favourite food?")
        assert first.session_id == second.session_id == "s-1"
        assert second.reply != first.reply  # the session remembers what the bot said


async def test_similar_text_and_pairs(artifacts: Path) -> None:
    async with in_process(artifacts) as client:
        text = await client.similar("do you like dogs?", k=2)
        assert text.scores is None and text.matches is not None and len(text.matches) == 2
        assert text.matches[0].query == "do you like dogs?"
        assert text.matches[0].reply == "i love dogs, i have a golden retriever"

        pairs = await client.similar(pairs=[("hi", "hi"), ("hi", "my cat is sick")])
        assert pairs.matches is None and pairs.scores is not None and len(pairs.scores) == 2
        assert pairs.scores[0] == pytest.approx(1.0, abs=1e-3) and pairs.scores[1] < pairs.scores[0]


async def test_health_ready_and_info(artifacts: Path) -> None:
    async with in_process(artifacts) as client:
        assert (await client.health()).status == "ok"
        ready = await client.ready()
        assert ready.ready and ready.redis == "disabled" and ready.index_version
        info = await client.info()
        assert info.model["name"] == "tiny-int8" and info.index["version"] == ready.index_version


async def test_errors_are_typed_with_the_services_kind_field_and_status(own_artifacts: Path) -> None:
    async with in_process(own_artifacts, admin_token=TOKEN) as client:
        with pytest.raises(ValidationError) as invalid:
            await client.reply(["hi"], k=0)
        assert invalid.value.status_code == 422 and invalid.value.field == "k"
        assert invalid.value.kind == "validation_error" and invalid.value.details[0]["field"] == "k"

        with pytest.raises(ValidationError) as both:
            await client.reply(["hi"], session_id="s", message="hello")
        assert both.value.field == "context"

        with pytest.raises(NotFound) as missing:
            await client.job("0123456789abcdef")
        assert missing.value.status_code == 404 and missing.value.field == "job_id"

        with pytest.raises(Conflict):
            await client.rollback()  # nothing older than the one version

        client.token = None
        with pytest.raises(Unauthorized) as unauthorized:
            await client.index()
        assert unauthorized.value.status_code == 401 and unauthorized.value.field == "authorization"
        assert isinstance(unauthorized.value, ChitchatError)


async def test_async_upload_from_a_json_file_and_from_records(own_artifacts: Path, tmp_path: Path) -> None:
    path = tmp_path / "candidates.json"
    path.write_text(json.dumps([TACOS]))
    async with in_process(own_artifacts, admin_token=TOKEN) as client:
        before = (await client.ready()).index_version
        job = await client.upload_candidates(path, progress=False, poll_interval=0.05, wait_timeout=60)
        assert isinstance(job, Job) and job.succeeded and job.stage == "done", job
        assert job.previous_version == before and job.version != before and job.counts["uploaded"] == 1
        assert (await client.reply(["do you like tacos?"])).id == "taco-1"

        accepted = await client.upload_candidates([{"id": "taco-1"}], "delete", wait=False)
        assert isinstance(accepted, UploadAccepted) and accepted.records == 1 and accepted.mode == "delete"
        deleted = await client.wait_for_job(accepted.job_id, progress=False, poll_interval=0.05, timeout=60)
        assert deleted.succeeded
        replies = [c.text for c in (await client.reply(["do you like tacos?"], k=50)).candidates]
        assert "tacos are life" not in replies

        with pytest.raises(ValidationError) as bad:
            await client.upload_candidates([{"reply": "ok"}, {"reply": ""}], progress=False)
        assert bad.value.field == "record 2.reply"


async def test_a_job_that_fails_is_returned_not_raised(own_artifacts: Path) -> None:
    async with in_process(own_artifacts, admin_token=TOKEN) as client:
        await client.upload_candidates([{"reply": "only", "id": "only"}], "replace", progress=False, poll_interval=0.05)
        job = await client.upload_candidates([{"id": "only"}], "delete", progress=False, poll_interval=0.05)
        assert job.state == "failed" and not job.succeeded and job.error and "no candidates" in job.error


# --- the sync client and the CLI, on a live server ---------------------------------------------------------


def test_sync_upload_streams_a_file_waits_and_rolls_back(
    live_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "candidates.jsonl"
    path.write_text(json.dumps(TACOS) + "\n\n" + json.dumps({"reply": "kiwi", "id": "k"}) + "\n")
    chunks: list[bytes] = []
    real_iter_file = _base.iter_file

    def counting(p: Path) -> Iterator[bytes]:
        for chunk in real_iter_file(p):
            chunks.append(chunk)
            yield chunk

    monkeypatch.setattr(_base, "CHUNK_BYTES", 16)
    monkeypatch.setattr(_base, "iter_file", counting)

    with ChitchatClient(live_url, TOKEN) as client:
        first = client.ready().index_version
        job = client.upload_candidates(path, progress=False, poll_interval=0.05, wait_timeout=60)
        assert job.succeeded and job.previous_version == first, job
        assert len(chunks) > 5 and b"".join(chunks) == path.read_bytes()  # sent as it was read

        tacos = client.reply(["do you like tacos?"])
        assert (tacos.reply, tacos.id, tacos.index_version) == ("tacos are life", "taco-1", job.version)
        index = client.index()
        assert index.current == job.version and index.previous == first and index.stored_candidates > 2

        rolled = client.rollback()
        assert (rolled.from_version, rolled.to_version) == (job.version, first)
        assert rolled.model_dump(by_alias=True) == {
            "set": "default",
            "from": job.version,
            "to": first,
            "after_swap": {"store": "done", "publish": "done", "prune": "done"},
        }
        assert client.reply(["do you like tacos?"]).index_version == first


def test_sync_errors_on_a_live_server(live_url: str) -> None:
    with ChitchatClient(live_url) as client:
        with pytest.raises(ValidationError) as invalid:
            client.similar("hi", pairs=[("a", "b")])
        assert invalid.value.field == "text" and invalid.value.request_id  # the id the server logged it under
        with pytest.raises(Unauthorized):
            client.job("0123456789abcdef")
    with ChitchatClient(live_url, "wrong") as client, pytest.raises(Unauthorized):
        client.rollback()


def test_cli_reply_and_upload(live_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "tacos.ndjson"
    path.write_text(json.dumps(TACOS) + "\n")
    connect = ["--url", live_url, "--token", TOKEN]

    assert cli.main([*connect, "upload", str(path)]) == 0
    out, err = capsys.readouterr()
    job = json.loads(out)
    assert job["state"] == "succeeded" and job["counts"]["uploaded"] == 1
    assert "100%" in err  # the progress bar

    assert cli.main(["reply", "do you like tacos?", "--url", live_url, "-k", "2"]) == 0
    reply = json.loads(capsys.readouterr().out)
    assert reply["reply"] == "tacos are life" and reply["index_version"] == job["version"]

    assert cli.main([*connect, "reply", "--session", "cli-1", "hi! how are you?"]) == 0
    assert json.loads(capsys.readouterr().out)["session_id"] == "cli-1"

    # Filters: "taco-1" is the only candidate with that id, and no candidate has that tag.
    assert cli.main(["reply", "do you like tacos?", "--url", live_url, "--exclude-id", "taco-1", "-k", "50"]) == 0
    assert "taco-1" not in {c["id"] for c in json.loads(capsys.readouterr().out)["candidates"]}
    assert cli.main(["reply", "do you like tacos?", "--url", live_url, "--tag", "no-such-tag"]) == 1
    assert "no_candidate" in capsys.readouterr().err

    # A named set: created by its first upload, answered from, listed, deleted.
    assert cli.main([*connect, "upload", str(path), "--set", "tacos", "--no-progress"]) == 0
    assert json.loads(capsys.readouterr().out)["state"] == "succeeded"
    assert cli.main([*connect, "reply", "do you like tacos?", "--set", "tacos"]) == 0
    assert json.loads(capsys.readouterr().out)["set"] == "tacos"
    assert cli.main([*connect, "sets"]) == 0
    assert {s["name"] for s in json.loads(capsys.readouterr().out)["sets"]} >= {"default", "tacos"}
    assert cli.main([*connect, "delete-set", "tacos"]) == 0
    capsys.readouterr()
    assert cli.main([*connect, "reply", "hi", "--set", "tacos"]) == 1
    assert "not_found" in capsys.readouterr().err

    assert cli.main([*connect, "upload", str(path), "--no-wait"]) == 0
    accepted = json.loads(capsys.readouterr().out)
    assert accepted["status"] == f"/admin/jobs/{accepted['job_id']}"
    assert cli.main([*connect, "job", accepted["job_id"]]) == 0
    assert json.loads(capsys.readouterr().out)["id"] == accepted["job_id"]


def test_cli_errors_exit_1_with_the_kind(live_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--url", live_url, "reply", "hi", "-k", "0"]) == 1
    assert capsys.readouterr().err.startswith("error: validation_error: k:")
    assert cli.main(["--url", live_url, "--token", "", "index"]) == 1
    assert "error: unauthorized:" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"reply": "a"}\n{oops\n')
    assert cli.main(["--url", live_url, "--token", TOKEN, "upload", str(bad)]) == 1
    assert "line 2" in capsys.readouterr().err
    assert cli.main(["--url", live_url, "--token", TOKEN, "upload", str(tmp_path / "missing.jsonl")]) == 1
    assert "No such file" in capsys.readouterr().err


def test_cli_upload_summarises_skipped_records_and_duplicates_on_stderr(
    live_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "mixed.csv"
    path.write_text(
        "query,reply,id\n"
        "do you like tacos?,tacos are life,taco-1\n"
        "hi there,hello, how are you today,greeting\n"  # an unquoted comma: skipped, not truncated
        'my cat is sick,"Oh no, I hope she gets better soon",cat\n'  # a stored reply's text
    )
    assert cli.main(["--url", live_url, "--token", TOKEN, "upload", str(path), "--on-invalid", "skip"]) == 0
    out, err = capsys.readouterr()
    job = json.loads(out)
    assert job["report"]["skipped"] == 1  # stdout stays the job's JSON
    assert "skipped 1 invalid record:" in err
    assert "line 3: 1 more field than the header; quote fields that contain commas" in err
    assert "1 duplicate, at 4: same reply text (once normalised) as a stored record" in err

    assert (
        cli.main(["--url", live_url, "--token", TOKEN, "upload", str(path), "--on-invalid", "skip", "--no-wait"]) == 0
    )
    out, err = capsys.readouterr()
    assert "skipped 1 invalid record; `chitchat job " in err
    queued = json.loads(out)
    assert cli.main(["--url", live_url, "--token", TOKEN, "jobs", "--limit", "2"]) == 0
    assert [j["id"] for j in json.loads(capsys.readouterr().out)] == [queued["job_id"], job["id"]]


def test_cli_serve_drains_for_20_s_without_uvicorns_access_log(monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[dict[str, Any]] = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **options: started.append({"app": app, **options}))
    assert cli.main(["serve", "--port", "8123"]) == 0
    assert started == [
        {
            "app": "app.main:create_app",
            "factory": True,
            "host": "127.0.0.1",
            "port": 8123,
            "access_log": False,  # the service's own JSON line per request is the access log
            "timeout_graceful_shutdown": 20,  # as `make serve` and the Dockerfile
        }
    ]


def test_cli_jobs_lists_the_recent_jobs(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json=JOBS_BODY)

    monkeypatch.setattr(cli, "_client", lambda args: _sync_client(answer))
    assert cli.main(["jobs", "--limit", "2"]) == 0
    assert [job["id"] for job in json.loads(capsys.readouterr().out)] == ["new", "old"]
    assert seen[0].url.params["limit"] == "2"
    assert cli.main(["jobs", "--limit", "0"]) == 1
    assert "limit must be at least 1" in capsys.readouterr().err


def test_cli_eval_explains_what_to_install(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    assert cli.main(["eval", "--examples", "10"]) == 2
    assert "make install-train" in capsys.readouterr().err


# --- retries and request shapes, on mock transports --------------------------------------------------------

REPLY_BODY = {
    "reply": "hey",
    "id": "r1",
    "source": "reply_matching",
    "score": 0.5,
    "reranked": False,
    "candidates": [],
    "index_version": "v1",
}
ACCEPTED_BODY = {"job_id": "abc", "state": "queued", "mode": "append", "records": 1, "status": "/admin/jobs/abc"}
OK_BODIES: dict[str, Any] = {
    "/reply": REPLY_BODY,
    "/similar": {"matches": [], "index_version": "v1"},
    "/healthz": {"status": "ok"},
    "/admin/jobs/abc": {"id": "abc", "mode": "append", "state": "queued"},
    "/admin/candidates": ACCEPTED_BODY,
    "/admin/rollback": {"from": "v2", "to": "v1"},
}


def ok(request: httpx.Request) -> httpx.Response:
    return httpx.Response(202 if request.url.path == "/admin/candidates" else 200, json=OK_BODIES[request.url.path])


BUSY: dict[str, Any] = {"error": {"kind": "overloaded", "message": "busy", "field": None, "details": []}}
SyncCall = Callable[[ChitchatClient], object]


def _failure(kind: str, request: httpx.Request) -> httpx.Response:
    if kind == "connect":
        raise httpx.ConnectError("connection refused", request=request)
    if kind == "429":
        return httpx.Response(429, json=BUSY, headers={"retry-after": "0"})
    return httpx.Response(
        503, json={"error": {"kind": "not_ready", "message": "loading", "field": None, "details": []}}
    )


class Flaky:
    """Fails the first `failures` requests with `kind`, then passes them to `then`."""

    def __init__(self, kind: str, failures: int, then: Callable[[httpx.Request], httpx.Response]) -> None:
        self.kind, self.failures, self.then = kind, failures, then
        self.attempts = 0
        self.request_ids: set[str] = set()

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.attempts += 1
        self.request_ids.add(request.headers["x-request-id"])
        if self.attempts <= self.failures:
            return _failure(self.kind, request)
        return self.then(request)


class AsyncFlaky(httpx.AsyncBaseTransport):
    """Flaky in front of the real app."""

    def __init__(self, kind: str, failures: int, inner: httpx.AsyncBaseTransport) -> None:
        self.kind, self.failures, self.inner = kind, failures, inner
        self.attempts = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.attempts += 1
        if self.attempts <= self.failures:
            return _failure(self.kind, request)
        return await self.inner.handle_async_request(request)


EXPECTED = {"503": NotReady, "429": Overloaded, "connect": ConnectionFailed}


def _sync_client(handler: Callable[[httpx.Request], httpx.Response], retries: int = 2) -> ChitchatClient:
    client = ChitchatClient("http://test", TOKEN, retries=retries, transport=httpx.MockTransport(handler))
    client._sleep = lambda seconds: None
    return client


@pytest.mark.parametrize("kind", ["503", "429", "connect"])
def test_safe_calls_are_retried_up_to_retries(kind: str) -> None:
    calls: list[SyncCall] = [
        lambda c: c.reply(["hi"]),
        lambda c: c.similar("hi"),
        lambda c: c.job("abc"),
        lambda c: c.health(),
    ]
    for call in calls:
        flaky = Flaky(kind, 2, ok)
        with _sync_client(flaky, retries=2) as client:
            call(client)
        assert flaky.attempts == 3 and len(flaky.request_ids) == 1  # one id across the retries

        flaky = Flaky(kind, 2, ok)
        with _sync_client(flaky, retries=1) as client, pytest.raises(EXPECTED[kind]):
            call(client)
        assert flaky.attempts == 2


@pytest.mark.parametrize("kind", ["503", "429", "connect"])
def test_session_replies_uploads_and_rollbacks_are_sent_once(kind: str, tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    path.write_text('{"reply": "x"}\n')
    calls: list[SyncCall] = [
        lambda c: c.reply(session_id="s", message="hi"),
        lambda c: c.upload_candidates(path, wait=False),
        lambda c: c.upload_candidates([{"reply": "x"}], wait=False),
        lambda c: c.rollback(),
    ]
    for call in calls:
        flaky = Flaky(kind, 1, ok)
        with _sync_client(flaky, retries=5) as client, pytest.raises(EXPECTED[kind]):
            call(client)
        assert flaky.attempts == 1


async def test_async_retries_against_the_real_app(own_artifacts: Path) -> None:
    app = create_app(settings_for(own_artifacts, admin_token=TOKEN))
    slept: list[float] = []

    async def record(seconds: float) -> None:
        slept.append(seconds)

    async with app.router.lifespan_context(app):
        await loaded(app)
        for kind in ("503", "429", "connect"):
            slept.clear()
            flaky = AsyncFlaky(kind, 2, httpx.ASGITransport(app=app))
            async with AsyncChitchatClient("http://test", TOKEN, retries=2, transport=flaky) as client:
                client._sleep = record
                assert (await client.reply(["my cat is sick"])).reply == "oh no, i hope she gets better soon"
                assert flaky.attempts == 3 and len(slept) == 2

                flaky.attempts = 0
                with pytest.raises(EXPECTED[kind]):
                    await client.reply(session_id="s", message="hi")
                assert flaky.attempts == 1

                flaky.attempts = 0
                with pytest.raises(EXPECTED[kind]):
                    await client.upload_candidates([{"reply": "x"}], progress=False)
                assert flaky.attempts == 1


def test_retry_after_is_honoured_else_backoff_doubles() -> None:
    slept: list[float] = []
    busy = BUSY
    responses = iter(
        [
            httpx.Response(429, json=busy, headers={"retry-after": "3"}),
            httpx.Response(503),
            httpx.Response(503),
            httpx.Response(200, json=REPLY_BODY),
        ]
    )
    transport = httpx.MockTransport(lambda r: next(responses))
    client = ChitchatClient("http://test", retries=3, backoff=1.0, transport=transport)
    client._sleep = slept.append
    assert client.reply(["hi"]).reply == "hey"
    assert slept[0] == 3.0
    assert 1.0 <= slept[1] <= 2.0 and 2.0 <= slept[2] <= 4.0  # attempts 1 and 2: 2 s and 4 s, jittered down

    too_long = httpx.Response(429, json=busy, headers={"retry-after": "3600"})
    client = ChitchatClient("http://test", retries=3, transport=httpx.MockTransport(lambda r: too_long))
    with pytest.raises(Overloaded) as error:
        client.reply(["hi"])
    assert error.value.retry_after == 3600.0


def test_wait_until_ready_waits_out_a_loading_server() -> None:
    loading = {"ready": False, "bundle": None, "index_version": None, "redis": "disabled", "problem": "loading"}
    ready = {**loading, "ready": True, "bundle": "b", "index_version": "v1", "problem": None}
    answers: Iterator[httpx.Response | Exception] = iter(
        [
            httpx.ConnectError("refused"),  # not listening yet
            httpx.Response(503, json=loading),
            httpx.Response(503, text="proxy says no"),
            httpx.Response(200, json=ready),
        ]
    )

    def answer(request: httpx.Request) -> httpx.Response:
        given = next(answers)
        if isinstance(given, Exception):
            raise given
        return given

    with _sync_client(answer, retries=0) as client:
        assert client.wait_until_ready(timeout=60).index_version == "v1"
    with (
        _sync_client(lambda r: httpx.Response(503, json=loading)) as client,
        pytest.raises(TimeoutError, match="loading"),
    ):
        client.wait_until_ready(timeout=0.05, poll_interval=0.01)


def test_uploads_send_the_files_type_length_and_options(tmp_path: Path) -> None:
    seen: list[httpx.Request] = []

    def record(request: httpx.Request) -> httpx.Response:
        request.read()
        seen.append(request)
        return httpx.Response(202, json=ACCEPTED_BODY)

    types = [("a.csv", "text/csv"), ("b.JSONL", "application/x-ndjson"), ("c.json", "application/json")]
    for name, content_type in types:
        path = tmp_path / name
        path.write_text("query,reply,id\nhi,hello,1\n")
        with _sync_client(record) as client:
            client.upload_candidates(path, "replace", on_invalid="skip", wait=False)
        request = seen[-1]
        assert request.headers["content-type"] == content_type
        assert request.headers["content-length"] == str(path.stat().st_size)
        assert "transfer-encoding" not in request.headers
        assert request.content == path.read_bytes()
        assert dict(request.url.params) == {"mode": "replace", "on_invalid": "skip"}
        assert request.headers["authorization"] == f"Bearer {TOKEN}"

    with _sync_client(record) as client, pytest.raises(ValueError, match="extension"):
        client.upload_candidates(tmp_path / "c.txt", wait=False)
    assert len(seen) == 3


def test_non_json_and_unknown_errors_still_map_to_exceptions() -> None:
    def response(status: int, **kwargs: Any) -> httpx.Response:
        return httpx.Response(status, request=httpx.Request("GET", "http://test/x"), **kwargs)

    gateway = from_response(response(502, text="<html>Bad Gateway</html>"))
    assert isinstance(gateway, InternalError) and gateway.status_code == 502 and "Bad Gateway" in gateway.message
    too_large = from_response(response(413, text=""))
    assert isinstance(too_large, PayloadTooLarge) and too_large.message == "HTTP 413 Request Entity Too Large"
    new_kind = from_response(response(418, json={"error": {"kind": "teapot", "message": "short and stout"}}))
    assert type(new_kind) is ChitchatError and new_kind.kind == "teapot" and str(new_kind) == "teapot: short and stout"
    overloaded = {"error": {"kind": "overloaded", "message": "busy"}}
    busy = from_response(response(429, json=overloaded, headers={"retry-after": "2"}))
    assert isinstance(busy, Overloaded) and busy.retry_after == 2.0

    with _sync_client(lambda r: httpx.Response(200, text="not json")) as client, pytest.raises(UnexpectedResponse):
        client.health()


def test_unknown_response_fields_are_kept_and_readiness_503_is_an_answer() -> None:
    job = {"id": "abc", "mode": "append", "state": "succeeded", "stage": "done", "progress": 1.0, "skipped": 3}
    with _sync_client(lambda r: httpx.Response(200, json=job)) as client:
        found = client.job("abc")
    assert found.succeeded and found.model_extra == {"skipped": 3} and found.model_dump()["skipped"] == 3

    not_ready = {"ready": False, "bundle": None, "index_version": None, "redis": "disabled"}
    with _sync_client(lambda r: httpx.Response(503, json=not_ready)) as client:
        assert client.ready().ready is False
    with _sync_client(lambda r: httpx.Response(503, text="upstream down")) as client, pytest.raises(NotReady):
        client.ready()


JOBS_BODY: dict[str, Any] = {
    "jobs": [
        {
            "id": "new",
            "mode": "append",
            "state": "succeeded",
            "report": {"skipped": 1, "skipped_records": [{"line": 2, "field": "line 2.reply", "reason": "too long"}]},
        },
        {"id": "old", "mode": "replace", "state": "failed", "error": "ValueError: no candidates"},
    ]
}


async def test_jobs_asks_for_the_newest_n_and_parses_typed_jobs() -> None:
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json=JOBS_BODY)

    with _sync_client(answer) as client:
        jobs = client.jobs(5)
        assert [(j.id, j.state) for j in jobs] == [("new", "succeeded"), ("old", "failed")]
        assert jobs[0].report["skipped_records"][0]["line"] == 2 and jobs[1].report == {}
        client.jobs()
        with pytest.raises(ValueError, match="at least 1"):
            client.jobs(0)
    async with AsyncChitchatClient("http://test", TOKEN, transport=httpx.MockTransport(answer)) as aclient:
        assert [j.id for j in await aclient.jobs(3)] == ["new", "old"]
    assert [(r.method, r.url.path, dict(r.url.params)) for r in seen] == [
        ("GET", "/admin/jobs", {"limit": "5"}),
        ("GET", "/admin/jobs", {"limit": str(_base.DEFAULT_JOBS)}),
        ("GET", "/admin/jobs", {"limit": "3"}),
    ]
    assert all(r.headers["authorization"] == f"Bearer {TOKEN}" for r in seen)


def test_skipped_and_report_are_typed_fields() -> None:
    assert UploadAccepted.model_validate(ACCEPTED_BODY).skipped == 0  # a server that predates on_invalid
    assert UploadAccepted.model_validate({**ACCEPTED_BODY, "skipped": 2}).model_extra == {}
    job = Job.model_validate({"id": "a", "mode": "append", "state": "queued"})
    assert job.report == {} and "report" in Job.model_fields and "skipped" in UploadAccepted.model_fields


async def test_skipping_invalid_records_through_the_client(own_artifacts: Path) -> None:
    records = [TACOS, {"reply": "x" * 1001}, {"reply": "tacos are LIFE", "id": "taco-2"}]
    async with in_process(own_artifacts, admin_token=TOKEN) as client:
        accepted = await client.upload_candidates(records, on_invalid="skip", wait=False)
        assert (accepted.records, accepted.skipped) == (2, 1)
        job = await client.wait_for_job(accepted.job_id, progress=False, poll_interval=0.05, timeout=60)
        assert job.succeeded, job
        assert [(r["line"], r["field"]) for r in job.report["skipped_records"]] == [(2, "record 2.reply")]
        assert job.report["duplicates"]["texts"]["lines"] == [3]


async def test_jobs_against_the_real_app(own_artifacts: Path) -> None:
    async with in_process(own_artifacts, admin_token=TOKEN) as client:
        first = await client.upload_candidates([TACOS], progress=False, poll_interval=0.05, wait_timeout=60)
        second = await client.upload_candidates([{"reply": "kiwi"}], progress=False, poll_interval=0.05)
        jobs = await client.jobs(10)
        assert [j.id for j in jobs][:2] == [second.id, first.id]  # newest first
        assert jobs[0].succeeded and jobs[0].counts["uploaded"] == 1
        assert [j.id for j in await client.jobs(1)] == [second.id]
