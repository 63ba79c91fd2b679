"""ONNX Runtime's transformer fusions on an exported BERT graph, before the int8 pass.

torch's export writes each layer as dozens of small ops (the attention's
reshapes, transposes, softmax and masking; LayerNorm as its arithmetic).
For one short query each op costs more in dispatch than in arithmetic.
ORT's offline optimiser rewrites them into its contrib ops: one
EmbedLayerNormalization for the embeddings, one Attention per layer,
BiasGelu, and LayerNormalization. Dynamic quantisation then makes Attention
a QAttention and the embedding table an int8 QEmbedLayerNormalization, so
the bundle stays as small as before.

Residual + LayerNorm stays two ops, not a SkipLayerNormalization:
onnxruntime 1.32's kernel for it is slower than the pair at one short query
(docs/experiments.md), and the encoder turns off the same fusion
at session load for that reason (core/encoder.py).

EmbedLayerNormalization turns the attention mask into sequence lengths,
which holds for right-padded batches only: the encoder pads on the right
(`core.encoder.pad`), and the builder's parity gate runs padded batches.
"""

from __future__ import annotations

from pathlib import Path


def fuse_bert(src: Path, dst: Path, heads: int, hidden: int, layers: int) -> dict[str, int]:
    """Writes the fused graph of `src` to `dst`; returns the fused-op counts.

    Raises ValueError (writing nothing) unless every layer's attention was
    fused and both of its LayerNorms are single ops: a half-fused graph would
    still be correct, but it would not be what the bundle claims to be.
    """
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    options = FusionOptions("bert")
    options.enable_skip_layer_norm = False
    options.enable_bias_skip_layer_norm = False
    # opt_level 0: only the fusions. Constant folding and the rest are
    # onnxruntime's own session-time optimisations, which still run at load.
    model = optimize_model(
        str(src), model_type="bert", num_heads=heads, hidden_size=hidden, opt_level=0, optimization_options=options
    )
    counts = {op: n for op, n in model.get_fused_operator_statistics().items() if n}
    if counts.get("Attention", 0) != layers or counts.get("LayerNormalization", 0) != 2 * layers:
        expected = f"an Attention and two LayerNormalization in each of {layers} layers"
        raise ValueError(f"{src.name}: fused {counts}, expected {expected}")
    model.save_model_to_file(str(dst))
    return counts
