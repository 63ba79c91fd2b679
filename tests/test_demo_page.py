"""The demo chat page at /: served by the app, and driven in a real headless Chromium
against a real uvicorn server on the tiny test bundle."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest

from tests.helpers import AUTH, PAIRS, REPLY_ONLY, TOKEN, bundle_of

if TYPE_CHECKING:
    from playwright.sync_api import Page, Route

pytestmark = pytest.mark.anyio

REPO_ROOT = Path(__file__).resolve().parent.parent
SOURCES = {"query_similarity", "reply_matching", "reaction"}
SESSION_ID = re.compile(r"^demo-[0-9a-f]{16}$")
SCORE = re.compile(r"-?\d+\.\d{3}")
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",  # CI runs as root, where Chromium's sandbox refuses to start
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    # No network beyond the test server: no update checks, no sync, no component downloads.
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
TIMEOUT_MS = 20_000  # a first reply on a loaded 2-core CI machine can take seconds


async def test_the_page_and_its_assets_are_served(client: httpx.AsyncClient) -> None:
    page = await client.get("/")
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    assert '<script src="static/chat.js"' in page.text
    assert '<link rel="stylesheet" href="static/chat.css">' in page.text

    script = await client.get("/static/chat.js")
    assert script.status_code == 200
    assert "javascript" in script.headers["content-type"]
    assert "fetch(" in script.text
    assert (await client.get("/static/chat.css")).status_code == 200

    # A page is not an API operation, and a missing asset still gets the service's error shape.
    assert "/" not in (await client.get("/openapi.json")).json()["paths"]
    missing = await client.get("/static/nope.js")
    assert missing.status_code == 404
    assert missing.json()["error"]["kind"] == "not_found"


def _chromium_path() -> str:
    """Debian's Chromium; the browser test skips, saying how to get what is missing."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        pytest.skip(
            "the `playwright` Python package is not installed: run `.venv/bin/pip install playwright` "
            "(no `playwright install`: the test drives Debian's /usr/bin/chromium)"
        )
    found = "/usr/bin/chromium" if Path("/usr/bin/chromium").is_file() else shutil.which("chromium")
    if not found:
        pytest.skip("Chromium not found at /usr/bin/chromium or on PATH: run `apt-get install -y chromium` (Debian)")
    return found


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def server(artifacts: Path, tmp_path: Path) -> Iterator[str]:
    """A real uvicorn process on a copy of the test artifacts (admin uploads and indexes write there)."""
    copy = Path(shutil.copytree(artifacts, tmp_path / "artifacts"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHITCHAT_")}
    env |= {
        "CHITCHAT_ARTIFACTS_DIR": str(copy),
        "CHITCHAT_BUNDLE_DIR": str(bundle_of(copy)),
        # One thread: the tiny model needs no more, and CI shares its cores with other jobs.
        "CHITCHAT_ORT_INTRA_OP_THREADS": "1",
        "CHITCHAT_ADMIN_TOKEN": TOKEN,  # the README's walk-through uploads a set of its own
    }
    port = _free_port()
    log_path = tmp_path / "server.log"
    command = [sys.executable, "-m", "uvicorn", "app.main:create_app", "--factory", "--host", "127.0.0.1"]
    with log_path.open("wb") as log:
        # A file, not a pipe: nobody reads a pipe while the test runs, and a full one would block the server.
        process = subprocess.Popen([*command, "--port", str(port)], cwd=REPO_ROOT, env=env, stdout=log, stderr=log)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if process.poll() is not None:
                pytest.fail(f"uvicorn exited with {process.returncode}:\n{log_path.read_text()[-3000:]}")
            try:
                if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"/readyz not 200 within 60 s:\n{log_path.read_text()[-3000:]}")
            time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture
def chromium() -> str:
    return _chromium_path()


@pytest.fixture
def page(chromium: str, server: str) -> Iterator[Page]:
    # chromium first: a skip must not wait for a server to start.
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        # launch() gives Chromium a fresh temporary --user-data-dir and removes it on close.
        browser = p.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_FLAGS)
        try:
            context = browser.new_context(viewport={"width": 375, "height": 800}, base_url=server)
            context.set_default_timeout(TIMEOUT_MS)
            yield context.new_page()
        finally:
            browser.close()


def _output_dir(tmp_path: Path) -> Path:
    out = Path(os.environ.get("CHITCHAT_TEST_OUTPUT") or tmp_path)
    out.mkdir(parents=True, exist_ok=True)
    return out


