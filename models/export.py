"""DualEncoder -> ONNX (pooling and normalisation in the graph) -> int8 -> bundle.

The bundle is assembled in a temporary directory and renamed into place only
after the parity check passes, so a failed export never leaves a bundle that
the service could pick up.

    python -m models.export                      # zero-shot all-MiniLM-L6-v2
"""

from __future__ import annotations

import argparse
import shutil
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tokenizers import Tokenizer

from core.bundle import (
    ENCODER_FILE,
    MANIFEST,
    REACTIONS_FILE,
    TOKENIZER_FILE,
    BundleManifest,
    PolySpec,
    Thresholds,
    read_manifest,
    seal,
    write_manifest,
)
from core.encoder import OUTPUT_NAMES, POLY_OUTPUT, Encoder
from core.files import staged_dir
from models.encoder import DualEncoder, load_pretrained, minilm_path
from models.fusion import fuse_bert
from models.reactions.model import ReactionModel

ONNX_OPSET = 17
# Dynamic int8 spreads a ~1% cosine error over all layers of MiniLM (no single
# layer dominates), so no quantisation gets every sentence above 0.99: the
# gate is the sample mean, with this floor for any one sentence.
MIN_SINGLE_COSINE = 0.95


class ParityError(RuntimeError):
    pass


@dataclass
class ExportConfig:
    name: str
    model_id: str
    kind: str
    tokenizer_path: Path
    max_context_tokens: int = 64  # as trained (TrainConfig); 3 chat turns are ~54 tokens at the median
    max_reply_tokens: int = 96  # candidates are capped at 280 characters, about 70 tokens
    max_context_turns: int = 3  # measured: 3 turns beat 1 (R@1 0.33 vs 0.30 zero-shot)
    turn_separator: str = " [SEP] "  # Dialog-BERT: an explicit separator between turns helps
    quantize: bool = True
    min_parity_cosine: float = 0.99  # the build fails if the mean cosine over the sample is below this
    thresholds: Thresholds = field(default_factory=Thresholds)
    eval: dict[str, float] = field(default_factory=dict)
    servable: bool = True  # False: kept for evaluation, never picked by the service on its own
    training: dict[str, object] = field(default_factory=dict)
    data: dict[str, object] = field(default_factory=dict)
    poly: PolySpec | None = None  # must describe model.poly_head when it has one
    reactions: ReactionModel | None = None
    # Text the encoder puts before a context / a reply (E5's "query: "); the bundle's manifest says so.
    query_prefix: str = ""
    passage_prefix: str = ""
    language: str = "en"  # BCP 47, or "mul"
    languages: list[str] = field(default_factory=list)  # what a "mul" bundle was trained and gated for
    # ORT's transformer fusions before the int8 pass (models/fusion.py): fewer,
    # larger ops, which is what one short query pays for. Tried first; the
    # unfused graph is the fallback if the fused one misses parity.
    fuse: bool = False
    # 7 (onnxruntime's reduce_range): int16 sums on a CPU without VNNI cannot
    # overflow. 8 only to measure what that costs or buys.
    weight_bits: int = 7


def torch_outputs(model: DualEncoder, tokenizer: Tokenizer, texts: list[str]) -> list[np.ndarray]:
    """[N, D] context vectors, then [N, m, D] poly vectors if the model has a poly head."""
    tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")
    encodings = tokenizer.encode_batch(texts)
    ids = torch.tensor([e.ids for e in encodings])  # [N, T]
    mask = torch.tensor([e.attention_mask for e in encodings])  # [N, T]
    with torch.no_grad():
        outputs = model(ids, mask)
    return [outputs[0].numpy()] + [o.numpy() for o in outputs[2:]]


