"""Every route declares the shape of its answer, and answers in it: the OpenAPI schema is what a
client can rely on, and the Python client parses with the same models (app/client/answers.py).

One app walks every route, the admin routes included, and each answer is checked twice:
against the route's response model, as the client would parse it, and against the published schema,
so that no field goes out undeclared and none the schema requires is left out."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args

import httpx
import pytest
from fastapi import FastAPI
from fastapi.routing import iter_route_contexts
from pydantic import BaseModel

from app.client import answers
from app.engine.kv import Status
from app.main import create_app
from core.retriever import Strategy
from tests.helpers import AUTH, TOKEN, bundle_of, loaded, settings_for, wait_for

pytestmark = pytest.mark.anyio

# The routes whose answer is not a JSON object, and so has no response model.
NOT_JSON = {
    ("GET", "/"): "the demo page: an HTML file",
    ("GET", "/metrics"): "Prometheus' text exposition format",
    ("GET", "/openapi.json"): "FastAPI's own: the schema these models are published in",
    ("GET", "/docs"): "FastAPI's own: the Swagger UI page, HTML",
    ("GET", "/docs/oauth2-redirect"): "FastAPI's own: Swagger UI's OAuth2 redirect page, HTML",
    ("GET", "/redoc"): "FastAPI's own: the ReDoc page, HTML",
    ("", "/static"): "a mount of the demo page's static files, not a route",
}
RECORDS = [{"query": "do you like tacos?", "reply": "tacos are life", "id": "taco-1"}]


@dataclass(frozen=True)
class Answer:
    method: str
    template: str  # the route's path, as declared
    response: httpx.Response


def routes(app: FastAPI) -> dict[tuple[str, str], Any]:
    """(method, path) -> route, for every route the app serves. `app.routes` holds each included
    router whole; iter_route_contexts reaches the routes inside, each with its declared response model."""
    found = {}
    for route in iter_route_contexts(app.routes):
        for method in sorted(route.methods or {""}):
            if method != "HEAD":  # Starlette's, beside each GET
                found[(method, route.path)] = route
    return found


async def walk(client: httpx.AsyncClient, app: FastAPI) -> list[Answer]:
    """Every JSON route called at least once, the admin routes on a named set as well as the default one,
    and a set with no version yet among those listed."""
    answered: list[Answer] = []

    async def call(method: str, template: str, json: Any = None, params: Any = None, **path: str) -> Any:
        response = await client.request(
            method, template.format(**path), json=json, params=params, headers=AUTH if "/admin" in template else None
        )
        assert response.is_success, f"{method} {template}: {response.status_code} {response.text}"
        answered.append(Answer(method, template, response))
        return response.json()

    async def done(accepted: Awaitable[Any]) -> dict[str, Any]:
        job = await wait_for(client, (await accepted)["job_id"])
        assert job["state"] == "succeeded", job
        return job

    await call("GET", "/healthz")
    await call("GET", "/livez")
    await call("GET", "/readyz")
    await call("GET", "/info")
    await call("POST", "/reply", {"context": ["my cat is sick"]})
    await call("POST", "/reply", {"session_id": "s-1", "message": "do you play any sports?", "k": 3})
    await call("POST", "/reply", {"context": ["hi! how are you?"], "strategies": ["reply_matching"], "rerank": True})
    await call("POST", "/similar", {"text": "do you like dogs?", "k": 2})
    await call("POST", "/similar", {"pairs": [["hi", "hello"], ["my cat is sick", "oh no"]]})

    # The default set's admin routes.
    await call("GET", "/admin/index")
    job = await done(call("POST", "/admin/candidates", RECORDS))
    await call("GET", "/admin/jobs/{job_id}", job_id=job["id"])
    await call("GET", "/admin/jobs", params={"limit": 5})
    await done(call("POST", "/admin/candidates/delete", [{"id": "taco-1"}]))
    await call("POST", "/admin/rollback")

    # A named set's, from its first upload to its deletion.
    encoder = bundle_of(app.state.service.runtime.settings.artifacts_dir).name
    job = await done(call("POST", "/admin/sets/{name}/candidates", RECORDS, name="extra"))
    await done(call("PUT", "/admin/sets/{name}/candidates", [*RECORDS, {"reply": "kiwi"}], name="extra"))
    await done(call("PUT", "/admin/sets/{name}/encoder", params={"encoder": encoder}, name="extra"))
    await done(call("POST", "/admin/sets/{name}/candidates/delete", [{"id": "taco-1"}], name="extra"))
    await call("POST", "/admin/sets/{name}/rollback", name="extra")
    await call("GET", "/admin/sets/{name}/jobs/{job_id}", name="extra", job_id=job["id"])
    await call("GET", "/admin/sets/{name}/jobs", name="extra")
    await call("GET", "/admin/sets/{name}/index", name="extra")
    await call("GET", "/info", params={"set": "extra"})
    await call("POST", "/reply", {"context": ["do you like tacos?"], "set": "extra"})

    # A set whose first version is not built yet answers with what it lacks left out or null.
    app.state.service.runtime.add_set("pending").problem = "set 'pending' has no index version yet"
    await call("GET", "/admin/sets/{name}/index", name="pending")
    await call("GET", "/admin/sets")
    await call("DELETE", "/admin/sets/{name}", name="extra")
    return answered


@pytest.fixture
async def walked(poly_artifacts: Path, tmp_path: Path) -> AsyncIterator[tuple[FastAPI, list[Answer]]]:
    """The walk on a bundle with a poly head and reactions, so that /info has every part to describe."""
    own = Path(shutil.copytree(poly_artifacts, tmp_path / "artifacts"))
    app = create_app(settings_for(own, admin_token=TOKEN, access_log=False))
    async with app.router.lifespan_context(app):
        await loaded(app)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
            yield app, await walk(client, app)


JSON_TYPES: dict[str, type | tuple[type, ...]] = {
    "string": str,
    "integer": int,
    "number": (int, float),
    "boolean": bool,
    "array": list,
    "object": dict,
    "null": type(None),
}


def strays(value: Any, schema: dict[str, Any], components: dict[str, Any], where: str) -> list[str]:
    """Where `value` strays from the published `schema`: a key it does not declare, one it requires
    that is missing, a value of another type or outside its enum."""
    if "$ref" in schema:
        return strays(value, components[schema["$ref"].rsplit("/", 1)[-1]], components, where)
    if "anyOf" in schema:
        tried = [strays(value, branch, components, where) for branch in schema["anyOf"]]
        return [] if [] in tried else min(tried, key=len)
    kind = schema.get("type")
    if value is None:
        return [] if kind == "null" else [f"{where}: null, not {kind or 'anything'}"]
    # A bool is an int to Python, not to JSON.
    if kind is not None and not (
        isinstance(value, JSON_TYPES[kind]) and isinstance(value, bool) == (kind == "boolean")
    ):
        return [f"{where}: {value!r} is not a JSON {kind}"]
    if value not in schema.get("enum", [value]) or value != schema.get("const", value):
        return [f"{where}: {value!r} is not one of {schema.get('enum', [schema.get('const')])}"]
    found: list[str] = []
    if isinstance(value, dict) and "properties" in schema:
        properties = schema["properties"]
        found += [f"{where}.{key}: not declared" for key in value if key not in properties]
        found += [f"{where}.{key}: required, missing" for key in schema.get("required", []) if key not in value]
        for key, item in value.items():
            if key in properties:
                found += strays(item, properties[key], components, f"{where}.{key}")
    elif isinstance(value, dict) and isinstance(schema.get("additionalProperties"), dict):
        for key, item in value.items():
            found += strays(item, schema["additionalProperties"], components, f"{where}.{key}")
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            found += strays(item, schema["items"], components, f"{where}[{i}]")
    return found


def test_every_route_declares_a_response_model_but_those_that_answer_no_json(artifacts: Path) -> None:
    served = routes(create_app(settings_for(artifacts)))  # the routes are there before the lifespan loads anything
    undeclared_routes = {
        key
        for key, route in served.items()
        if not (
            isinstance(getattr(route, "response_model", None), type) and issubclass(route.response_model, BaseModel)
        )
    }
    assert undeclared_routes == set(NOT_JSON)


async def test_every_answer_is_in_its_routes_declared_shape(walked: tuple[FastAPI, list[Answer]]) -> None:
    app, answered = walked
    served = routes(app)
    schema = app.openapi()
    components = schema["components"]["schemas"]
    found = []
    for answer in answered:
        where = f"{answer.method} {answer.template}"
        served[(answer.method, answer.template)].response_model.model_validate_json(answer.response.content)
        published = schema["paths"][answer.template][answer.method.lower()]["responses"]
        content = published[str(answer.response.status_code)]["content"]["application/json"]["schema"]
        found += strays(answer.response.json(), content, components, where)
    assert found == []
    # Every route with a response model was walked: one added later fails here until the walk calls it.
    assert {(a.method, a.template) for a in answered} == set(served) - set(NOT_JSON)


def test_the_published_values_are_the_servers() -> None:
    assert get_args(Strategy) == answers.STRATEGIES
    assert get_args(Status) == answers.REDIS_STATES
