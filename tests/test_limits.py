"""Every limit: a bad value gets a 4xx in the one error shape, naming the field."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest

from app.schemas import (
    BODY_LIMITS,
    MAX_EXCLUDE_IDS,
    MAX_ID_CHARS,
    MAX_K,
    MAX_PAIRS,
    MAX_SESSION_ID_CHARS,
    MAX_TAGS,
    MAX_TURN_CHARS,
    MAX_TURNS,
)
from tests.helpers import AppFactory

pytestmark = pytest.mark.anyio

TOO_LONG = "a" * (MAX_TURN_CHARS + 1)

BAD_REPLY_BODIES: list[tuple[str, Any, str]] = [
    ("no context or session", {}, "context"),
    ("empty context", {"context": []}, "context"),
    ("too many turns", {"context": ["hi"] * (MAX_TURNS + 1)}, "context"),
    ("empty turn", {"context": ["hi", ""]}, "context.1"),
    ("blank turn", {"context": ["   "]}, "context.0"),
    ("NUL bytes only", {"context": ["\x00\x00"]}, "context.0"),
    ("a NUL inside a turn", {"context": ["hi\x00there"]}, "context.0"),
    ("zero-width spaces only", {"context": ["\u200b\u200b"]}, "context.0"),
    ("no-break spaces only", {"context": ["\u00a0 \u3000"]}, "context.0"),
    ("byte-order mark and joiners only", {"context": ["\ufeff\u200d\u2060"]}, "context.0"),
    ("k as a boolean", {"context": ["hi"], "k": True}, "k"),
    ("k as a string of digits", {"context": ["hi"], "k": "5"}, "k"),
    ("rerank as a string", {"context": ["hi"], "rerank": "yes"}, "rerank"),
    (
        "threshold as a string",
        {"context": ["hi"], "thresholds": {"reply_matching": "0.5"}},
        "thresholds.reply_matching",
    ),
    ("turn too long", {"context": [TOO_LONG]}, "context.0"),
    ("turn not a string", {"context": [42]}, "context.0"),
    ("context not a list", {"context": "hi"}, "context"),
    ("k zero", {"context": ["hi"], "k": 0}, "k"),
    ("k too large", {"context": ["hi"], "k": MAX_K + 1}, "k"),
    ("k not a number", {"context": ["hi"], "k": "five"}, "k"),
    ("unknown strategy", {"context": ["hi"], "strategies": ["telepathy"]}, "strategies.0"),
    ("no strategies", {"context": ["hi"], "strategies": []}, "strategies"),
    ("repeated strategy", {"context": ["hi"], "strategies": ["reply_matching", "reply_matching"]}, "strategies"),
    ("session without message", {"session_id": "s1"}, "message"),
    ("message without session", {"message": "hi"}, "session_id"),
    ("context and session", {"context": ["hi"], "session_id": "s1", "message": "hi"}, "context"),
    ("session id too long", {"session_id": "s" * (MAX_SESSION_ID_CHARS + 1), "message": "hi"}, "session_id"),
    ("session id with spaces", {"session_id": "a b", "message": "hi"}, "session_id"),
    ("message too long", {"session_id": "s1", "message": TOO_LONG}, "message"),
    ("blank message", {"session_id": "s1", "message": " "}, "message"),
    ("invisible message", {"session_id": "s1", "message": "\u200b"}, "message"),
    ("unknown field", {"context": ["hi"], "temperature": 0.7}, "temperature"),
    ("body not an object", ["hi"], "body"),
]

BAD_SIMILAR_BODIES: list[tuple[str, Any, str]] = [
    ("neither", {}, "text"),
    ("both", {"text": "hi", "pairs": [["a", "b"]]}, "text"),
    ("text too long", {"text": TOO_LONG}, "text"),
    ("empty text", {"text": ""}, "text"),
    ("no pairs", {"pairs": []}, "pairs"),
    ("too many pairs", {"pairs": [["a", "b"]] * (MAX_PAIRS + 1)}, "pairs"),
    ("pair of three", {"pairs": [["a", "b", "c"]]}, "pairs.0"),
    ("pair side too long", {"pairs": [["a", TOO_LONG]]}, "pairs.0.1"),
    ("k with pairs", {"pairs": [["a", "b"]], "k": 3}, "k"),
    ("k too large", {"text": "hi", "k": MAX_K + 1}, "k"),
    ("k as a boolean", {"text": "hi", "k": True}, "k"),
    ("blank text", {"text": " \u200b "}, "text"),
    ("NUL text", {"text": "\x00"}, "text"),
    ("blank side of a pair", {"pairs": [["a", "\u00a0"]]}, "pairs.0.1"),
]


def assert_error(response: httpx.Response, status: int, kind: str, field: str) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["kind"] == kind
    assert error["field"] == field
    assert field in error["message"] or error["field"] == "body"
    assert set(error) == {"kind", "message", "field", "details"}


@pytest.mark.parametrize(("case", "body", "field"), BAD_REPLY_BODIES, ids=[c[0] for c in BAD_REPLY_BODIES])
async def test_bad_reply_request(client: httpx.AsyncClient, case: str, body: Any, field: str) -> None:
    assert_error(await client.post("/reply", json=body), 422, "validation_error", field)


@pytest.mark.parametrize(("case", "body", "field"), BAD_SIMILAR_BODIES, ids=[c[0] for c in BAD_SIMILAR_BODIES])
async def test_bad_similar_request(client: httpx.AsyncClient, case: str, body: Any, field: str) -> None:
    assert_error(await client.post("/similar", json=body), 422, "validation_error", field)


async def test_malformed_json_names_the_body(client: httpx.AsyncClient) -> None:
    response = await client.post("/reply", content=b'{"context": [', headers={"content-type": "application/json"})
    assert_error(response, 422, "validation_error", "body")


async def test_oversize_body_is_413_before_parsing(client: httpx.AsyncClient) -> None:
    body = b'{"context": ["' + b"a" * BODY_LIMITS["/reply"] + b'"]}'
    response = await client.post("/reply", content=body, headers={"content-type": "application/json"})
    assert_error(response, 413, "payload_too_large", "body")


async def test_oversize_chunked_body_without_length_is_413(client: httpx.AsyncClient) -> None:
    async def chunks():  # type: ignore[no-untyped-def]
        for _ in range(BODY_LIMITS["/reply"] // 1024 + 1):
            yield b"a" * 1024

    response = await client.post("/reply", content=chunks(), headers={"content-type": "application/json"})
    assert_error(response, 413, "payload_too_large", "body")


def _longest_text(i: int) -> str:
    """A turn at its length limit, in the characters json.dumps writes longest (12 bytes each)."""
    return chr(0x1F600 + i % 64) * MAX_TURN_CHARS


async def test_the_largest_bodies_their_schema_allows_are_answered_not_refused_for_size(
    client: httpx.AsyncClient,
) -> None:
    """A schema-valid body is never a 413: the fuzzer's ST202 (#49, item 12), and a Korean client's long
    turns, were schema-valid bodies over a 64 KiB limit."""
    reply = {
        "context": [_longest_text(i) for i in range(MAX_TURNS)],
        "exclude_ids": [f"{i:0{MAX_ID_CHARS}d}" for i in range(MAX_EXCLUDE_IDS)],
        "filter": {"tags_none": [f"{i:032d}" for i in range(MAX_TAGS)]},
        "k": MAX_K,
    }
    similar = {"pairs": [[_longest_text(i), _longest_text(i + 1)] for i in range(MAX_PAIRS)]}
    for path, body in (("/reply", reply), ("/similar", similar)):
        content = json.dumps(body).encode()  # ensure_ascii, as Python clients send by default
        assert 64 * 1024 < len(content) <= BODY_LIMITS[path]
        response = await client.post(path, content=content, headers={"content-type": "application/json"})
        assert response.status_code == 200, response.text[:300]


async def test_unknown_route_and_method_use_the_same_shape(client: httpx.AsyncClient) -> None:
    missing = await client.get("/nope")
    assert missing.status_code == 404 and missing.json()["error"]["kind"] == "not_found"
    wrong = await client.get("/reply")
    assert wrong.status_code == 405 and wrong.json()["error"]["kind"] == "method_not_allowed"
    assert wrong.headers["allow"] == "POST"  # what a client may send instead


async def test_a_405_allows_every_method_of_the_path_not_only_its_first_route(client: httpx.AsyncClient) -> None:
    """POST and PUT on one path are two routes; Starlette's Allow named only the first (schemathesis ST205)."""
    wrong = await client.request("OPTIONS", "/admin/sets/english/candidates")
    assert wrong.status_code == 405 and wrong.json()["error"]["kind"] == "method_not_allowed"
    assert wrong.headers["allow"] == "POST, PUT"


