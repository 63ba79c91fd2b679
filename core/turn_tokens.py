"""Context ids assembled turn by turn, where that is exactly what tokenising the whole context gives.

A context is its turns joined by the bundle's turn separator, a special token
(" [SEP] "), tokenised and cut from the left to the context limit. For a BERT
WordPiece tokenizer that is the same as tokenising each turn and putting the
separator's id between them: special tokens are split out before the
normaliser and the pre-tokenizer see the text, and both work within words.
Assembled that way,

- the last turn, which a `/reply` embeds alone and at the end of its
  context, is tokenised once;
- a session's turns, which come back in its next two requests' contexts, are
  tokenised once (kept in a small LRU);
- turns older than what the limit keeps are not tokenised at all.

`for_bundle` returns None where this is not exact (a query prefix, a
SentencePiece tokenizer) or where a probe finds it differs; those bundles
tokenise each context whole.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from tokenizers import Tokenizer

from core.bundle import BundleManifest

# Turns whose ids are kept, about 1 kB each: a session's turn returns in its next two contexts.
TURN_MEMO = 4096
PROBES = (  # the separator inside a turn, around one, alone, and a turn longer than the limit
    ("hi there!", "how are you? [SEP] fine", "x[SEP]y", " [SEP] ", "", "   ", "ok " * 90),
    ("Ça va? 괜찮아요 😂", "我很好", "e\u0301 \x00\t tab", "the end."),
)


class TurnTokenizer:
    def __init__(self, tokenizer: Tokenizer, separator: str, limit: int) -> None:
        """tokenizer: the context side's, truncating from the left; limit: its max length."""
        self.tokenizer = tokenizer
        self.separator = separator  # as the turns are joined: " [SEP] "
        separator_id = tokenizer.token_to_id(separator.strip())
        if separator_id is None:
            raise ValueError(f"{separator.strip()!r} is no token of this tokenizer")
        self.separator_id = separator_id
        self.limit = limit
        content = tokenizer.encode("a", add_special_tokens=False).ids
        whole = tokenizer.encode("a").ids
        start = next(i for i in range(len(whole)) if whole[i : i + len(content)] == content)
        self.head = whole[:start]  # [CLS]
        self.tail = whole[start + len(content) :]  # [SEP]
        self._memo: OrderedDict[str, list[int]] = OrderedDict()
        self._lock = threading.Lock()  # the event loop tokenises; the load-time probes run in a thread

    @classmethod
    def for_bundle(cls, tokenizer: Tokenizer, manifest: BundleManifest) -> TurnTokenizer | None:
        """One for this bundle's context side, if assembling turns is exact for it."""
        separator = manifest.turn_separator
        special = {t.content for t in tokenizer.get_added_tokens_decoder().values() if t.special}
        if (
            manifest.query_prefix
            or type(tokenizer.pre_tokenizer).__name__ != "BertPreTokenizer"
            or separator != f" {separator.strip()} "
            or separator.strip() not in special
        ):
            return None
        turns = cls(tokenizer, separator, manifest.max_context_tokens)
        for probe in PROBES:
            joined = separator.join(probe)
            if turns.ids(joined) != tokenizer.encode(joined).ids:
                return None
        turns._memo.clear()
        return turns

    def ids(self, context: str) -> list[int]:
        """The ids of `context` (turns joined by the separator), as tokenizer.encode(context).ids."""
        budget = self.limit - len(self.head) - len(self.tail)
        newest_first: list[list[int]] = []
        size = 0
        for turn in reversed(context.split(self.separator)):
            if newest_first:
                newest_first.append([self.separator_id])
                size += 1
            if size >= budget:
                break
            ids = self._turn(turn)
            newest_first.append(ids)
            size += len(ids)
            if size >= budget:
                break
        content = [i for piece in reversed(newest_first) for i in piece]
        return self.head + content[max(0, len(content) - budget) :] + self.tail

    def _turn(self, turn: str) -> list[int]:
        with self._lock:
            ids = self._memo.get(turn)
            if ids is not None:
                self._memo.move_to_end(turn)
                return ids
        ids = self.tokenizer.encode(turn, add_special_tokens=False).ids  # left-truncated: the newest kept
        with self._lock:
            self._memo[turn] = ids
            if len(self._memo) > TURN_MEMO:
                self._memo.popitem(last=False)
        return ids