def export_onnx(model: DualEncoder, path: Path) -> None:
    ids = torch.ones(2, 8, dtype=torch.long)  # [B, T] dummy; both axes are dynamic
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[1, 5:] = 0  # a padded row, so no branch on "no padding" is traced in
    outputs = [OUTPUT_NAMES["context"], OUTPUT_NAMES["reply"]]
    if model.poly_head is not None:
        outputs.append(POLY_OUTPUT)
    dynamic = {"input_ids": {0: "batch", 1: "sequence"}, "attention_mask": {0: "batch", 1: "sequence"}}
    for name in outputs:
        dynamic[name] = {0: "batch"}
    torch.onnx.export(
        model,
        (ids, mask),
        str(path),
        input_names=["input_ids", "attention_mask"],
        output_names=outputs,
        dynamic_axes=dynamic,
        opset_version=ONNX_OPSET,
        dynamo=False,
    )


def ffn_down_projections(onnx_path: Path) -> list[str]:
    import onnx

    graph = onnx.load(str(onnx_path), load_external_data=False).graph
    return [
        n.name for n in graph.node if n.op_type == "MatMul" and "/output/dense" in n.name and "attention" not in n.name
    ]


def layer_of(node_name: str) -> int:
    """The transformer layer a BertModel graph's node sits in ("/body/encoder/layer.7/output/dense/MatMul" -> 7)."""
    return int(node_name.split("layer.")[1].split("/")[0])


def store_fp16(onnx_path: Path) -> int:
    """Stores every fp32 MatMul weight of the graph (those quantize_int8 kept) as fp16 behind a Cast to fp32,
    and returns how many. Half the bytes; onnxruntime folds the Cast at load, so they run in fp32 and
    their input activations are not quantized, as with fp32 weights."""
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(onnx_path))
    weights = {i.name: i for i in model.graph.initializer}
    casts = []
    for node in model.graph.node:
        weight = weights.get(node.input[1]) if node.op_type == "MatMul" else None
        if weight is None or weight.data_type != onnx.TensorProto.FLOAT:
            continue
        half = numpy_helper.from_array(numpy_helper.to_array(weight).astype(np.float16), f"{weight.name}_fp16")
        model.graph.initializer.remove(weight)
        model.graph.initializer.append(half)
        casts.append(helper.make_node("Cast", [half.name], [weight.name], to=onnx.TensorProto.FLOAT))
    for cast in casts:
        model.graph.node.insert(0, cast)  # before its MatMul: the graph stays topologically sorted
    onnx.save(model, str(onnx_path))
    return len(casts)


def quantize_int8(fp32_path: Path, int8_path: Path, keep_fp32: list[str], reduce_range: bool = True) -> None:
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    # Per-channel weights: per-tensor scales lose ~5 points of cosine on
    # MiniLM (mean parity 0.947 vs 0.989 measured on the corpus sample).
    quantize_dynamic(
        str(fp32_path),
        str(int8_path),
        weight_type=QuantType.QInt8,
        per_channel=True,
        # 7-bit weights. Without VNNI (AVX2 only, e.g. AMD Zen 3), onnxruntime's u8 x s8
        # kernel sums pairs of products into int16, which saturates on large activations.
        # Multilingual e5 on such a CPU: parity min 0.976 -> 0.985; Korean through the API
        # R@1 0.206 -> 0.222, R@10 0.475 -> 0.497 (docs/experiments.md, findings behind settings that ship).
        # onnxruntime's own guidance for non-VNNI CPUs; a CPU with VNNI loses one bit.
        reduce_range=reduce_range,
        nodes_to_exclude=keep_fp32,
        # ONNX shape inference knows no types for the contrib ops of a fused
        # graph (models/fusion.py); every tensor in these encoders is float.
        extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
    )