async def test_text_in_any_script_with_emoji_and_line_breaks_is_fine(client: httpx.AsyncClient) -> None:
    body = {"context": ["안녕하세요!\n오늘 뭐 해?", "je suis là 🙂\tça va", "zero\u200bwidth inside is fine"]}
    assert (await client.post("/reply", json=body)).status_code == 200
    assert (await client.post("/similar", json={"pairs": [["안녕", "안녕하세요"]]})).status_code == 200


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b'{"context": ["caf\xe9 \xff\xfe"]}', id="invalid UTF-8"),
        pytest.param(b'{"context": ' + b"[" * 5000 + b"]" * 5000 + b"}", id="JSON nested too deep"),
    ],
)
@pytest.mark.parametrize("path", ["/reply", "/similar"])
async def test_a_body_that_cannot_be_parsed_names_the_body(client: httpx.AsyncClient, path: str, body: bytes) -> None:
    response = await client.post(path, content=body, headers={"content-type": "application/json"})
    assert_error(response, 422, "validation_error", "body")
    assert response.json()["error"]["details"] == [{"field": "body", "message": response.json()["error"]["message"]}]


async def until(condition: Callable[[], bool]) -> None:
    while not condition():
        await asyncio.sleep(0.001)


async def test_past_the_in_flight_limit_a_request_is_refused_before_its_body_is_read() -> None:
    from app.limits import Admission, AdmissionLimit

    release = asyncio.Event()
    reached = 0

    async def slow(scope: Any, receive: Any, send: Any) -> None:
        nonlocal reached
        await receive()
        reached += 1
        await release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    admission = Admission(max_in_flight=2)
    limited = AdmissionLimit(slow, admission, paths=frozenset({"/reply"}), max_drain_bytes=1 << 20)
    transport = httpx.ASGITransport(app=limited)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        held = [asyncio.create_task(client.post("/reply", json={"context": ["hi"]})) for _ in range(2)]
        await asyncio.wait_for(until(lambda: reached == 2), timeout=10)
        refused = await client.post("/reply", json={"context": ["hi"]})
        other_route = asyncio.create_task(client.post("/admin/index", json={}))  # not counted, so not refused
        await asyncio.wait_for(until(lambda: reached == 3), timeout=10)
        release.set()
        assert [r.status_code for r in await asyncio.gather(*held, other_route)] == [200, 200, 200]
        assert admission.in_flight == 0
        again = await client.post("/reply", json={"context": ["hi"]})
    assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
    assert refused.json()["error"]["kind"] == "overloaded"
    assert admission.refused == 1 and again.status_code == 200


