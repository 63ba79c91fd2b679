"""Imports run one way. From the bottom:

    core        encoder runtime, bundle and index formats, text normalisation: shared by all, imports nothing of ours
    index       the index build and the corpus: core only
    app         the service: core, index; never models
    models      the offline pipeline (torch): anything below it, never the HTTP layer

and neither the service nor the index build ever loads torch.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "transformers", "onnx", "sentence_transformers")
HTTP_LAYER = ("app.main", "app.routes", "app.deps", "app.errors", "app.limits", "app.admin", "app.schemas")


def imports(package: str) -> list[tuple[str, str]]:
    """(module file, imported module) for every import under a package directory."""
    found = []
    for path in sorted((ROOT / package.replace(".", "/")).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.append((str(path.relative_to(ROOT)), node.module))
            elif isinstance(node, ast.Import):
                found.extend((str(path.relative_to(ROOT)), alias.name) for alias in node.names)
    return found


def offending(
    package: str, allowed: tuple[str, ...], ours: tuple[str, ...] = ("app", "core", "index", "models")
) -> list[str]:
    bad = []
    for where, module in imports(package):
        top = module.split(".")[0]
        if top in HEAVY or (top in ours and not module.startswith(allowed)):
            bad.append(f"{where}: {module}")
    return bad


def test_the_shared_core_imports_nothing_of_ours() -> None:
    assert offending("core", ("core",)) == []


def test_index_imports_only_the_core() -> None:
    assert offending("index", ("core", "index")) == []


def test_the_service_never_imports_the_offline_pipeline() -> None:
    assert offending("app", ("app", "core", "index")) == []


def test_the_engine_never_imports_the_http_layer() -> None:
    assert offending("app/engine", ("core", "app.engine", "app.config", "index")) == []


def test_the_offline_pipeline_never_imports_the_http_layer() -> None:
    bad = [f"{w}: {m}" for w, m in imports("models") if m.startswith(HTTP_LAYER)]
    assert bad == []


@pytest.mark.parametrize("module", ["app.main", "index.build"])
def test_serving_and_the_index_build_never_load_torch(module: str) -> None:
    probe = f"import sys, {module}; print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    loaded = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == "[]"
