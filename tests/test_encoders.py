"""Each candidate set names its encoder: any shipped bundle, chosen on the set's first upload,
changed by a reindex that re-encodes everything, loaded only once some set uses it."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest

from core.bundle import read_manifest
from tests.helpers import AUTH, TINY_PARITY_TEXTS, TOKEN, AppFactory, wait_for
from tests.tiny_bundle import build_tiny_bundle

pytestmark = pytest.mark.anyio

OTHER = "tiny-other"  # a second shipped encoder: other weights, another width
UNUSED = "tiny-unused"
KOREAN = [
    {"query": "안녕! 잘 지내?", "reply": "응 잘 지내, 고마워!", "id": "ko-1", "language": "ko"},
    {"query": "주말에 뭐 해?", "reply": "공원에서 체스 둬", "id": "ko-2", "language": "ko"},
    {"query": "잘 자", "reply": "좋은 꿈 꿔!", "id": "ko-3", "language": "ko"},
]


@pytest.fixture(scope="session")
def shipped(artifacts: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's tiny bundle and its index, with two more bundles beside it."""
    root = Path(shutil.copytree(artifacts, tmp_path_factory.mktemp("encoders") / "artifacts"))
    build_tiny_bundle(root / "bundles", OTHER, TINY_PARITY_TEXTS, seed=3, dim=24)
    build_tiny_bundle(root / "bundles", UNUSED, TINY_PARITY_TEXTS, seed=4)
    return root


@pytest.fixture
def own(shipped: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(shipped, tmp_path / "artifacts"))


def settings(root: Path) -> dict[str, Any]:
    return {
        "artifacts_dir": root,
        "bundle_dir": root / "bundles" / "tiny-int8",
        "encoders_dir": root / "bundles",
        "admin_token": TOKEN,
    }