async def test_a_request_holds_its_slot_until_answered_not_until_its_tail_has_run() -> None:
    """A client that asks again the moment its answer comes must find its slot free, whatever the
    answered request's middleware still does (logs, metrics): at as many clients as slots, the
    slot held to the end was a 429 with every other slot free."""
    from app.limits import Admission, AdmissionLimit

    tail = asyncio.Event()
    tails_waiting = 0

    async def answers_then_lingers(scope: Any, receive: Any, send: Any) -> None:
        nonlocal tails_waiting
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})
        tails_waiting += 1
        await tail.wait()

    admission = Admission(max_in_flight=1)
    limited = AdmissionLimit(answers_then_lingers, admission, paths=frozenset({"/reply"}), max_drain_bytes=1 << 20)
    scope = {"type": "http", "path": "/reply", "method": "POST", "headers": []}
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    first = asyncio.create_task(limited(scope, receive, send))
    await asyncio.wait_for(until(lambda: tails_waiting == 1), timeout=10)
    assert admission.in_flight == 0  # answered: the slot is free though its app has not returned
    second = asyncio.create_task(limited(scope, receive, send))
    await asyncio.wait_for(until(lambda: tails_waiting == 2), timeout=10)
    tail.set()
    await asyncio.gather(first, second)
    assert [m["status"] for m in sent if m["type"] == "http.response.start"] == [200, 200]
    assert admission.in_flight == 0 and admission.refused == 0


