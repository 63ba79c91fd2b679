"""A benchmark's report: reports/<name>.json for machines, reports/<name>.md for people."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write(out: Path, report: dict[str, Any], text: str) -> None:
    """`out` without a suffix (reports/filters): writes out.json and out.md, and prints the text."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    out.with_suffix(".md").write_text(text)
    print(text)