async def submitted(client: httpx.AsyncClient, response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 202, response.text
    job = await wait_for(client, response.json()["job_id"])
    assert job["state"] == "succeeded", job
    return job


async def sets(client: httpx.AsyncClient) -> dict[str, Any]:
    body: dict[str, Any] = (await client.get("/admin/sets", headers=AUTH)).json()
    return body


async def test_a_set_that_names_an_encoder_is_built_and_served_with_it(make_client: AppFactory, own: Path) -> None:
    async with make_client(**settings(own)) as client:
        before = await sets(client)
        available = ["tiny-int8", OTHER, UNUSED]
        assert before["encoders"] == {"default": "tiny-int8", "available": available, "loaded": ["tiny-int8"]}
        job = await submitted(
            client, await client.post(f"/admin/sets/korean/candidates?encoder={OTHER}", json=KOREAN, headers=AUTH)
        )
        assert job["report"]["encoder"] == OTHER

        after = await sets(client)
        by_name = {s["name"]: s for s in after["sets"]}
        assert by_name["korean"]["encoder"] == OTHER and by_name["default"]["encoder"] == "tiny-int8"
        assert after["encoders"]["loaded"] == ["tiny-int8", OTHER]  # the unused one never loads
        info = (await client.get("/info", params={"set": "korean"})).json()["model"]
        assert info["encoder"] == OTHER and info["dim"] == 24
        assert (await client.get("/info")).json()["model"]["dim"] == 32

        answer = (await client.post("/reply", json={"context": ["잘 자"], "set": "korean", "k": 3})).json()
        assert {answer["id"], *(c["id"] for c in answer["candidates"])} <= {"ko-1", "ko-2", "ko-3"}
        pairs = {"pairs": [["잘 자", "좋은 꿈 꿔!"]], "set": "korean"}
        assert (await client.post("/similar", json=pairs)).status_code == 200
        # Appending without naming one keeps the set's encoder.
        more = [{"reply": "나도 체스 좋아해", "id": "ko-4", "language": "ko"}]
        job = await submitted(client, await client.post("/admin/sets/korean/candidates", json=more, headers=AUTH))
        assert job["report"]["encoder"] == OTHER and job["counts"]["encoded"] == 1  # the rest were reused

    # A restart serves each set with its own encoder, and loads only those.
    async with make_client(**settings(own)) as client:
        after = await sets(client)
        assert {s["name"]: s["encoder"] for s in after["sets"]} == {"default": "tiny-int8", "korean": OTHER}
        assert after["encoders"]["loaded"] == ["tiny-int8", OTHER]


async def test_changing_a_sets_encoder_re_encodes_everything_and_rolls_back_within_it(
    make_client: AppFactory, own: Path
) -> None:
    async with make_client(**settings(own)) as client:
        await submitted(
            client, await client.post(f"/admin/sets/korean/candidates?encoder={OTHER}", json=KOREAN, headers=AUTH)
        )
        old_version = (await sets(client))["sets"][1]["version"]
        job = await submitted(client, await client.put("/admin/sets/korean/encoder?encoder=tiny-int8", headers=AUTH))
        assert job["mode"] == "reencode" and job["previous_version"] == old_version
        assert job["counts"]["candidates_after"] == 3 and job["counts"]["encoded"] > 0  # nothing reused
        assert {s["name"]: s["encoder"] for s in (await sets(client))["sets"]}["korean"] == "tiny-int8"
        answer = (await client.post("/reply", json={"context": ["잘 자"], "set": "korean"})).json()
        assert answer["id"] in {"ko-1", "ko-2", "ko-3"}
        # The version before was another encoder's: a rollback never lands on it.
        rolled = await client.post("/admin/sets/korean/rollback", headers=AUTH)
        assert rolled.status_code == 409 and "its encoder" in rolled.json()["error"]["message"]


async def test_an_unknown_encoder_is_refused_before_the_body_is_read(make_client: AppFactory, own: Path) -> None:
    async with make_client(**settings(own)) as client:
        for path in ("/admin/sets/korean/candidates?encoder=nope", "/admin/candidates?encoder=nope"):
            response = await client.post(path, content=b"not json at all", headers=AUTH)
            assert response.status_code == 404, response.text  # as a set that does not exist
            error = response.json()["error"]
            assert error["field"] == "encoder" and "tiny-int8" in error["message"]
        response = await client.put("/admin/sets/korean/encoder?encoder=../etc", headers=AUTH)
        assert response.status_code == 422 and response.json()["error"]["field"] == "encoder"
        assert [s["name"] for s in (await sets(client))["sets"]] == ["default"]  # a refused upload makes no set


async def test_pairs_are_scored_without_an_index(make_client: AppFactory, tmp_path: Path, shipped: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    bundle = shipped / "bundles" / "tiny-int8"
    async with make_client(artifacts_dir=empty, bundle_dir=bundle, encoders_dir=shipped / "bundles") as client:
        assert (await client.get("/readyz")).status_code == 503  # no set has an index
        response = await client.post("/similar", json={"pairs": [["hi", "hello"], ["hi", "hi"]]})
        assert response.status_code == 200, response.text
        body = response.json()
        assert len(body["scores"]) == 2 and body["scores"][1] == pytest.approx(1.0, abs=1e-3)
        assert "index_version" not in body
        assert read_manifest(bundle).checksum  # the default encoder scored them


def test_the_client_and_cli_name_an_encoder_on_upload() -> None:
    from app.cli import _parser
    from app.client._base import upload_call

    call = upload_call([{"reply": "응 잘 지내"}], "append", None, None, "korean", "minilm")
    assert call.params == {"mode": "append", "encoder": "minilm"} and call.path.endswith("/sets/korean/candidates")
    assert "encoder" not in upload_call([{"reply": "hi"}], "append", None, None).params
    args = _parser().parse_args(["upload", "replies.csv", "--set", "korean", "--encoder", "minilm"])
    assert args.encoder == "minilm"
