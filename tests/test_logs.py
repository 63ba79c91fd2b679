"""One JSON access line per request, with the request id the response carries; no text unless asked."""

from __future__ import annotations

import json
import logging

import pytest

from app import logs
from app.schemas import BODY_LIMITS
from tests.helpers import AppFactory

JSON_BODY = {"content-type": "application/json"}

pytestmark = pytest.mark.anyio


def access_lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, object]]:
    formatter = logs.JsonFormatter()
    return [json.loads(formatter.format(r)) for r in caplog.records if r.name == "chitchat.access"]


async def test_each_request_logs_one_json_line_with_its_id_and_what_served_it(
    make_client: AppFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="chitchat.access")
    async with make_client() as client:
        response = await client.post("/reply", json={"session_id": "user-7", "message": "my cat is sick"})
        echoed = await client.get("/healthz", headers={"x-request-id": "caller-chosen-42"})
        hostile = await client.get("/healthz", headers={"x-request-id": "bad id\r\nx: y"})
        too_big = await client.post("/reply", content=b"x" * (BODY_LIMITS["/reply"] + 1), headers=JSON_BODY)
    lines = access_lines(caplog)
    assert [line["status"] for line in lines] == [200, 200, 200, 413]
    reply = lines[0]
    assert reply["request_id"] == response.headers["x-request-id"]
    assert reply["path"] == "/reply" and reply["method"] == "POST" and reply["duration_ms"] > 0
    assert reply["source"] == response.json()["source"]
    assert reply["index_version"] == response.json()["index_version"]
    assert reply["session"] == logs.session_digest("user-7") and "user-7" not in json.dumps(reply)
    assert "cat" not in json.dumps(lines)  # the conversation's text is not logged by default
    assert echoed.headers["x-request-id"] == "caller-chosen-42" == lines[1]["request_id"]
    assert hostile.headers["x-request-id"] != "bad id\r\nx: y" and len(hostile.headers["x-request-id"]) == 32
    assert too_big.headers["x-request-id"] == lines[3]["request_id"]


async def test_the_text_is_logged_only_when_asked(make_client: AppFactory, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="chitchat.access")
    async with make_client(log_text=True) as client:
        await client.post("/reply", json={"context": ["my cat is sick"]})
    assert access_lines(caplog)[0]["text"] == ["my cat is sick"]
