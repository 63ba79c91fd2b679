"""Request-time filters: tags, language and ids on candidates, honoured by every strategy,
and filtered FAISS searches checked against exact search over the same admitted rows."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import faiss
import httpx
import numpy as np
import pytest

from app.reindex.uploads import parse_upload
from core import ann
from core.filters import Filter, Selection
from core.records import Candidate, from_json, to_json
from tests.helpers import AUTH, TOKEN, AppFactory, upload

# --- the searches: every index kind, filtered, against exact search over the admitted rows


def clustered(n: int, d: int = 32, seed: int = 0) -> np.ndarray:
    """[n, d] unit vectors around 50 centres: closer to text embeddings than uniform noise."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(50, d))
    x = centres[rng.integers(0, 50, n)] + 0.6 * rng.normal(size=(n, d))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def exact_top(stored: np.ndarray, queries: np.ndarray, mask: np.ndarray, k: int) -> list[set[int]]:
    rows = np.flatnonzero(mask)
    scores = queries @ stored[rows].T  # [Q, S]
    return [set(rows[np.argsort(-s, kind="stable")[:k]].tolist()) for s in scores]


def tuned_graph(vectors: np.ndarray) -> faiss.Index:
    """A graph with the smallest efSearch that reaches the recall target unfiltered, as `ann.build` tunes it."""
    graph = ann.hnsw_sq8(vectors, m=16, ef_construction=64)
    probes = clustered(200, seed=3)
    _, truth = faiss.knn(probes, vectors, 10, metric=faiss.METRIC_INNER_PRODUCT)
    for ef in ann.EF_SEARCH_CHOICES:
        graph.hnsw.efSearch = ef
        if ann.recall_at_k(graph, probes, truth) >= ann.RECALL_TARGET:
            break
    return graph


def tuned_inverted(vectors: np.ndarray) -> faiss.Index:
    inverted = ann.ivf_sq8(vectors)
    probes = clustered(200, seed=3)
    _, truth = faiss.knn(probes, vectors, 10, metric=faiss.METRIC_INNER_PRODUCT)
    for nprobe in ann.NPROBE_CHOICES:
        inverted.nprobe = nprobe
        if ann.recall_at_k(inverted, probes, truth) >= ann.RECALL_TARGET:
            break
    return inverted


INDEXES = {"graph": tuned_graph, "inverted": tuned_inverted, "flat-sq8": ann.flat_sq8, "flat": ann.exact}


