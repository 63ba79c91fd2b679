"""What `/info` says about the served (bundle, index version) pair, prose included:
built from the engine's own state, so the route only serves it."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from app.engine.runtime import QUERY_SIMILARITY_OFF, Runtime
from app.engine.sets import CandidateSet
from core.retriever import Serving
from core.store import QUERY_INDEX, REACTION_INDEX, REPLY_INDEX
from core.text import SCRIPT_OF_LANGUAGE


def context_way(serving: Serving) -> dict[str, Any]:
    """How a conversation becomes its context vector on this server (core/context.py)."""
    combiner = serving.combiner
    if combiner is None:
        has = serving.bundle.combiner is not None
        return {
            "way": "joined",
            "turns": serving.bundle.max_context_turns,
            "why": "CHITCHAT_JOINED_CONTEXT is set" if has else "the bundle has no combiner",
        }
    return {
        "way": "per_turn",
        "turns": combiner.turns,
        "bot_turns_read_as": "reply" if combiner.reply_side.any() else "context",
    }


def model_info(serving: Serving, rerank_by_default: bool) -> dict[str, Any]:
    """The bundle, and what this server applies of it."""
    bundle = serving.bundle
    return {
        "encoder": serving.bundle_dir.name,  # what a set names it by
        "name": bundle.name,
        "model_id": bundle.model_id,
        "kind": bundle.kind,
        "checksum": bundle.checksum,
        "dim": bundle.dim,
        "layers": bundle.num_layers,
        "quantization": bundle.quantization,
        "encoder_sessions": serving.encoder.alone_choice or None,
        "max_context_turns": bundle.max_context_turns,
        "context": context_way(serving),
        "poly": asdict(bundle.poly) if bundle.poly else None,
        # Whether a request that does not say is reranked (Settings.rerank_by_default).
        "rerank_by_default": rerank_by_default and bundle.poly is not None,
        "language": bundle.language,
        "languages": bundle.languages or [bundle.language],
        "reactions": {
            "labels": serving.reactions.labels,
            "language": serving.reactions.language,
            "translations": serving.reactions.translations,
        }
        if serving.reactions
        else None,
        "reaction_model": reaction_model(serving),
        "reaction_sets": [asdict(s) for s in serving.reaction_sets()],
        "reaction_fallback": reaction_fallback(serving),
        "confidence": {"features": bundle.confidence.features, "validation_auroc": bundle.confidence.auroc}
        if bundle.confidence
        else None,
        # What this server applies: the reply-matching threshold follows CHITCHAT_REACTION_SHARE.
        "thresholds": asdict(serving.thresholds),
        "thresholds_from": thresholds_from(serving),
        "reaction_share": {
            "share": serving.share.share,
            "of": f"the last {serving.share.window} turns of this index version",
            "threshold_now": round(serving.share.threshold(), 4),
            "starting_threshold": serving.share.fallback,  # until `warmup_turns` are in
            "warmup_turns": serving.share.warmup,
            "validation_threshold": serving.thresholds.reply_matching,
        }
        if serving.share is not None
        else None,
        "calibration": bundle.calibration,
        "eval": bundle.eval,
        "release": bundle.release or None,
        "training": {k: bundle.training.get(k) for k in ("profile", "seconds_total", "hardware")}
        if bundle.training
        else None,
    }


def index_info(serving: Serving, versions: list[str]) -> dict[str, Any]:
    """The served index version; `versions`: every version in the store."""
    index = serving.index.manifest
    return {
        "version": index.version,
        "replies": index.replies,
        "queries": index.queries,
        "source": index.source,
        "created_at": index.created_at,
        "ann": index.ann,
        "profile": index.profile,
        "versions": versions,
    }


def set_info(candidates: CandidateSet) -> dict[str, Any]:
    """A set, for `/admin/sets`: what it serves here, its counts and what its index holds in memory."""
    serving = candidates.serving
    if serving is None:
        return {"name": candidates.name, "ready": False, "problem": candidates.problem, "version": None}
    manifest = serving.index.manifest
    return {
        "name": candidates.name,
        "ready": True,
        "encoder": serving.bundle_dir.name,
        "version": manifest.version,
        "replies": manifest.replies,
        "queries": manifest.queries,
        "reactions": len(serving.index.reaction_ids),
        "tags": len(serving.index.reply_tag_rows),
        "index_bytes": index_bytes(candidates),
        "created_at": manifest.created_at,
        "source": manifest.source,
    }


def encoders(runtime: Runtime) -> dict[str, Any]:
    """The shipped encoders a set may name, the default, and those loaded because a set uses them."""
    return {"default": runtime.default_encoder, "available": sorted(runtime.encoders), "loaded": sorted(runtime.models)}


def index_bytes(candidates: CandidateSet) -> int | None:
    """The size of the served version's FAISS files: what its indexes hold in this process's memory,
    as they are read whole at load (the texts beside them are not counted)."""
    serving = candidates.serving
    if serving is None:
        return None
    directory = candidates.store.path(serving.index_version)
    try:
        return sum(
            (directory / f).stat().st_size
            for f in (REPLY_INDEX, QUERY_INDEX, REACTION_INDEX)
            if (directory / f).is_file()
        )
    except OSError:  # the version was removed meanwhile (the set deleted on another replica)
        return None


def thresholds_from(serving: Serving) -> str:
    if serving.bundle.calibration:
        return "calibrated on validation turns (see calibration)"
    if serving.thresholds.query_similarity >= QUERY_SIMILARITY_OFF:
        query = "query similarity off: this index version has fewer than 2 stored queries to set its threshold from"
    else:
        query = "query similarity at the 99th percentile of stored-query neighbour cosines of this index version"
    reply = "reply matching always answers" if _no_reply_threshold(serving) else "reply matching: see reaction_fallback"
    return f"not calibrated: {query}; {reply}"


def _no_reply_threshold(serving: Serving) -> bool:
    return serving.share is None and serving.thresholds.reply_matching <= -1


def reaction_model(serving: Serving) -> dict[str, Any] | None:
    """The reaction model whose classifier reads the last turn, if the service has one (else the
    classifier, if any, is the bundle's own, reading its context vector)."""
    reader = serving.reactions.reader if serving.reactions else None
    if reader is None:
        return None
    return {"name": reader.manifest.name, "checksum": reader.manifest.checksum, "reads": "the last turn"}


def reaction_fallback(serving: Serving) -> str:
    """Which conversations a reaction can answer, and when one does (`retriever.walk`)."""
    scripts = sorted({s for s in (SCRIPT_OF_LANGUAGE.get(r.language) for r in serving.reaction_sets()) if s})
    if not scripts:
        return "off: no reaction set (the model has none, and this index version's candidates brought none)"
    default = SCRIPT_OF_LANGUAGE.get(serving.bundle.language)
    no_letters = f"counts as {default}" if default in scripts else "gets none"
    if serving.share is not None:
        when = f"reply matching's confidence is among the least sure {serving.share.share:.0%} of recent turns"
    elif not _no_reply_threshold(serving):
        score = "confidence" if serving.confidence is not None else "top score"
        when = f"reply matching's {score} is under {serving.thresholds.reply_matching}"
    else:
        # walk(): with a threshold of -1 every matched reply is sure enough.
        when = (
            "a request sets a reply_matching threshold its best reply misses, or leaves reply matching out:"
            " with no threshold of its own, reply matching answers every turn"
        )
    return (
        f"on for conversations in {' or '.join(scripts)} script, off for others"
        f" (a window without letters {no_letters}); a reaction answers when {when}"
    )
