"""What the docs and the Makefile name exists: a module a target runs, a file a page links, a target
a page tells you to make. Drift here is a newcomer's first dead end."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "models").glob("*.md"))]
MODULE = re.compile(r"-m ([a-z_][a-z0-9_.]*)")
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
ANCHORED = re.compile(r"\]\(([^)#\s]*\.md)?#([^)\s]+)\)")  # a link to a heading: [x](page.md#slug) or [x](#slug)
HEADING = re.compile(r"^#{1,6} +(.+?) *#*$", flags=re.MULTILINE)
LONGEST = {"README.md": 150}  # lines; every other page at most 300: a reference, not a diary
# Lines alone let a diary through: experiments.md once passed at 98 lines holding 31,000 characters,
# rows of up to 4,600. It is one table row per finding, about 400 characters each, none over 600;
# 16,000 holds the ~35 findings it has with room for two or three more. Past that, fold or drop a
# row rather than raise the budget.
WIDEST = {"docs/experiments.md": 600}  # characters a line (a table row)
HEAVIEST = {"docs/experiments.md": 16_000}  # characters a page
MAKE = re.compile(r"`make ([a-z][a-z0-9-]*[a-z0-9])(?![*\w-])")  # not a pattern such as `make bench-*`


def targets() -> set[str]:
    makefile = (ROOT / "Makefile").read_text()
    return set(re.findall(r"^([a-z][a-z0-9-]*):", makefile, flags=re.MULTILINE))


def module_exists(name: str) -> bool:
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__main__.py").is_file()


def test_every_module_a_make_target_runs_exists() -> None:
    ours = {"app", "core", "index", "models", "bench", "tests"}
    named = set(MODULE.findall((ROOT / "Makefile").read_text()))
    missing = [m for m in named if m.split(".")[0] in ours and not module_exists(m)]
    assert not missing, f"the Makefile runs modules that do not exist: {missing}"


def test_every_link_in_the_docs_leads_to_a_file() -> None:
    broken = []
    for page in PAGES:
        for target in LINK.findall(page.read_text(encoding="utf-8")):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (page.parent / target).exists():
                broken.append(f"{page.relative_to(ROOT)} -> {target}")
    assert not broken, broken


def test_every_make_target_the_docs_name_exists() -> None:
    known = targets()
    unknown = [f"{p.relative_to(ROOT)}: make {t}" for p in PAGES for t in MAKE.findall(p.read_text()) if t not in known]
    assert not unknown, unknown


def slugs(page: Path) -> set[str]:
    """The anchors GitHub gives a page's headings (lower case, punctuation but `-` and `_` dropped,
    spaces to `-`, a repeat numbered), and any `<a id="...">` the page sets itself."""
    text = page.read_text(encoding="utf-8")
    seen: dict[str, int] = {}
    found = set(re.findall(r'<a id="([^"]+)"', text))
    for heading in HEADING.findall(re.sub(r"(?ms)^```.*?^```", "", text)):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        found.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
        seen[slug] = seen.get(slug, 0) + 1
    return found


def test_every_anchor_a_page_links_names_a_heading() -> None:
    broken = []
    for page in PAGES:
        for target, anchor in ANCHORED.findall(page.read_text(encoding="utf-8")):
            linked = (page.parent / target) if target else page
            if linked.is_file() and anchor not in slugs(linked):
                broken.append(f"{page.relative_to(ROOT)} -> {target}#{anchor}")
    assert not broken, broken


def test_each_page_stays_a_reference_of_readable_length() -> None:
    long = []
    for page in PAGES:
        name = str(page.relative_to(ROOT))
        lines = len(page.read_text(encoding="utf-8").splitlines())
        if lines > LONGEST.get(name, 300):
            long.append(f"{name}: {lines} lines")
    assert not long, long


def test_the_experiments_page_stays_rows_a_reader_can_read() -> None:
    heavy = []
    for name, most in HEAVIEST.items():
        text = (ROOT / name).read_text(encoding="utf-8")
        if len(text) > most:
            heavy.append(f"{name}: {len(text):,} characters (at most {most:,})")
        wide = [f"line {n}: {len(line):,}" for n, line in enumerate(text.splitlines(), 1) if len(line) > WIDEST[name]]
        if wide:
            heavy.append(f"{name}: lines over {WIDEST[name]} characters: {', '.join(wide)}")
    assert not heavy, heavy
