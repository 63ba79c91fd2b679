"""Builds the chitchat index for a bundle and points serving at it.

    python -m index                   # chitchat train split, the release bundle
    python -m index --if-missing      # only if no version matches the bundle
    python -m index --bundle DIR      # another bundle's index

The library it calls is `index.build`; `make index` and the Docker image run this.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from core.bundle import RELEASE_BUNDLE, open_bundle
from core.encoder import Encoder
from core.store import IndexStore
from index.build import build_version, corpus_candidates


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m index", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--artifacts", type=Path, default=Path("artifacts"))
    parser.add_argument("--bundle", type=Path, default=RELEASE_BUNDLE, help="bundle directory (default: the release)")
    parser.add_argument("--if-missing", action="store_true", help="skip if a version for this bundle exists")
    parser.add_argument("--no-reuse", action="store_true", help="encode every text, even ones a version has")
    args = parser.parse_args()
    bundle_dir = args.bundle
    bundle = open_bundle(bundle_dir)
    store = IndexStore(args.artifacts / "indexes")
    existing = store.latest_for(bundle.checksum)
    if args.if_missing and existing:
        print(f"[index] {existing} already serves {bundle.name}; skipping")
        store.set_current(existing)
        return
    started = time.perf_counter()
    candidates = corpus_candidates(bundle.max_context_turns)
    print(f"[index] {len(candidates)} chitchat train candidates in {time.perf_counter() - started:.1f}s")
    encoder = Encoder(bundle_dir, bundle)
    manifest = build_version(candidates, encoder, bundle.checksum, store, "chitchat:train", reuse=not args.no_reuse)
    store.set_current(manifest.version)
    print(
        f"[index] {manifest.version}: {manifest.replies} replies, {manifest.queries} queries, "
        f"{manifest.encoded} texts encoded, ann {manifest.ann}, checks {manifest.checks}, "
        f"in {manifest.build_seconds:.1f}s"
    )


if __name__ == "__main__":
    main()
