"""requirements.lock, what the image installs (docker/Dockerfile), against pyproject.toml: a
dependency added or narrowed without `make lock` fails here, not in a Docker build."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
PIN = re.compile(r"^([A-Za-z0-9._-]+)==([^\s;\\]+)")


def locked() -> dict[str, tuple[Version, list[str]]]:
    """name -> (pinned version, its hashes)."""
    pins: dict[str, tuple[Version, list[str]]] = {}
    name = ""
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        if match := PIN.match(line):
            name = canonicalize_name(match.group(1))
            pins[name] = (Version(match.group(2)), [])
        elif line.strip().startswith("--hash=sha256:"):
            pins[name][1].append(line.strip().removesuffix(" \\"))
    return pins


def test_the_lock_pins_every_runtime_dependency_within_its_range() -> None:
    pins = locked()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for dependency in map(Requirement, project["dependencies"]):
        name = canonicalize_name(dependency.name)
        assert name in pins, f"{name} is not in requirements.lock: run `make lock`"
        version, _ = pins[name]
        assert dependency.specifier.contains(version, prereleases=True), f"{name}=={version} is not {dependency}"


def test_every_pin_has_its_hashes_and_no_torch() -> None:
    pins = locked()
    assert pins and all(hashes for _, hashes in pins.values())  # pip then checks every file it installs
    assert not {"torch", "transformers", "onnx"} & set(pins)  # the service's lock, not the pipeline's
