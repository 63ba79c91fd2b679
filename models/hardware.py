"""What a training run ran on, for its record: the device, the CPU's model, VNNI and cores, torch's threads."""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

import torch

from core.machine import cpu


def cpu_name() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    for line in cpuinfo.read_text().splitlines() if cpuinfo.is_file() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def bf16_native() -> str:
    """The CPU's native bf16 instructions ("amx_bf16", "avx512_bf16"), "" where it has neither:
    where bf16 autocast can pay on a CPU."""
    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.is_file() else []
    flags = next((line.split(":", 1)[1].split() for line in lines if line.startswith("flags")), [])
    return ", ".join(f for f in ("amx_bf16", "avx512_bf16") if f in flags)


def hardware(device: str) -> dict[str, Any]:
    info: dict[str, Any] = {"device": device, "cpu": cpu_name(), "vnni": cpu()["vnni"], "cores": os.cpu_count()}
    info["torch_threads"] = torch.get_num_threads()
    info["bf16_native"] = bf16_native()
    if device.startswith("cuda") and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
    return info
