"""This process as other processes see it, and whether a process named so is still running.

One identity, two records of it: a reindex job's owner (`THIS_PROCESS`, "host/token", for people
reading the job; the job's liveness is its lock's) and a staging directory's OWNER
(`this_process()`, what `gone` needs to tell from this host whether its writer has exited).
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_PROCESS: dict[str, Any] = {}


def this_process() -> dict[str, Any]:
    """Who writes a staging directory, as OWNER records it. A pid alone does not say: in a container
    uvicorn is PID 1 after every restart, and the hostname is kept, so a killed build's pid is the
    pid of the process that finds its directory. The kernel's boot, the PID namespace and the
    process's start time do, with a token of the process's own; `started` is for people."""
    if _PROCESS.get("pid") != os.getpid():  # first use, or a forked child: its own token
        pid = os.getpid()
        _PROCESS.clear()
        _PROCESS.update(
            host=socket.gethostname(),
            pid=pid,
            started=time.time(),
            boot=boot_id(),
            pidns=_pid_namespace(),
            start=start_time(pid),
            token=uuid.uuid4().hex,
        )
    return dict(_PROCESS)


def boot_id() -> str | None:
    """The kernel's id of this boot (Linux); None where there is none to read."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


def _pid_namespace() -> str | None:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def start_time(pid: int) -> int | None:
    """When process `pid` started, in clock ticks after boot (/proc/<pid>/stat, field 22); None if
    there is no such process, or nothing to read it from. A pid and its start time name one process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    try:
        # Field 2, the command, is in parentheses and may hold spaces and ")"; field 3 follows the last ")".
        return int(stat[stat.rindex(")") + 2 :].split()[19])
    except (ValueError, IndexError):
        return None


def gone(owner: dict[str, Any]) -> bool:
    """Whether the process an OWNER of this host names has exited. A host's processes are one PID
    namespace on one boot (replicas that share a hostname share their PIDs, as one container's do):
    an owner from another boot or namespace of this host is a process of a machine or container
    that has since restarted."""
    me = this_process()
    if owner.get("token") == me["token"]:
        return False
    for key in ("boot", "pidns"):
        if owner.get(key) is not None and me[key] is not None and owner[key] != me[key]:
            return True
    pid = int(owner["pid"])
    if pid == me["pid"]:  # not this process's token: an earlier process that had this pid
        return True
    if owner.get("start") is not None:  # None where the kernel gave none: the pid alone then
        return bool(start_time(pid) != owner["start"])
    return not _alive(pid)  # written before start times were


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


@dataclass(frozen=True)
class Owner:
    """Who runs a job, for people reading it: the host and this start of the process (its token,
    shortened; not the kernel's boot id). Liveness is the lock's business, not this."""

    replica: str
    boot: str

    def __str__(self) -> str:
        return f"{self.replica}/{self.boot}"

    @staticmethod
    def parse(text: str) -> Owner | None:
        replica, _, boot = text.rpartition("/")
        return Owner(replica, boot) if replica and boot else None


# A job's owner names this process by the token its staging directories' OWNER holds.
THIS_PROCESS = Owner(socket.gethostname(), this_process()["token"][:12])
