"""models/ holds recipes over a small library and nothing else: every module is reached from a
Makefile target or from the code that serves and measures (bench/), and each shipped bundle's
recipe reads only library modules. An approach that does not ship leaves the tree; its finding
goes to docs/experiments.md. Read from the code with `ast`: no torch needed."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The recipe behind each shipped bundle, and what `make release` runs on it.
RECIPES = {
    "models/release/e5": (
        "models.e5.multilingual",
        "models.e5.teacher",
        "models.e5.multilingual_release",
        "models.e5.combiner",
    ),
    "models/release/minilm": ("models.minilm.pack", "models.minilm.script_student"),
    # The reaction model: its own tune, then the e5 recipe's bundle build.
    "models/release/reactions": ("models.reactions.reader", "models.e5.multilingual"),
    "release": ("models.calibrate", "models.evaluate", "models.release"),
}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """Every models.* module `path` imports, at the top or inside a function."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("models"):
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}  # `from models import pack`
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("models")}
    return found


def models_modules() -> dict[str, Path]:
    return {module_name(p): p for p in (ROOT / "models").rglob("*.py")}


def reached(roots: set[str]) -> set[str]:
    modules = models_modules()
    seen: set[str] = set()
    todo = [r for r in roots if r in modules]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        todo += [m for m in imports(modules[name]) if m in modules and m not in seen]
        parent = name.rpartition(".")[0]  # a package's __init__ runs with any of its modules
        if parent in modules:
            todo.append(parent)
    return seen


def test_every_module_in_models_is_reached_from_a_target_or_the_code_that_uses_it() -> None:
    targets = set(re.findall(r"-m (models[a-z0-9_.]*)", (ROOT / "Makefile").read_text()))
    live = [p for folder in ("app", "core", "index", "bench") for p in (ROOT / folder).rglob("*.py")]
    users = {m for p in live for m in imports(p)}
    orphans = sorted(set(models_modules()) - reached(targets | users) - {"models"})
    assert not orphans, f"modules no target or live module reaches (delete them, or name them): {orphans}"


def test_each_recipe_reads_only_the_library_and_its_own_steps() -> None:
    recipes = {m for steps in RECIPES.values() for m in steps}
    for steps in RECIPES.values():
        for step in steps:
            other = reached({step}) - {step} - set(steps)
            crossing = sorted(other & (recipes - set(RECIPES["release"])))
            assert not crossing, f"{step} reaches another bundle's recipe: {crossing}"
