"""Cross-replica coordination: every replica serves the version the pointer
file names (`indexes/CURRENT` on the shared volume, the one owner of "which
version serves"), and Redis pub/sub only says when to look.

A replica looks at the pointer every `index_poll_s` and at once when a
message arrives. So a replica that misses a message (Redis down, restarting,
the publish failed) still converges within one poll, and a message is never
trusted: its version name is checked and then only wakes the replica, which
follows the pointer, not the message.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import uuid

import anyio.to_thread
import redis
import redis.asyncio as aioredis
from redis.asyncio.client import PubSub

from app.engine.runtime import Runtime
from core.store import VERSION_NAME

log = logging.getLogger(__name__)

CHANNEL = "index:updates"


def replica_id() -> str:
    """Unique per app instance, even for two instances in one process (tests)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class Publisher:
    def __init__(self, client: redis.Redis | None, origin: str) -> None:
        self.client = client
        self.origin = origin

    def __call__(self, version: str) -> None:
        if self.client is None:
            return  # no channel: the other processes (if any) find it at their next poll
        self.client.publish(CHANNEL, json.dumps({"version": version, "origin": self.origin}))


class Follower:
    """Keeps this replica on the pointer's version."""

    def __init__(self, runtime: Runtime, poll_s: float) -> None:
        self.runtime = runtime
        self.poll_s = poll_s
        self.wake = asyncio.Event()
        self._refused: str | None = None  # a version that failed to load: logged once, not retried each poll

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
        """Swaps to the pointer's version if this replica serves another. Returns whether it swapped."""
        runtime = self.runtime
        version = await anyio.to_thread.run_sync(runtime.behind)
        if version is None or version == self._refused or runtime.model is None:
            return False
        try:
            fresh = await anyio.to_thread.run_sync(runtime.serve_version, version)
        except (OSError, ValueError, KeyError) as error:
            self._refused = version
            log.error("cannot serve index %s, which the pointer names: %s", version, error)
            return False
        # Loading took seconds: if the pointer moved meanwhile, the next look loads that one instead.
        return await anyio.to_thread.run_sync(runtime.swap_if_pointed, fresh, "the pointer moved")

    def heard(self, raw: bytes | str, origin: str) -> None:
        """A message on the channel: checked, then a reason to look at the pointer."""
        try:
            body = json.loads(raw)
            version = body["version"]
            sender = body.get("origin")
        except (ValueError, KeyError, TypeError):
            log.warning("ignored an index update that is not {version, origin} JSON: %r", raw[:120])
            return
        if not isinstance(version, str) or not VERSION_NAME.fullmatch(version):
            log.warning("ignored an index update naming %r: not an index version name", str(version)[:120])
            return
        if not self.runtime.store.path(version).is_dir():
            log.warning("ignored an index update naming %s: no such version on this volume", version)
            return
        if sender != origin:
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