@pytest.mark.parametrize("kind", list(INDEXES))
@pytest.mark.parametrize("share", [0.01, 0.1, 0.5])
@pytest.mark.parametrize("exact_below", [ann.FILTERED_EXACT_BELOW, 0])
def test_a_filtered_search_returns_the_exact_top_k_of_the_admitted_rows(
    kind: str, share: float, exact_below: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """exact_below 0 sends even a small admitted set through the graph or the inverted file, widened."""
    monkeypatch.setattr(ann, "FILTERED_EXACT_BELOW", exact_below)
    vectors = clustered(4000)  # [N, D]
    index = INDEXES[kind](vectors)
    stored = ann.vectors_of(index) if kind != "inverted" else _decoded(index)  # [N, D] what the codes hold
    mask = np.random.default_rng(1).random(len(vectors)) < share  # [N]
    queries = clustered(100, seed=2)  # [Q, D]
    only = Selection(mask)
    _, rows = ann.search(index, queries, 10, only.selector(), only.count)  # [Q, 10]
    returned = rows[rows >= 0]
    assert mask[returned].all(), "a row the filter does not admit came back"
    assert ((rows >= 0).sum(axis=1) == min(10, only.count)).all(), "fewer than k hits while matches exist"
    truth = exact_top(stored, queries, mask, 10)
    recall = np.mean([len(set(r.tolist()) & t) / len(t) for r, t in zip(rows, truth, strict=True)])
    exact_path = kind.startswith("flat") or only.count < exact_below
    assert recall >= (0.999 if exact_path else 0.95), recall


def _decoded(index: faiss.Index) -> np.ndarray:
    ann.allow_row_lookup(index)
    return ann.vectors_of(index)


@pytest.mark.parametrize("kind", ["graph", "inverted"])
@pytest.mark.parametrize("share", [0.001, 0.1, 0.6])
def test_a_subset_of_admitted_rows_finds_their_exact_top_k(kind: str, share: float) -> None:
    """What /reply scans when few rows are admitted: a flat copy of them (fp32 under 2,000 rows,
    8-bit above), checked against exact search over the same rows' stored vectors."""
    vectors = clustered(4000)  # [N, D]
    index = INDEXES[kind](vectors)
    ann.allow_row_lookup(index)
    stored = ann.vectors_of(index)  # [N, D]
    mask = np.random.default_rng(1).random(len(vectors)) < share  # [N]
    mask[0] = True  # at least one
    rows = np.flatnonzero(mask)
    subset = ann.subset(index, rows)
    queries = clustered(100, seed=2)  # [Q, D]
    _, found = subset.search(queries, 10)  # [Q, 10]
    assert mask[found[found >= 0]].all()
    assert ((found >= 0).sum(axis=1) == min(10, len(rows))).all()
    truth = exact_top(stored, queries, mask, 10)
    recall = np.mean([len(set(r.tolist()) & t) / len(t) for r, t in zip(found, truth, strict=True)])
    assert recall >= (0.999 if len(rows) < ann.SUBSET_FP32_BELOW else 0.97), recall


def test_a_filter_that_admits_nothing_finds_nothing() -> None:
    index = ann.flat_sq8(clustered(100))
    only = Selection(np.zeros(100, dtype=bool))
    _, rows = ann.search(index, clustered(3, seed=1), 5, only.selector(), only.count)
    assert (rows == -1).all()


def test_a_record_keeps_its_tags_in_its_one_json_form() -> None:
    record = Candidate(reply="yay", tags=("kids", "cheer"), language="en")
    assert from_json(to_json(record)) == record
    assert "tags" not in to_json(Candidate(reply="untagged"))


def test_csv_uploads_carry_tags_and_language() -> None:
    body = b"reply,tags,language\nhello there,kids|greeting,en\nplain,,\n"
    records = parse_upload(body, "text/csv", "append", 10, "reject").records
    assert records[0].tags == ("kids", "greeting") and records[0].language == "en"
    assert records[1].tags == () and records[1].language is None


def test_filter_rules_combine() -> None:
    rule = Filter(tags_any=frozenset({"a", "b"}), tags_none=frozenset({"x"}), language="en")
    assert rule.admits("1", ("a",), "en")
    assert not rule.admits("1", ("a", "x"), "en")
    assert not rule.admits("1", ("c",), "en")
    assert not rule.admits("1", ("a",), "ko")
    assert not Filter(tags_all=frozenset({"a", "b"})).admits("1", ("a",), None)
    assert not Filter(exclude_ids=frozenset({"1"})).admits("1", (), None)
    assert not Filter() and Filter(language="en")


# --- through the API: every strategy honours the filter

RECORDS = [
    {"query": "hi! how are you?", "reply": "hey buddy, great day for a game!", "id": "kid-1", "tags": ["kids"]},
    {"query": "hi! how are you?", "reply": "doing fine, had a beer after work", "id": "adult-1", "tags": ["mature"]},
    {"query": "what do you do for fun?", "reply": "lego and cartoons", "id": "kid-2", "tags": ["kids", "toys"]},
    {"query": "what do you do for fun?", "reply": "wine tasting, mostly", "id": "adult-2", "tags": ["mature"]},
    {"query": "뭐 하고 놀아?", "reply": "보드게임 해", "id": "ko-1", "language": "ko", "tags": ["kids"]},
    {"reply": "haha", "id": "laugh-kids", "kind": "reaction", "language": "en", "tags": ["kids"]},
    {"reply": "cheers", "id": "laugh-mature", "kind": "reaction", "language": "en", "tags": ["mature"]},
]
UNSURE = {"thresholds": {"query_similarity": 1.0, "reply_matching": 1.0}}  # reactions answer


@pytest.fixture
async def tagged(make_client: AppFactory, artifacts: Path, tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    own = tmp_path / "artifacts"
    shutil.copytree(artifacts, own)
    async with make_client(artifacts_dir=own, admin_token=TOKEN) as client:
        job = await upload(client, RECORDS, mode="replace")
        assert job["state"] == "succeeded", job
        yield client


async def ask(client: httpx.AsyncClient, text: str, **body: object) -> httpx.Response:
    return await client.post("/reply", json={"context": [text], "k": 10, **body})


@pytest.mark.anyio
@pytest.mark.parametrize("strategy", ["query_similarity", "reply_matching"])
@pytest.mark.parametrize("exact_below", [ann.FILTERED_EXACT_BELOW, 0])
async def test_every_strategy_answers_only_from_what_the_filter_admits(
    tagged: httpx.AsyncClient, strategy: str, exact_below: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """exact_below 0: the bitmap over the whole index rather than a copy of the admitted rows."""
    monkeypatch.setattr(ann, "FILTERED_EXACT_BELOW", exact_below)
    for text in ("hi! how are you?", "what do you do for fun?", "tell me something"):
        for rule, allowed in [
            ({"tags_any": ["kids"]}, {"kid-1", "kid-2", "ko-1"}),
            ({"tags_none": ["mature"]}, {"kid-1", "kid-2", "ko-1"}),
            ({"tags_all": ["kids", "toys"]}, {"kid-2"}),
            ({"tags_any": ["mature"]}, {"adult-1", "adult-2"}),
            ({"language": "ko"}, {"ko-1"}),
        ]:
            response = await ask(tagged, text, strategies=[strategy], filter=rule)
            assert response.status_code == 200, (text, rule, response.text)
            answer = response.json()
            ids = {c["id"] for c in answer["candidates"]}
            assert ids and ids <= allowed, (text, rule, answer)
            # Never a top k cut short after the fact: every admitted reply comes back when k allows
            # (those in the conversation's script, when there are any: `retriever.in_script`).
            if strategy == "reply_matching":
                assert ids == ({i for i in allowed if not i.startswith("ko")} or allowed), (rule, ids)


@pytest.mark.anyio
async def test_exclude_ids_are_never_answered(tagged: httpx.AsyncClient) -> None:
    first = (await ask(tagged, "hi! how are you?")).json()
    again = (await ask(tagged, "hi! how are you?", exclude_ids=[first["id"]])).json()
    assert first["id"] not in {again["id"], *(c["id"] for c in again["candidates"])}


@pytest.mark.anyio
async def test_reactions_are_candidates_too(tagged: httpx.AsyncClient) -> None:
    kids = (await ask(tagged, "i won the game", filter={"tags_any": ["kids"]}, **UNSURE)).json()
    assert kids["source"] == "reaction" and kids["id"] == "laugh-kids"
    mature = (await ask(tagged, "i won the game", filter={"tags_none": ["kids"]}, **UNSURE)).json()
    assert mature["source"] == "reaction" and mature["id"] == "laugh-mature"
    neither = await ask(
        tagged, "i won the game", strategies=["reaction"], exclude_ids=["laugh-kids", "laugh-mature"], **UNSURE
    )
    assert neither.status_code == 404 and neither.json()["error"]["kind"] == "no_candidate", neither.text


@pytest.mark.anyio
async def test_a_filter_that_admits_nothing_is_a_clear_404(tagged: httpx.AsyncClient) -> None:
    for rule in ({"tags_any": ["no-such-tag"]}, {"tags_all": ["kids"], "tags_none": ["kids"]}, {"language": "ja"}):
        response = await ask(tagged, "hi! how are you?", filter=rule)
        assert response.status_code == 404, response.text
        error = response.json()["error"]
        assert error["kind"] == "no_candidate" and error["field"] == "filter"


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"filter": {"tags_any": []}}, "filter.tags_any"),
        ({"filter": {"tags_any": [f"t{i}" for i in range(17)]}}, "filter.tags_any"),
        ({"filter": {"tags_none": ["a", "a"]}}, "filter.tags_none"),
        ({"filter": {"tags_all": ["x" * 33]}}, "filter.tags_all.0"),
        ({"filter": {"tags_all": ["no spaces"]}}, "filter.tags_all.0"),
        ({"filter": {"language": "klingon"}}, "filter.language"),
        ({"filter": {"language": None}}, "filter.language"),
        ({"filter": {"colour": "red"}}, "filter.colour"),
        ({"filter": ["kids"]}, "filter"),
        ({"exclude_ids": [f"id-{i}" for i in range(257)]}, "exclude_ids"),
        ({"exclude_ids": ["../etc"]}, "exclude_ids.0"),
    ],
)
async def test_filters_have_limits_and_name_the_field(tagged: httpx.AsyncClient, body: dict, field: str) -> None:
    response = await ask(tagged, "hi", **body)
    assert response.status_code == 422 and response.json()["error"]["field"] == field, response.text