def export_bundle(model: DualEncoder, config: ExportConfig, bundles_root: Path, parity_texts: list[str]) -> Path:
    """Writes bundles_root/config.name and returns its path. Raises if parity fails."""
    started = time.perf_counter()
    model = model.eval()
    final = bundles_root / config.name
    with staged_dir(final) as staging:
        fp32 = staging / "encoder.fp32.onnx"
        if (model.poly_head is None) != (config.poly is None):
            raise ValueError(f"{config.name}: model poly head and config.poly must come together")
        export_onnx(model, fp32)
        shutil.copy(config.tokenizer_path, staging / TOKENIZER_FILE)
        if config.reactions is not None:
            config.reactions.save(staging / REACTIONS_FILE)
        layers = int(model.body.config.num_hidden_layers)
        fused = staging / "encoder.fused.onnx"
        if config.fuse:
            fusions = fuse_bert(fp32, fused, model.body.config.num_attention_heads, model.dim, layers)
            print(f"[export] fused {fusions}")
        if not config.quantize:
            (fused if config.fuse else fp32).rename(staging / ENCODER_FILE)
            manifest = _manifest(model, config, staging, "fused, none" if config.fuse else "none")
            manifest.parity = check_parity(model, staging, manifest, parity_texts, config.min_parity_cosine)
        else:
            # Full int8 first; if it misses parity, keep the FFN down-projections
            # (they see the GELU outliers) in fp32: +0.004 mean cosine for ~0.3 ms.
            # Fused graphs, where asked, before unfused ones: fewer ops is what one query pays for.
            attempts = [
                ("int8-dynamic-per-channel", fp32, []),
                ("int8-dynamic-per-channel, ffn-down fp32", fp32, ffn_down_projections(fp32)),
            ]
            if config.fuse:
                attempts.insert(0, ("fused, int8-dynamic-per-channel", fused, []))
                down = ffn_down_projections(fused)
                if len(down) == layers:  # the fusions keep the FFN's MatMul names; if not, nothing to keep
                    attempts.insert(1, ("fused, int8-dynamic-per-channel, ffn-down fp32", fused, down))
            for label, graph, keep_fp32 in attempts:
                quantize_int8(graph, staging / ENCODER_FILE, keep_fp32, reduce_range=config.weight_bits == 7)
                manifest = _manifest(model, config, staging, label)
                try:
                    manifest.parity = check_parity(model, staging, manifest, parity_texts, config.min_parity_cosine)
                    break
                except ParityError as error:
                    print(f"[export] {label}: {error}")
            else:
                raise ParityError(f"no quantisation of {config.name} reached parity {config.min_parity_cosine}")
        fp32.unlink(missing_ok=True)
        fused.unlink(missing_ok=True)
        write_manifest(staging, manifest)
    print(
        f"[export] {final} ({manifest.quantization}) parity {manifest.parity} in {time.perf_counter() - started:.1f}s"
    )
    return final


def draft_manifest(spec: Any, dim: int, num_layers: int, quantization: str, **fields: Any) -> BundleManifest:
    """A bundle's manifest before its files are sealed: what every recipe's spec (`ExportConfig`,
    models/e5/multilingual.py's `BundleSpec`) names alike, and the recipe's own `fields` beside it."""
    return BundleManifest(
        name=spec.name,
        model_id=spec.model_id,
        kind=spec.kind,
        dim=dim,
        num_layers=num_layers,
        max_context_tokens=spec.max_context_tokens,
        max_reply_tokens=spec.max_reply_tokens,
        max_context_turns=spec.max_context_turns,
        turn_separator=spec.turn_separator,
        quantization=quantization,
        files={},
        checksum="",
        query_prefix=spec.query_prefix,
        passage_prefix=spec.passage_prefix,
        language=spec.language,
        languages=list(spec.languages),
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
        **fields,
    )


def _manifest(model: DualEncoder, config: ExportConfig, staging: Path, quantization: str) -> BundleManifest:
    draft = draft_manifest(
        config,
        model.dim,
        int(model.body.config.num_hidden_layers),
        quantization,
        thresholds=config.thresholds,
        poly=config.poly,
        reactions=config.reactions.spec if config.reactions is not None else None,
        eval=dict(config.eval),
        servable=config.servable,
        training={**config.training, "fuse": config.fuse, "weight_bits": config.weight_bits},
        data=dict(config.data),
    )
    return seal(staging, draft)


