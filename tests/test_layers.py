"""Imports run one way. From the bottom:

    core    what serving, the index build and the offline pipeline share, torch-free: the encoder
            runtime, the bundle and index formats, text normalisation, the retrieval strategies and
            the bundle's numpy heads (poly rerank, reactions, confidence), atomic file writes.
            Imports nothing of ours outside core.
    index   the index build and the corpus: core only.
    app     the service: core and index; never models. Within it, app.engine is the request path
            and never imports the HTTP layer, nor app.reindex, the admin side (uploads, reindex
            jobs, rollback), which is built on the engine.
    models  the offline pipeline (torch): core, index, and of app only its public entry points.

The public entry points of app, the only names models may import from it:

    app.main.create_app                      the service as an ASGI app
    app.config.Settings                      the service's one settings class
    app.client                               the typed HTTP client (its package namespace, not its submodules)
    app.engine.runtime.load_newest_serving   one call from Settings to the loaded (bundle, index) snapshot
                                             that the retrieval strategies in core run on, as served;
                                             with NotReady, what it raises when no index fits the bundle

Everything else under app is the service's internals and may change without telling models.
Neither the service nor the index build ever loads torch.

Each rule walks the AST of every module under its package, lazy imports inside functions and
relative imports included.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OURS = ("app", "core", "index", "models", "bench", "tests")
HEAVY = ("torch", "transformers", "onnx", "sentence_transformers")
HTTP_LAYER = ("app.main", "app.routes", "app.deps", "app.errors", "app.limits", "app.schemas")
ADMIN_SIDE = ("app.reindex",)
ANY = frozenset({"*"})
PUBLIC: dict[str, frozenset[str]] = {
    "app.main": frozenset({"create_app"}),
    "app.config": frozenset({"Settings"}),
    "app.client": ANY,
    "app.engine.runtime": frozenset({"load_newest_serving", "NotReady"}),
}


def imports(package: str, root: Path = ROOT) -> list[tuple[str, str, str | None]]:
    """(module file, imported module, imported name or None) for every import under a package directory.
    A relative import is resolved against the file's package."""
    found: list[tuple[str, str, str | None]] = []
    for path in sorted((root / package).rglob("*.py")):
        where = str(path.relative_to(root))
        here = list(path.relative_to(root).parts[:-1])  # the file's package, for a module and an __init__ alike
        for node in ast.walk(ast.parse(path.read_text(), filename=where)):
            if isinstance(node, ast.ImportFrom):
                base = here[: len(here) - node.level + 1] if node.level else []
                for alias in node.names:
                    if node.module:
                        found.append((where, ".".join([*base, node.module]), alias.name))
                    else:  # `from . import x`: x is a module of the package
                        found.append((where, ".".join([*base, alias.name]), None))
            elif isinstance(node, ast.Import):
                found.extend((where, alias.name, None) for alias in node.names)
    return found


def offending(package: str, allowed: tuple[str, ...], root: Path = ROOT, torch_free: bool = True) -> list[str]:
    """Imports of any module of ours outside `allowed` (prefixes), and of torch and friends if `torch_free`."""
    bad = []
    for where, module, _ in imports(package, root):
        top = module.split(".")[0]
        if (torch_free and top in HEAVY) or (top in OURS and not _under(module, allowed)):
            bad.append(f"{where}: {module}")
    return bad


def reaching(package: str, forbidden: tuple[str, ...], root: Path = ROOT) -> list[str]:
    """Imports of any module under `forbidden` (prefixes)."""
    return [f"{where}: {module}" for where, module, _ in imports(package, root) if _under(module, forbidden)]


def _under(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def _public(module: str, name: str | None) -> bool:
    if name is None:  # `import app.x`: the whole module
        return PUBLIC.get(module) == ANY
    if module in PUBLIC:
        return PUBLIC[module] == ANY or name in PUBLIC[module]
    # `from app.engine import runtime` reaches the module as a whole, like `import app.engine.runtime`.
    return PUBLIC.get(f"{module}.{name}") == ANY


def test_the_shared_core_imports_nothing_of_ours_outside_it() -> None:
    assert offending("core", ("core",)) == []


def test_index_imports_only_the_core() -> None:
    assert offending("index", ("core", "index")) == []


def test_the_service_never_imports_the_offline_pipeline() -> None:
    assert offending("app", ("app", "core", "index")) == []


def test_the_engine_never_imports_the_http_layer() -> None:
    assert offending("app/engine", ("core", "app.engine", "app.config", "index")) == []


def test_the_request_path_never_imports_the_admin_side() -> None:
    assert reaching("app/engine", ADMIN_SIDE) == []


def test_the_offline_pipeline_uses_only_the_services_public_entry_points() -> None:
    assert offending("models", ("app", "core", "index", "models"), torch_free=False) == []
    bad = [f"{w}: {m} {n or ''}" for w, m, n in imports("models") if _under(m, ("app",)) and not _public(m, n)]
    assert bad == []


def test_the_rules_see_every_kind_of_import(tmp_path: Path) -> None:
    """A rule that finds nothing must find nothing because there is nothing: each of these breaks one."""
    engine = tmp_path / "app" / "engine"
    engine.mkdir(parents=True)
    (engine / "mod.py").write_text(
        "import torch\n"
        "from app.engine import kv\n"
        "from ..routes import health\n"
        "from .. import deps\n"
        "def lazy():\n"
        "    from models.multilingual import main\n"
    )
    found = offending("app/engine", ("core", "app.engine", "app.config", "index"), root=tmp_path)
    assert sorted(found) == sorted(
        f"app/engine/mod.py: {m}" for m in ("torch", "app.routes", "app.deps", "models.multilingual")
    )
    assert not _public("app.engine.runtime", "Runtime")
    assert not _public("app.engine", "runtime")
    assert not _public("app.client._sync", "ChitchatClient")
    assert not _public("app.config", None)
    assert _public("app.client", "ChitchatClient") and _public("app.engine.runtime", "load_newest_serving")


def test_the_admin_side_rule_sees_every_kind_of_import(tmp_path: Path) -> None:
    engine = tmp_path / "app" / "engine"
    engine.mkdir(parents=True)
    (engine / "mod.py").write_text(
        "import app.reindex.jobs\n"
        "from ..reindex import rollback\n"
        "def lazy():\n"
        "    from app.reindex.set_admin import Admin\n"
    )
    found = reaching("app/engine", ADMIN_SIDE, root=tmp_path)
    assert sorted(found) == sorted(
        f"app/engine/mod.py: {m}" for m in ("app.reindex.jobs", "app.reindex", "app.reindex.set_admin")
    )


@pytest.mark.parametrize("module", ["app.main", "index.build", "index.__main__", "core.retriever"])
def test_serving_and_the_index_build_never_load_torch(module: str) -> None:
    probe = f"import sys, {module}; print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    loaded = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == "[]"
