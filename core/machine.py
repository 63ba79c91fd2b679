"""The CPU a figure was read on: int8 graphs run 2-3x apart with and without VNNI, so every
report names it. Shared by the service's /info, the benchmarks and the offline pipeline."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def cpu() -> dict[str, Any]:
    """The CPU model and whether it has VNNI (int8 dot products), from /proc/cpuinfo where there is one."""
    info = Path("/proc/cpuinfo")
    lines = info.read_text().splitlines() if info.exists() else []
    model = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "unknown")
    flags = next((line.split(":", 1)[1].split() for line in lines if line.startswith("flags")), [])
    return {"model": model, "vnni": "avx512_vnni" in flags or "avx_vnni" in flags}
