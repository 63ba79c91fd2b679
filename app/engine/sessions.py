"""Per-session conversation history: the last N turns, user and bot, with a TTL."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

from app.engine.kv import Guarded

Role = Literal["user", "bot"]


@dataclass(frozen=True)
class SessionTurn:
    role: Role
    text: str


class SessionStore:
    def __init__(self, store: Guarded, max_turns: int, ttl_s: int) -> None:
        self.store = store
        self.max_turns = max_turns
        self.ttl_s = ttl_s

    @staticmethod
    def _key(session_id: str) -> str:
        return f"session:{session_id}"

    async def history(self, session_id: str) -> list[SessionTurn]:
        """Oldest first. Empty for a new, expired or unreachable session."""
        turns = []
        for raw in await self.store.list_range(self._key(session_id)):
            try:
                item = json.loads(raw)
                turns.append(SessionTurn(role=item["role"], text=item["text"]))
            except (ValueError, KeyError, TypeError):
                continue  # a corrupt entry costs one turn of context, not the request
        return turns

    async def append(self, session_id: str, *turns: SessionTurn) -> None:
        values = [json.dumps({"role": t.role, "text": t.text}).encode() for t in turns]
        await self.store.list_append(self._key(session_id), values, self.max_turns, self.ttl_s)
