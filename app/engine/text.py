"""Text normalisation shared by the index build, the caches and the sessions.

One function, so a cache key computed at serving time matches the key the
index build deduplicated on.
"""

from __future__ import annotations

import re
import unicodedata

_WHITESPACE = re.compile(r"\s+")


def normalize(text: str) -> str:
    """NFKC, lower case, whitespace collapsed: 'Hi  there!' -> 'hi there!'."""
    return _WHITESPACE.sub(" ", unicodedata.normalize("NFKC", text).lower()).strip()