@pytest.mark.anyio
async def test_uploaded_tags_have_limits(tagged: httpx.AsyncClient) -> None:
    for tags, field in [(["bad tag"], "record 1.tags.0"), ([f"t{i}" for i in range(17)], "record 1.tags")]:
        response = await tagged.post("/admin/candidates", json=[{"reply": "x", "tags": tags}], headers=AUTH)
        assert response.status_code == 422 and response.json()["error"]["field"] == field, response.text


@pytest.mark.anyio
async def test_a_reindex_readies_the_filters_the_set_was_serving(tagged: httpx.AsyncClient) -> None:
    """The next request of each recent filter finds it compiled, and its copies built, on the new version."""
    from core.filters import Filter

    for rule in ({"tags_any": ["kids"]}, {"tags_none": ["mature"]}):
        assert (await ask(tagged, "hi! how are you?", filter=rule)).status_code == 200
    await upload(tagged, [{"reply": "a new one", "id": "new-1", "tags": ["kids"]}])
    fresh = tagged._transport.app.state.service.runtime.current().index  # type: ignore[attr-defined]
    kept = fresh.memo.kept()
    assert ("filter", Filter(tags_any=frozenset({"kids"}))) in kept
    assert ("filter", Filter(tags_none=frozenset({"mature"}))) in kept
    assert (Filter(tags_any=frozenset({"kids"})), "replies") in fresh.subsets.kept()