async def test_a_refused_request_is_drained_no_further_than_the_body_limit() -> None:
    """An overloaded server must not read a huge upload whole just to refuse it."""
    from app.limits import Admission, AdmissionLimit

    async def never(scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError("a refused request reached the app")

    sent = 0

    async def upload() -> AsyncIterator[bytes]:
        nonlocal sent
        for _ in range(100):  # 6.4 MB in 64 kB chunks
            sent += 1
            yield b"x" * 65536

    limited = AdmissionLimit(never, Admission(max_in_flight=0), paths=frozenset({"/reply"}), max_drain_bytes=1 << 20)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=limited), base_url="http://test") as client:
        refused = await client.post("/reply", content=upload())
    assert refused.status_code == 429 and refused.headers["connection"] == "close"
    assert sent <= (1 << 20) // 65536 + 2


async def test_while_full_a_body_that_never_comes_is_refused_at_its_deadline_and_closed() -> None:
    """The refusal before the body reader (counts=False) drains a refused body within the reader's
    deadline: a client that sends headers and no body gets its 429 then, with the connection closed,
    and never reaches the app."""
    from app.limits import Admission, AdmissionLimit

    async def never(scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError("a refused request reached the app")

    sent: list[dict[str, Any]] = []

    async def silent() -> dict[str, Any]:
        await asyncio.Event().wait()  # the body never comes
        raise AssertionError("unreachable")

    async def record(message: Any) -> None:
        sent.append(message)

    gate = AdmissionLimit(
        never, Admission(max_in_flight=0), frozenset({"/reply"}), 1 << 20, counts=False, drain_deadline_s=0.05
    )
    scope = {"type": "http", "path": "/reply", "method": "POST", "headers": []}
    await asyncio.wait_for(gate(scope, silent, record), timeout=10)
    assert sent[0]["status"] == 429 and (b"connection", b"close") in sent[0]["headers"]


async def test_an_admin_body_is_read_only_with_the_token_and_a_few_at_a_time() -> None:
    """#49, item 1: an unauthenticated 32 MiB upload was read whole before its 401, and nothing bounded
    how many were read at once. The gate answers before the first chunk is pulled."""
    from pydantic import SecretStr

    from app.limits import AdminGate

    release = asyncio.Event()
    reached = 0

    async def slow(scope: Any, receive: Any, send: Any) -> None:
        nonlocal reached
        while (await receive()).get("more_body"):
            pass
        if scope["method"] == "POST":
            reached += 1
            await release.wait()
        await send({"type": "http.response.start", "status": 202, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    pulled = 0

    async def upload() -> AsyncIterator[bytes]:
        nonlocal pulled
        for _ in range(512):  # 32 MiB in 64 kB chunks
            pulled += 1
            yield b"x" * 65536

    gate = AdminGate(slow, SecretStr("s3cret"), max_bodies=2)
    good = {"authorization": "Bearer s3cret"}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=gate), base_url="http://test") as client:
        for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": "Basic s3cret"}):
            refused = await client.post("/admin/sets/x/candidates", content=upload(), headers=headers)
            assert refused.status_code == 401 and refused.json()["error"]["field"] == "authorization"
        assert pulled <= 3  # at most the chunk httpx pulls before the app runs, never the body
        held = [asyncio.create_task(client.post("/admin/candidates", content=b"[]", headers=good)) for _ in range(2)]
        await asyncio.wait_for(until(lambda: reached == 2), timeout=10)
        busy = await client.post("/admin/candidates", content=b"[]", headers=good)
        assert busy.status_code == 429 and busy.headers["retry-after"] == "1"
        assert (await client.get("/admin/sets", headers=good)).status_code == 202  # no body: not counted
        release.set()
        assert [r.status_code for r in await asyncio.gather(*held)] == [202, 202]
        disabled = AdminGate(slow, None, max_bodies=2)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=disabled), base_url="http://t") as off:
            answer = await off.post("/admin/candidates", content=b"[]", headers=good)
            assert answer.status_code == 401 and "disabled" in answer.json()["error"]["message"]