def check_parity(
    model: DualEncoder, bundle_dir: Path, manifest: BundleManifest, texts: list[str], min_cosine: float
) -> dict[str, float]:
    """Cosine between the served ONNX path (tokenizers + onnxruntime) and torch fp32.

    The gate is on the context vector; the poly vectors' agreement is
    recorded beside it (their effect is measured where it matters, as the
    int8 bundle's rerank R@1 in `make eval`)."""
    encoder = Encoder(bundle_dir, manifest)
    served = encoder.encode_with_poly(texts) if encoder.has_poly else (encoder.encode(texts, side="context"),)
    tokenizer = Tokenizer.from_file(str(bundle_dir / TOKENIZER_FILE))
    tokenizer.enable_truncation(max_length=manifest.max_context_tokens, direction="left")
    reference = torch_outputs(model, tokenizer, [manifest.query_prefix + t for t in texts])  # [N, D], [N, m, D]
    cosines = (served[0] * reference[0]).sum(axis=1)  # [N]; both sides are unit vectors
    result = {"mean_cosine": round(float(cosines.mean()), 5), "min_cosine": round(float(cosines.min()), 5)}
    if len(served) > 1:
        a, b = served[1].reshape(len(texts), -1), reference[1].reshape(len(texts), -1)  # [N, m*D]
        poly = (a * b).sum(axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))  # [N]
        result["poly_mean_cosine"] = round(float(poly.mean()), 5)
    result["samples"] = len(texts)
    if cosines.mean() < min_cosine or cosines.min() < MIN_SINGLE_COSINE:
        worst = texts[int(cosines.argmin())]
        raise ParityError(f"parity {result} below mean {min_cosine} / min {MIN_SINGLE_COSINE} (worst: {worst!r})")
    return result


def parity_sample(n: int = 256, seed: int = 13) -> list[str]:
    """A fixed sample of corpus turns: same seed, same sentences, every build."""
    from index.corpus import load_conversations

    turns = sorted({t for c in load_conversations() for t in c.turns})
    rng = np.random.default_rng(seed)
    return [turns[i] for i in rng.choice(len(turns), size=n, replace=False)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bundles", type=Path, default=Path("artifacts/bundles"))
    parser.add_argument("--name", default="minilm-l6-zeroshot-int8")
    parser.add_argument("--fp32", action="store_true", help="skip int8 quantisation")
    parser.add_argument("--if-missing", action="store_true", help="do nothing if the bundle exists")
    args = parser.parse_args()
    if args.if_missing and (args.bundles / args.name / MANIFEST).is_file():
        print(f"[export] {args.bundles / args.name} exists; skipping")
        return
    torch.set_num_threads(max(1, torch.get_num_threads()))
    config = ExportConfig(
        name=args.name,
        model_id="sentence-transformers/all-MiniLM-L6-v2",
        kind="zero-shot",
        tokenizer_path=minilm_path() / TOKENIZER_FILE,
        quantize=not args.fp32,
        servable=not args.fp32,  # the fp32 export is the latency baseline, not for serving
    )
    export_bundle(load_pretrained(), config, args.bundles, parity_sample())


if __name__ == "__main__":
    main()


def export_with_reactions(
    model: DualEncoder, config: ExportConfig, bundles: Path, korean_replies: list[str]
) -> tuple[Path, dict[str, Any]]:
    """The int8 bundle, parity-gated on English turns and 64 of `korean_replies`, with the
    reaction model (models/reactions/head.py); returns it and the reaction recipe's record."""
    from models.reactions.head import install, train_reactions

    rng = np.random.default_rng(13)
    korean = [korean_replies[i] for i in rng.choice(len(korean_replies), 64, replace=False)]
    # Short enough that no text is cut: the reference does not cut as the served encoder does (after the prefix).
    parity = [t for t in parity_sample() if len(t) <= 200] + korean
    bundle = export_bundle(model, config, bundles, parity)
    # The reaction classifier learns from the vectors the bundle serves: int8, through onnxruntime.
    reactions, stats = train_reactions(Encoder(bundle, read_manifest(bundle)))
    install(bundle, reactions, stats)
    return bundle, stats
