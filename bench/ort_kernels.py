"""What onnxruntime's SkipLayerNormalization and its thread waits cost at one short query.

    python -m bench.ort_kernels [--bundles DIR ...] [--queries 1000]

The encoder turns off onnxruntime's session-time SkipLayerNormFusion, and
the multilingual build no longer writes that op (models/fusion.py), because
on this onnxruntime the fused kernel is slower than the Add and
LayerNormalization it replaces. This prints the evidence:

1. The op alone: one SkipLayerNormalization against Add + LayerNormalization
   on [1, T, 384] float32, as the service runs sessions (every core, idle
   threads sleeping), µs per call including the call itself.
2. Whole encoders: single held-out contexts (a seeded sample, as `make
   bench` draws) through each bundle's session with the fusion allowed and
   with it off, the two sessions taking turns query by query so that a
   noisy neighbour slows both alike; the p50 of each, and how far apart
   their outputs are (min cosine).
3. Thread waits: each bundle's session with idle pool threads sleeping,
   spinning only while a run lasts (the service's default,
   `CHITCHAT_ORT_SPIN`), and spinning until onnxruntime's own back-off,
   taking turns query by query; the p50 of each, and the CPU seconds its
   threads burn in the second after a query, when a service waits for the
   next request.
"""

from __future__ import annotations

import argparse
import resource
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

from bench.latency import cpu_description, test_contexts
from core.bundle import ENCODER_FILE, RELEASE_BUNDLE, open_bundle
from core.encoder import OUTPUT_NAMES, Encoder, pad

BUNDLES = (Path("artifacts/bundles/multilingual-e5-chitchat-int8"), RELEASE_BUNDLE)
WARMUP = 20


def _options(spin: bool = False) -> ort.SessionOptions:
    options = ort.SessionOptions()  # as core/encoder.py builds them, less the disabled fusion
    options.intra_op_num_threads = 0
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
    return options


def _op_session(fused: bool, hidden: int) -> ort.InferenceSession:
    from onnx import TensorProto, helper, numpy_helper

    weights = [
        numpy_helper.from_array(np.ones(hidden, np.float32), "gamma"),
        numpy_helper.from_array(np.zeros(hidden, np.float32), "beta"),
    ]
    if fused:
        nodes = [
            helper.make_node(
                "SkipLayerNormalization", ["x", "skip", "gamma", "beta"], ["y"], domain="com.microsoft", epsilon=1e-12
            )
        ]
    else:
        nodes = [
            helper.make_node("Add", ["x", "skip"], ["sum"]),
            helper.make_node("LayerNormalization", ["sum", "gamma", "beta"], ["y"], axis=-1, epsilon=1e-12),
        ]
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, None, hidden]) for n in ("x", "skip")]
    output = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, None, hidden])
    graph = helper.make_graph(nodes, "residual_norm", inputs, [output], weights)
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    # Off here too, or the session would fuse the unfused pair right back.
    return ort.InferenceSession(
        model.SerializeToString(), _options(), ["CPUExecutionProvider"], disabled_optimizers=["SkipLayerNormFusion"]
    )


def op_micros(tokens: int, hidden: int = 384, calls: int = 2000) -> dict[str, float]:
    x = np.random.default_rng(0).standard_normal((1, tokens, hidden)).astype(np.float32)  # [1, T, H]
    result = {}
    for label, fused in (("skip_layer_norm_us", True), ("add_layer_norm_us", False)):
        session = _op_session(fused, hidden)
        for _ in range(100):
            session.run(None, {"x": x, "skip": x})
        started = time.perf_counter()
        for _ in range(calls):
            session.run(None, {"x": x, "skip": x})
        result[label] = round((time.perf_counter() - started) / calls * 1e6, 1)
    return result


def _held_out_ids(encoder: Encoder, queries: int) -> list[list[int]]:
    """WARMUP + queries held-out contexts (a seeded sample, as `make bench` draws), tokenised as served."""
    turns = test_contexts(queries + WARMUP, encoder.manifest.max_context_turns)
    return encoder.tokenize([encoder.join_context(t) for t in turns], "context")


def encoder_p50(bundle: Path, queries: int) -> dict[str, float | str]:
    manifest = open_bundle(bundle)
    encoder = Encoder(bundle, manifest)  # its tokenizer, its context rules, and the session as served
    token_ids = _held_out_ids(encoder, queries)
    path, output = str(bundle / ENCODER_FILE), OUTPUT_NAMES["context"]
    sessions = {
        "fusion_allowed": ort.InferenceSession(path, _options(), ["CPUExecutionProvider"]),
        "fusion_off": encoder.session,
    }
    millis: dict[str, list[float]] = {name: [] for name in sessions}
    vectors: dict[str, list[np.ndarray]] = {name: [] for name in sessions}
    for i, row in enumerate(token_ids):
        ids, mask = pad([row])  # [1, T] each
        names = list(sessions) if i % 2 else list(reversed(sessions))
        for name in names:
            started = time.perf_counter()
            vector = sessions[name].run([output], {"input_ids": ids, "attention_mask": mask})[0][0]  # [H]
            if i >= WARMUP:
                millis[name].append((time.perf_counter() - started) * 1000)
            vectors[name].append(vector)
    cosines = (np.array(vectors["fusion_allowed"]) * np.array(vectors["fusion_off"])).sum(axis=1)  # [N]
    return {
        "bundle": manifest.name,
        "graph": manifest.quantization,
        "tokens_p50": float(np.median([len(r) for r in token_ids])),
        **{f"p50_ms_{name}": round(float(np.median(ms)), 2) for name, ms in millis.items()},
        "min_cosine": round(float(cosines.min()), 4),
    }


