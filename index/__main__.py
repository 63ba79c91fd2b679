"""Builds the default set's index for a bundle and points serving at it.

    python -m index                   # chitchat train split in English and the shipped Korean, the release bundle
    python -m index --if-missing      # only if no version matches the bundle
    python -m index --bundle DIR      # another bundle's index
    python -m index --if-missing --first-slice   # `make run`: a first slice now, the service builds the rest
    python -m index --no-korean       # English only

The library it calls is `index.build`; `make index` and the Docker image run this.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path
from typing import TextIO

from core.bundle import RELEASE_BUNDLE, RELEASE_REACTIONS, open_bundle
from core.encoder import Encoder
from core.store import IndexStore
from core.text import normalize
from core.valence import Valence
from index.build import DEFAULT_SOURCE, ENGLISH_SOURCE, build_version, default_candidates
from index.encode_cache import EncodeCache
from index.first_slice import SLICE_REPLIES, Owed, first_slice, owe, owed, settle


class _Lines(logging.StreamHandler[TextIO]):
    """The build's log records (`index.build`) as `[index] ...` lines on stderr, beside this command's own
    lines; the service logs the same records as JSON through its own handler."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)
        self.setFormatter(logging.Formatter("[index] %(message)s"))


def _log_to_stderr() -> None:
    logger = logging.getLogger("index")
    if not any(isinstance(h, _Lines) for h in logger.handlers):
        logger.addHandler(_Lines())
    logger.setLevel(logging.INFO)


def reply_valence(reactions_dir: Path | None) -> Valence | None:
    """The reaction model's valence model, which scores the stored replies as the service's does; None
    without a reaction model, or with one that has none."""
    if reactions_dir is None or not reactions_dir.is_dir():
        return None
    manifest = open_bundle(reactions_dir)
    return Valence.load(reactions_dir, manifest.valence) if manifest.valence is not None else None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m index", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--artifacts", type=Path, default=Path("artifacts"))
    parser.add_argument("--bundle", type=Path, default=RELEASE_BUNDLE, help="bundle directory (default: the release)")
    parser.add_argument(
        "--reactions",
        type=Path,
        default=RELEASE_REACTIONS,
        help="the reaction model whose valence scores the stored replies (default: the release's)",
    )
    parser.add_argument("--if-missing", action="store_true", help="skip if a version for this bundle exists")
    parser.add_argument("--no-reuse", action="store_true", help="encode every text, even ones a version has")
    parser.add_argument("--corpus", type=Path, help="a chitchat-format corpus file (default: the package's)")
    parser.add_argument(
        "--no-korean", action="store_true", help="English only: without the shipped Korean conversations"
    )
    parser.add_argument(
        "--first-slice",
        type=int,
        nargs="?",
        const=SLICE_REPLIES,
        metavar="REPLIES",
        help=f"build only the replies that answer the most contexts (default {SLICE_REPLIES}) and leave the rest "
        "to the service, which builds it in the background and swaps it in",
    )
    args = parser.parse_args(argv)
    _log_to_stderr()
    bundle_dir = args.bundle
    bundle = open_bundle(bundle_dir)
    store = IndexStore(args.artifacts / "indexes")
    existing = store.latest_for(bundle.checksum)
    debt = owed(store.root)
    if existing and debt and debt.slice_version == existing and not args.first_slice:
        existing = None  # a first slice stands in for this index: build it now (the slice's vectors are reused)
    if args.if_missing and existing:
        print(f"[index] {existing} already serves {bundle.name}; skipping")
        store.set_current(existing)
        return
    started = time.perf_counter()
    korean = not args.no_korean
    candidates = default_candidates(bundle.max_context_turns, args.corpus, korean)
    source = DEFAULT_SOURCE if korean else ENGLISH_SOURCE
    print(f"[index] {len(candidates)} {source} candidates in {time.perf_counter() - started:.1f}s")
    # Threads that spin between the ops of a run: this build is all the process does, and spinning
    # encodes it a few percent faster (`make bench-encode-spin`, reports/encode_spin.md). The service's
    # own builds keep sleeping threads, which leave the cores to requests.
    encoder = Encoder(bundle_dir, bundle, spin=True)
    cache = EncodeCache(args.artifacts / "cache" / "encode", bundle.checksum)
    valence = reply_valence(args.reactions)
    if args.first_slice:
        chosen = first_slice(candidates, args.first_slice)
        manifest = build_version(
            chosen, encoder, bundle.checksum, store, f"{source} first slice", cache=cache, valence=valence
        )
        full = len({normalize(c.reply) for c in candidates if c.kind != "reaction"})  # as the index dedups
        corpus = str(args.corpus.resolve()) if args.corpus else None
        debt = Owed(bundle.checksum, manifest.version, source, full, bundle.max_context_turns, corpus, korean)
        owe(store.root, debt)
    else:
        manifest = build_version(
            candidates, encoder, bundle.checksum, store, source, reuse=not args.no_reuse, cache=cache, valence=valence
        )
        settle(store.root)  # whatever slice stood in for it, this is the full index
    store.set_current(manifest.version)
    print(
        f"[index] {manifest.version}: {manifest.replies} replies, {manifest.queries} queries, "
        f"{manifest.encoded} texts encoded, ann {manifest.ann}, checks {manifest.checks}, "
        f"in {manifest.build_seconds:.1f}s"
    )


if __name__ == "__main__":
    main()