def test_a_conversation_in_a_phone_sized_browser(
    page: Page, artifacts: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Only importable once the chromium fixture has not skipped.
    from playwright.sync_api import expect

    expect.set_options(timeout=TIMEOUT_MS)
    script_errors: list[str] = []
    console_errors: list[str] = []  # failed requests show up here too
    page.on("pageerror", lambda error: script_errors.append(str(error)))
    page.on("console", lambda message: console_errors.append(message.text) if message.type == "error" else None)

    page.goto("/")
    expect(page.locator("#model-name")).to_have_text(bundle_of(artifacts).name)
    expect(page.locator("#index-version")).to_have_text(re.compile(r"^v"))
    session = page.locator("#session-id")
    expect(session).to_have_text(SESSION_ID)
    first_session = session.inner_text()

    box = page.get_by_label("Your message")
    expect(box).to_be_focused()
    bot = page.locator(".msg.bot:not(.thinking)")

    box.fill("my cat is sick")
    box.press("Enter")
    expect(bot).to_have_count(1)
    expect(box).to_be_focused()  # keyboard users type on without reaching for the mouse
    expect(box).to_have_value("")
    reply = bot.first
    assert reply.locator(".text").inner_text().strip()
    assert reply.locator(".meta .source").inner_text() in SOURCES
    expect(reply.locator(".meta .score")).to_have_text(re.compile(r"^score " + SCORE.pattern + "$"))
    candidates = reply.locator(".candidate")
    assert candidates.count() >= 1
    expect(candidates.first.locator(".score")).to_have_text(SCORE)
    assert candidates.first.locator(".source").inner_text() in SOURCES
    expect(page.locator("#announcer")).to_have_text("Bot: " + reply.locator(".text").inner_text())

    box.fill("do you like dogs?")
    box.press("Enter")
    expect(bot).to_have_count(2)
    expect(page.locator(".msg.user")).to_have_count(2)
    assert bot.nth(1).locator(".text").inner_text().strip()
    expect(session).to_have_text(first_session)
    expect(page.locator("#error")).to_be_hidden()
    # Phone width: nothing may overflow sideways.
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")

    screenshot = _output_dir(tmp_path) / "demo.png"
    page.screenshot(path=str(screenshot))
    with capsys.disabled():
        print(f"\ndemo page screenshot: {screenshot}")

    page.get_by_role("button", name="New conversation").click()
    expect(page.locator(".msg")).to_have_count(0)
    expect(session).not_to_have_text(first_session)
    expect(session).to_have_text(SESSION_ID)
    expect(box).to_be_focused()
    assert not console_errors, console_errors

    # An overloaded service: the page shows its message, says to retry, and gives the text back.
    def overloaded(route: Route) -> None:
        body = {"error": {"kind": "overloaded", "message": "too many requests", "field": None, "details": []}}
        route.fulfill(status=429, headers={"Retry-After": "1"}, content_type="application/json", body=json.dumps(body))

    page.route("**/reply", overloaded)
    box.fill("hello?")
    box.press("Enter")
    expect(page.locator("#error")).to_have_text(re.compile(r"too many requests.*retry in 1 s", re.IGNORECASE))
    expect(box).to_have_value("hello?")
    expect(page.locator(".msg")).to_have_count(0)
    page.unroute("**/reply")

    # The tag filter goes with the message; the tiny index has no tags, so the service says nothing matches.
    sent: list[dict[str, object]] = []
    page.route("**/reply", lambda route: (sent.append(route.request.post_data_json), route.continue_()))
    page.get_by_label("Only tags").fill(" kids, greeting ,kids")
    box.fill("hello?")
    box.press("Enter")
    expect(page.locator("#error")).to_have_text(re.compile(r"no candidate matches the filter"))
    assert sent[-1]["filter"] == {"tags_any": ["kids", "greeting"]}
    page.get_by_label("Only tags").fill("")
    box.fill("hello?")
    box.press("Enter")
    expect(bot).to_have_count(1)
    assert "filter" not in sent[-1]
    console_errors.clear()  # the 404 above is logged as a failed request
    page.unroute("**/reply")

    # The set picker lists the sets /readyz names; a reply is asked of the one picked. This server has
    # only the default set, so /readyz is answered here with one more, which the server then does not know.
    def two_sets(route: Route) -> None:
        body = {"ready": True, "bundle": "b", "index_version": "v1", "sets": {"default": "v1", "kids": "v2"}}
        route.fulfill(status=200, content_type="application/json", body=json.dumps(body))

    page.route("**/readyz", two_sets)
    page.reload()
    picker = page.get_by_label("Set")
    expect(picker.locator("option")).to_have_count(2)
    picker.select_option("kids")
    page.route("**/reply", lambda route: (sent.append(route.request.post_data_json), route.continue_()))
    box.fill("hello?")
    box.press("Enter")
    expect(page.locator("#error")).to_have_text(re.compile(r"no candidate set 'kids'"))
    assert sent[-1]["set"] == "kids"
    console_errors.clear()

    assert not script_errors, script_errors


KOREAN_REPLIES = ["축하해! 정말 잘됐다", "헐 괜찮아? 많이 아파?", "나도 치킨 좋아해 ㅋㅋ"]


def _upload(server: str, path: str, records: list[dict[str, str]]) -> None:
    """Records through the admin API, waiting for the reindex to finish."""
    accepted = httpx.post(f"{server}{path}", json=records, headers=AUTH, timeout=30)
    assert accepted.status_code == 202, accepted.text
    for _ in range(600):
        job = httpx.get(f"{server}{accepted.json()['status']}", headers=AUTH, timeout=10).json()
        if job["state"] in ("succeeded", "failed"):
            break
        time.sleep(0.1)
    assert job["state"] == "succeeded", job


def test_the_readme_korean_walk_through_in_a_browser(page: Page, server: str) -> None:
    """README, "A Korean set": upload Korean replies into a set of their own, pick it on the page, chat in Korean."""
    from playwright.sync_api import expect

    expect.set_options(timeout=TIMEOUT_MS)
    records = [{"reply": r, "id": f"ko-{i}", "language": "ko"} for i, r in enumerate(KOREAN_REPLIES)]
    _upload(server, "/admin/sets/korean/candidates", records)

    page.goto("/")
    picker = page.get_by_label("Set")
    expect(picker.locator("option")).to_have_count(2)  # default, korean: from /readyz
    picker.select_option("korean")
    box = page.get_by_label("Your message")
    box.fill("나 오늘 합격했어!")
    box.press("Enter")
    bot = page.locator(".msg.bot:not(.thinking)")
    expect(bot).to_have_count(1)
    assert bot.first.locator(".text").inner_text().strip() in KOREAN_REPLIES
    expect(page.locator("#index-version")).to_have_text(re.compile(r"^korean v"))
    expect(page.locator("#error")).to_be_hidden()


# The default set as `make run` builds it: English and Korean replies, each with its language.
DEFAULT_KOREAN = ["주말에 등산 가려고 ㅋㅋ", "나도 배고파 ㅠㅠ", "헐 진짜? 대박"]
DEFAULT_ENGLISH = [r for _, r in PAIRS] + REPLY_ONLY


def test_a_korean_message_on_the_default_set_gets_a_korean_reply(page: Page, server: str) -> None:
    """The default set holds both languages: each message is answered in its own, and the page can ask for another."""
    from playwright.sync_api import expect

    expect.set_options(timeout=TIMEOUT_MS)
    records = [{"reply": r, "language": "ko"} for r in DEFAULT_KOREAN]
    _upload(
        server, "/admin/candidates?mode=replace", records + [{"reply": r, "language": "en"} for r in DEFAULT_ENGLISH]
    )

    sent: list[dict[str, object]] = []
    page.route("**/reply", lambda route: (sent.append(route.request.post_data_json), route.continue_()))
    page.goto("/")
    box = page.get_by_label("Your message")
    bot = page.locator(".msg.bot:not(.thinking)")
    box.fill("주말에 뭐 해?")
    box.press("Enter")
    expect(bot).to_have_count(1)
    reply = bot.first.locator(".text")
    assert reply.inner_text().strip() in DEFAULT_KOREAN
    expect(reply).to_have_attribute("lang", "ko")  # a Korean font and voice for it
    assert {c.strip() for c in bot.first.locator(".candidate-text").all_inner_texts()} <= set(DEFAULT_KOREAN)
    assert "filter" not in sent[-1]  # the message's own language: nothing to ask

    box.fill("do you like dogs?")
    box.press("Enter")
    expect(bot).to_have_count(2)
    assert bot.nth(1).locator(".text").inner_text().strip() in DEFAULT_ENGLISH

    page.get_by_label("Replies in").select_option("en")  # the same session, English asked for
    box.fill("배고파 죽겠다")
    box.press("Enter")
    expect(bot).to_have_count(3)
    assert bot.nth(2).locator(".text").inner_text().strip() in DEFAULT_ENGLISH
    assert sent[-1]["filter"] == {"language": "en"}
    expect(page.locator("#error")).to_be_hidden()
