"""What a training run ran on, for its record: the device, the CPU's model and cores, torch's threads."""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

import torch


def cpu_name() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    for line in cpuinfo.read_text().splitlines() if cpuinfo.is_file() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def has_vnni() -> bool:
    """Whether the CPU has VNNI (int8 dot products): int8 graphs run 2-3x apart with and without it."""
    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.is_file() else []
    flags = next((line.split(":", 1)[1].split() for line in lines if line.startswith("flags")), [])
    return "avx512_vnni" in flags or "avx_vnni" in flags


def hardware(device: str) -> dict[str, Any]:
    info: dict[str, Any] = {"device": device, "cpu": cpu_name(), "vnni": has_vnni(), "cores": os.cpu_count()}
    info["torch_threads"] = torch.get_num_threads()
    if device.startswith("cuda") and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
    return info