@pytest.mark.anyio
async def test_fresh_exclude_ids_compile_no_filter_and_evict_no_copy(tagged: httpx.AsyncClient) -> None:
    """#49, item 2: exclude_ids made up afresh on every request used to compile a filter and copy its rows
    each time, pushing other clients' copies out. They are dropped after the search now; the k asked for
    still come back."""
    from core.filters import Filter

    kids = {"tags_any": ["kids"]}
    assert (await ask(tagged, "hi! how are you?", filter=kids)).status_code == 200
    index = tagged._transport.app.state.service.runtime.current().index  # type: ignore[attr-defined]
    compiled, copies = index.memo.kept(), index.subsets.kept()
    for i in range(10):
        made_up = [f"no-such-id-{i}-{j}" for j in range(200)]
        for rule in (kids, None):
            body = {"exclude_ids": [*made_up, "kid-1"], **({"filter": rule} if rule else {})}
            response = await ask(tagged, "hi! how are you?", strategies=["reply_matching"], **body)
            assert response.status_code == 200, response.text
            ids = {c["id"] for c in response.json()["candidates"]}
            assert "kid-1" not in ids
            if rule:
                assert ids == {"kid-2"}  # every admitted reply but the excluded one (ko-1: another script)
    assert index.memo.kept() == compiled and index.subsets.kept() == copies
    assert (Filter(tags_any=frozenset({"kids"})), "replies") in index.subsets.kept()


@pytest.mark.anyio
async def test_unknown_tags_compile_no_filter_and_evict_no_copy(tagged: httpx.AsyncClient) -> None:
    """A tag no stored reply carries used to key a filter of its own: each request naming a fresh one
    compiled and copied a selection, and pushed another client's out of the few kept. Filters are keyed
    by the tags the version knows now: an unknown tag in tags_none excludes nothing, and one in tags_any
    or tags_all matches nothing, so the answers stay what they were."""
    from core.filters import Filter

    kids = {"tags_any": ["kids"]}
    assert (await ask(tagged, "hi! how are you?", filter=kids)).status_code == 200
    index = tagged._transport.app.state.service.runtime.current().index  # type: ignore[attr-defined]
    compiled, copies = index.memo.kept(), index.subsets.kept()
    plain = await ask(tagged, "hi! how are you?", strategies=["reply_matching"])
    unfiltered = {c["id"] for c in plain.json()["candidates"]}
    for i in range(10):
        fresh = f"no-such-tag-{i}"
        for rule, allowed in [
            ({"tags_none": [fresh]}, unfiltered),  # excludes nothing: no filter at all
            ({"tags_any": ["kids", fresh]}, {"kid-1", "kid-2"}),  # the kids filter, compiled once already
            ({"tags_any": ["kids"], "tags_none": [fresh, f"{fresh}-b"]}, {"kid-1", "kid-2"}),
        ]:
            response = await ask(tagged, "hi! how are you?", strategies=["reply_matching"], filter=rule)
            assert response.status_code == 200, (rule, response.text)
            assert {c["id"] for c in response.json()["candidates"]} == allowed, rule
        for rule in ({"tags_any": [fresh]}, {"tags_all": ["kids", fresh]}):  # matches nothing
            response = await ask(tagged, "hi! how are you?", filter=rule)
            assert response.status_code == 404 and response.json()["error"]["kind"] == "no_candidate", response.text
    assert index.memo.kept() == compiled and index.subsets.kept() == copies
    assert (Filter(tags_any=frozenset({"kids"})), "replies") in index.subsets.kept()


def test_the_copies_kept_are_both_sides_of_the_last_filters() -> None:
    """#49, item 2: SUBSETS_KEPT is filters; each has a copy per side, so twice as many copies are kept."""
    from core.store import SUBSETS_KEPT, IndexVersion

    assert IndexVersion.__dataclass_fields__["subsets"].default_factory().capacity == 2 * SUBSETS_KEPT  # type: ignore[misc]
