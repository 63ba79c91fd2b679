"""Cross-replica coordination: for every candidate set, every replica serves the
version the set's pointer file names (`indexes/CURRENT` on the shared volume,
the one owner of "which version serves"), and Redis pub/sub only says when to
look.

A replica looks at the sets on the volume and at their pointers every
`index_poll_s`, and at once when a message arrives. So a replica that misses
a message (Redis down, restarting, the publish failed) still converges within
one poll, and a message is never trusted: its set and version names are
checked and then only wake the replica, which follows the pointers, not the
message. A set created elsewhere is found and loaded; a deleted one is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import time
import uuid

import anyio.to_thread
import redis
import redis.asyncio as aioredis
from redis.asyncio.client import PubSub

from app.engine.runtime import Runtime
from app.engine.sets import DEFAULT_SET, SET_NAME, CandidateSet, indexes_root, names_on_volume
from core.store import VERSION_NAME

log = logging.getLogger(__name__)

CHANNEL = "index:updates"


def replica_id() -> str:
    """Unique per app instance, even for two instances in one process (tests)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class Publisher:
    def __init__(self, client: redis.Redis | None, origin: str, set_name: str = DEFAULT_SET) -> None:
        self.client = client
        self.origin = origin
        self.set_name = set_name

    def __call__(self, version: str) -> None:
        if self.client is None:
            return  # no channel: the other processes (if any) find it at their next poll
        message = {"version": version, "origin": self.origin, "set": self.set_name}
        self.client.publish(CHANNEL, json.dumps(message))


REFUSED_FIRST_WAIT_S = 15.0
REFUSED_MAX_WAIT_S = 600.0


class Follower:
    """Keeps this replica on every set's pointer, and its sets those on the volume."""

    def __init__(self, runtime: Runtime, poll_s: float) -> None:
        self.runtime = runtime
        self.poll_s = poll_s
        self.wake = asyncio.Event()
        # (set, version) that failed to load -> (monotonic time of its next try, seconds to wait after
        # that): tried again with a doubling wait, so a transient read error (EIO, a half-synced volume)
        # does not leave this replica on an old version for good, and a bad version is not reloaded
        # every poll.
        self._refused: dict[tuple[str, str], tuple[float, float]] = {}

    async def run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), self.poll_s)
            self.wake.clear()
            try:
                await self.follow()
            except Exception:  # a bug here must not end following for the replica's lifetime
                log.exception("following the index pointer failed; trying again")

    async def follow(self) -> bool:
        """Adds the sets new on the volume, drops those gone from it, and swaps each set to its
        pointer's version where this replica serves another. Returns whether any set swapped."""
        runtime = self.runtime
        if runtime.model is None:
            return False
        listed = await anyio.to_thread.run_sync(names_on_volume, runtime.settings.artifacts_dir)
        if listed is None:  # no sets folder: a remount, say. Nothing was seen deleted, so nothing is dropped.
            listed = list(runtime.sets)
        for gone in set(runtime.sets) - set(listed):
            runtime.drop_set(gone)
            log.info("set %s: deleted on the volume; not served any more", gone)
        swapped = False
        for name in listed:
            try:
                # Added only if still there: a delete since the listing must not be undone until the next poll.
                candidates = await anyio.to_thread.run_sync(runtime.add_set_on_volume, name)
                if candidates is not None:
                    swapped |= await self._follow_set(candidates)
            except Exception:  # one set's volume error (its pointer unreadable) must not stall the sets after it
                log.exception("set %s: following its pointer failed; the other sets go on", name)
        return swapped

    async def _follow_set(self, candidates: CandidateSet) -> bool:
        version = await anyio.to_thread.run_sync(candidates.behind)
        key = (candidates.name, version or "")
        if version is None or time.monotonic() < self._refused.get(key, (0.0, 0.0))[0]:
            return False
        try:
            fresh = await anyio.to_thread.run_sync(self.runtime.load_version, candidates, version)
        except Exception as error:  # any unreadable version (a corrupt .faiss is a RuntimeError): this set only
            wait = min(REFUSED_MAX_WAIT_S, self._refused.get(key, (0.0, REFUSED_FIRST_WAIT_S / 2))[1] * 2)
            self._refused[key] = (time.monotonic() + wait, wait)
            log.error(
                "set %s: cannot serve index %s, which the pointer names (trying again in %.0f s): %s: %s",
                candidates.name,
                version,
                wait,
                type(error).__name__,
                error,
            )
            return False
        self._refused.pop(key, None)
        # Loading took seconds: if the pointer moved meanwhile, the next look loads that one instead.
        return await anyio.to_thread.run_sync(candidates.swap_if_pointed, fresh, "the pointer moved")

    def heard(self, raw: bytes | str, origin: str) -> None:
        """A message on the channel: checked, then a reason to look at the pointer."""
        try:
            body = json.loads(raw)
            version = body["version"]
            sender = body.get("origin")
            name = body.get("set", DEFAULT_SET)
        except (ValueError, KeyError, TypeError, AttributeError):
            log.warning("ignored an index update that is not {version, origin, set} JSON: %r", raw[:120])
            return
        if not isinstance(version, str) or not VERSION_NAME.fullmatch(version):
            log.warning("ignored an index update naming %r: not an index version name", str(version)[:120])
            return
        if not isinstance(name, str) or not SET_NAME.fullmatch(name):
            log.warning("ignored an index update for %r: not a set name", str(name)[:120])
            return
        if not (indexes_root(self.runtime.settings.artifacts_dir, name) / version).is_dir():
            log.warning("ignored an index update naming %s of set %s: no such version on this volume", version, name)
            return
        if sender != origin:
            # A set this replica has not seen yet is found on the volume by `follow`.
            self.wake.set()


async def listen(follower: Follower, url: str, origin: str) -> None:
    """Runs for the app's lifetime; reconnects after Redis failures.

    Polls with a timeout rather than iterating `pubsub.listen()`, so that
    cancelling it at shutdown never waits on a blocked read.
    """
    while True:
        client = aioredis.Redis.from_url(url, socket_connect_timeout=2)
        pubsub = client.pubsub()
        try:
            await pubsub.subscribe(CHANNEL)
            follower.wake.set()  # catch up on what was missed while away
            while True:
                message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                if message is not None:
                    follower.heard(message["data"], origin)
        except asyncio.CancelledError:
            raise
        except Exception as error:  # Redis down: retry, keep serving (the poll still follows the pointer)
            log.warning("index update listener: %s; retrying in 2s", error)
            await asyncio.sleep(2)
        finally:
            await _close(pubsub, client)


async def _close(pubsub: PubSub, client: aioredis.Redis) -> None:
    with contextlib.suppress(Exception):
        await asyncio.wait_for(pubsub.aclose(), timeout=1)  # type: ignore[no-untyped-call]
    with contextlib.suppress(Exception):
        await asyncio.wait_for(client.aclose(), timeout=1)
