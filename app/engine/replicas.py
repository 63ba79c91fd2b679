"""Cross-replica coordination over Redis: the current-version pointer and a
pub/sub channel that tells every replica to load a new version.

Replicas share the artifact volume, so a message only needs the version name.
A replica that misses a message (Redis down, restarting) still converges:
at start it reads the pointer, and the listener re-reads it on reconnect.
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

log = logging.getLogger(__name__)

CHANNEL = "index:updates"
POINTER_KEY = "index:current"


def replica_id() -> str:
    """Unique per app instance, even for two instances in one process (tests)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class Publisher:
    def __init__(self, client: redis.Redis | None, origin: str) -> None:
        self.client = client
        self.origin = origin

    def __call__(self, version: str) -> None:
        if self.client is None:
            return  # one process: nobody else to tell
        self.client.set(POINTER_KEY, version)
        self.client.publish(CHANNEL, json.dumps({"version": version, "origin": self.origin}))


async def follow(runtime: Runtime, version: str | None) -> None:
    """Swap to `version` if it is not what this replica serves."""
    serving = runtime.serving
    if version is None or runtime.model is None or (serving is not None and version == serving.index_version):
        return  # nothing new, or no model to pair it with
    try:
        fresh = await anyio.to_thread.run_sync(runtime.serve_version, version)
    except (OSError, ValueError, KeyError) as error:
        log.error("cannot follow index %s: %s", version, error)
        return
    runtime.swap(fresh, "another replica's reindex")


async def listen(runtime: Runtime, url: str, origin: str) -> None:
    """Runs for the app's lifetime; reconnects after Redis failures.

    Polls with a timeout rather than iterating `pubsub.listen()`, so that
    cancelling it at shutdown never waits on a blocked read.
    """
    while True:
        client = aioredis.Redis.from_url(url, socket_connect_timeout=2)
        pubsub = client.pubsub()
        try:
            await pubsub.subscribe(CHANNEL)
            pointer = await client.get(POINTER_KEY)  # catch up on what was missed while away
            await follow(runtime, pointer.decode() if isinstance(pointer, bytes) else pointer)
            while True:
                message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                if message is None:
                    continue
                body = json.loads(message["data"])
                if body.get("origin") != origin:
                    await follow(runtime, body.get("version"))
        except asyncio.CancelledError:
            raise
        except Exception as error:  # Redis down or a bad message: retry, keep serving
            log.warning("index update listener: %s; retrying in 2s", error)
            await asyncio.sleep(2)
        finally:
            await _close(pubsub, client)


async def _close(pubsub: PubSub, client: aioredis.Redis) -> None:
    with contextlib.suppress(Exception):
        await asyncio.wait_for(pubsub.aclose(), timeout=1)  # type: ignore[no-untyped-call]
    with contextlib.suppress(Exception):
        await asyncio.wait_for(client.aclose(), timeout=1)