async def _one_byte_then_nothing(stop: asyncio.Event) -> AsyncIterator[bytes]:
    """A body that sends its first byte and then nothing more, as a slow or idle client does."""
    yield b"{"
    await stop.wait()


SLOW = {"content-type": "application/json", "content-length": "1000"}


async def test_a_body_that_does_not_arrive_is_408_and_holds_no_in_flight_slot(make_client: AppFactory) -> None:
    """More sockets than the in-flight limit, each sending one byte of its declared body, held every
    slot with no deadline: every other /reply and /similar was 429 until they closed. A request is
    counted once its body is in, and a body that has not arrived by the deadline is answered 408."""
    stop = asyncio.Event()
    async with make_client(max_in_flight=2, body_read_timeout_s=1.0) as client:
        try:
            slow = [
                asyncio.create_task(client.post(path, content=_one_byte_then_nothing(stop), headers=SLOW))
                for path in ("/reply", "/reply", "/similar", "/reply")
            ]
            await asyncio.sleep(0.2)  # every slow body is being read
            app = client._transport.app  # type: ignore[attr-defined]
            assert app.state.service.admission.in_flight == 0
            answered = await asyncio.wait_for(client.post("/reply", json={"context": ["hi! how are you?"]}), 5)
            assert answered.status_code == 200, answered.text
            similar = await asyncio.wait_for(client.post("/similar", json={"pairs": [["hi", "hello"]]}), 5)
            assert similar.status_code == 200, similar.text
            timed_out = await asyncio.wait_for(asyncio.gather(*slow), 10)
        finally:
            stop.set()
    for response in timed_out:
        assert_error(response, 408, "request_timeout", "body")
        assert response.headers["connection"] == "close"  # the rest of the body is never read


async def test_past_the_bodies_being_read_bound_a_request_is_refused_unread(make_client: AppFactory) -> None:
    """Slow readers cannot pile up without bound: past `max_bodies_reading` a body is refused at once,
    unread (429, the connection closes), and a body that is in is still answered."""
    stop = asyncio.Event()
    async with make_client(max_bodies_reading=2, body_read_timeout_s=30.0) as client:
        try:
            slow = [
                asyncio.create_task(client.post("/reply", content=_one_byte_then_nothing(stop), headers=SLOW))
                for _ in range(2)
            ]
            await asyncio.sleep(0.2)
            refused = await asyncio.wait_for(
                client.post("/reply", content=_one_byte_then_nothing(stop), headers=SLOW), 5
            )
            assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
            assert refused.headers["connection"] == "close"
            assert refused.json()["error"]["kind"] == "overloaded"
        finally:
            stop.set()
        # Their bodies end unfinished: each is answered, none still counted.
        await asyncio.wait_for(asyncio.gather(*slow), 10)
        answered = await client.post("/reply", json={"context": ["hi! how are you?"]})
        assert answered.status_code == 200, answered.text