def _idle_cpu_s(session: ort.InferenceSession, feed: dict[str, np.ndarray], output: str) -> float:
    """CPU seconds this process spends in the second after one query: threads left spinning."""
    session.run([output], feed)
    before = resource.getrusage(resource.RUSAGE_SELF)
    time.sleep(1.0)
    after = resource.getrusage(resource.RUSAGE_SELF)
    return round((after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime), 3)


def thread_waits(bundle: Path, queries: int, block: int = 20) -> dict[str, float | str]:
    """Sessions take turns a block of queries at a time, with a pause between blocks:
    query by query, one session's spinning threads would take the core the next one runs on."""
    manifest = open_bundle(bundle)
    always = _options(spin=True)
    sleeping = Encoder(bundle, manifest, spin=False)  # the service's default; its tokenizers serve all three
    sessions = {
        "sleeping": sleeping.session,
        "spinning_in_run": Encoder(bundle, manifest, spin=True, tokenizers_of=sleeping).session,
        "spinning_always": ort.InferenceSession(
            str(bundle / ENCODER_FILE), always, ["CPUExecutionProvider"], disabled_optimizers=["SkipLayerNormFusion"]
        ),
    }
    feeds = [
        dict(zip(("input_ids", "attention_mask"), pad([row]), strict=True)) for row in _held_out_ids(sleeping, queries)
    ]
    output = OUTPUT_NAMES["context"]
    millis: dict[str, list[float]] = {name: [] for name in sessions}
    for start in range(0, len(feeds), block):
        for name, session in sessions.items():
            time.sleep(0.2)  # onnxruntime's own spinning back-off ends well within this
            for i, feed in enumerate(feeds[start : start + block], start):
                started = time.perf_counter()
                session.run([output], feed)
                if i >= WARMUP:
                    millis[name].append((time.perf_counter() - started) * 1000)
    return {
        "bundle": manifest.name,
        **{f"p50_ms_{name}": round(float(np.median(ms)), 2) for name, ms in millis.items()},
        **{f"idle_cpu_s_{name}": _idle_cpu_s(session, feeds[0], output) for name, session in sessions.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bundles", type=Path, nargs="+", default=[b for b in BUNDLES if b.is_dir()])
    parser.add_argument("--queries", type=int, default=1000)
    args = parser.parse_args()
    print(f"onnxruntime {ort.__version__} on {cpu_description()}")
    print("One residual + LayerNorm on [1, T, 384] float32, µs per call")
    print("| T | SkipLayerNormalization | Add + LayerNormalization |\n|---|---|---|")
    for tokens in (16, 50, 128):
        op = op_micros(tokens)
        print(f"| {tokens} | {op['skip_layer_norm_us']} | {op['add_layer_norm_us']} |")
    print(f"\nSingle held-out contexts of up to 3 turns, {args.queries} each, the two sessions taking turns")
    print("| bundle | graph | tokens p50 | p50, fusion allowed | p50, fusion off | min cosine between them |")
    print("|---|---|---|---|---|---|")
    for bundle in args.bundles:
        s = encoder_p50(bundle, args.queries)
        print(
            f"| {s['bundle']} | {s['graph']} | {s['tokens_p50']:.0f} | {s['p50_ms_fusion_allowed']} ms"
            f" | {s['p50_ms_fusion_off']} ms | {s['min_cosine']} |"
        )
    print(f"\nThread waits, the same contexts, {args.queries} each, the three sessions taking turns 20 at a time;")
    print("idle CPU: seconds of CPU the process burns in the second after a query")
    print("| bundle | sleeping: p50 | idle CPU | spinning in a run: p50 | idle CPU | spinning always: p50 | idle CPU |")
    print("|---|---|---|---|---|---|---|")
    for bundle in args.bundles:
        w = thread_waits(bundle, args.queries)
        print(
            f"| {w['bundle']} | {w['p50_ms_sleeping']} ms | {w['idle_cpu_s_sleeping']} s"
            f" | {w['p50_ms_spinning_in_run']} ms | {w['idle_cpu_s_spinning_in_run']} s"
            f" | {w['p50_ms_spinning_always']} ms | {w['idle_cpu_s_spinning_always']} s |"
        )


if __name__ == "__main__":
    main()
