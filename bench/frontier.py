"""The quality/speed frontier of encoder bundles: layers x vocabulary x bits, with
what each costs on this CPU and how it ranks, in one run.

    python -m bench.frontier [--ood reports/ood.json ...] BUNDLE [BUNDLE ...]

For each bundle: its layers, vocabulary and weight precision (from the
manifest and the graph), its size, the context encoder's single-query p50
and batched ms a text on this CPU, and R@1 on 1,000 chitchat validation
examples (1-of-100: our own split, never a gate). Out-of-domain figures are
read from `bench.ood` reports (`--ood`, repeatable; rows matched by bundle name), not
measured here. Writes reports/frontier.{md,json}.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import onnx

from bench.latency import cpu_description
from bench.reports import write
from core.bundle import ENCODER_FILE, open_bundle
from core.encoder import Encoder
from models.evalset import eval_set
from models.tables.retrieval import bundle_figures, latency

OOD_COLUMNS = {  # bench.ood set -> (report column, the row's field)
    "chatterbot-en": ("chatterbot EN R@1", "r_at_1"),
    "chatterbot-ko": ("chatterbot KO R@1", "r_at_1"),
    "sts15_headlines": ("STS-15 headlines", "spearman"),
    "sts15_images": ("STS-15 images", "spearman"),
    "korsts_dev": ("KorSTS dev", "spearman"),
}


def architecture(bundle: Path) -> dict[str, Any]:
    """Layers, vocabulary rows and weight types, read off the ONNX graph itself."""
    graph = onnx.load(str(bundle / ENCODER_FILE), load_external_data=False).graph
    # A fused graph has one (Q)Attention node a layer; an unfused one a Softmax
    # under each layer's attention (a poly head has its own, outside the layers).
    fused = sum(n.op_type in ("Attention", "QAttention") for n in graph.node)
    unfused = sum(n.op_type == "Softmax" and "/encoder/layer" in n.name for n in graph.node)
    layers = fused or unfused
    types = {onnx.TensorProto.DataType.Name(t.data_type) for t in graph.initializer if len(t.dims) == 2}
    vocab = max((t.dims[0] for t in graph.initializer if len(t.dims) == 2), default=0)
    return {"layers": layers, "vocabulary": int(vocab), "matrix_types": sorted(types)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("bundles", type=Path, nargs="+")
    parser.add_argument("--ood", type=Path, action="append", help="bench.ood reports (default: reports/ood.json)")
    parser.add_argument("--examples", type=int, default=1000)
    parser.add_argument("--out", type=Path, default=Path("reports/frontier"))
    args = parser.parse_args()
    reports = args.ood or [Path("reports/ood.json")]
    ood = [row for path in reports if path.is_file() for row in json.loads(path.read_text())]
    data = eval_set(args.examples, 0, split="validation")
    cpu = cpu_description()
    rows = []
    for bundle in args.bundles:
        manifest = open_bundle(bundle)
        encoder = Encoder(bundle, manifest)
        row: dict[str, Any] = {
            "bundle": manifest.name,
            **architecture(bundle),
            "quantization": manifest.quantization,
            "mib": round(sum(f.stat().st_size for f in bundle.iterdir() if f.is_file()) / 2**20, 1),
            **latency(encoder, data),
            "chitchat_val_r_at_1": bundle_figures(encoder, data, 50)["r_at_1"],
            "cpu": cpu,
        }
        for r in ood:
            if r.get("bundle") == manifest.name and r.get("set") in OOD_COLUMNS:
                row[r["set"]] = r.get(OOD_COLUMNS[r["set"]][1])
        rows.append(row)
        print(json.dumps(row), flush=True)
    head = ["bundle", "layers", "vocabulary", "weights", "MiB", "single p50 ms", "batched ms/text", "chitchat val R@1"]
    head += [column for column, _ in OOD_COLUMNS.values()]
    sources = ", ".join(f"`{p}`" for p in reports)
    lines = [
        f"Encoder bundles on {cpu} (`python -m bench.frontier`). Latency: the context encoder alone; "
        f"chitchat: 1-of-100 on {args.examples} validation examples; out-of-domain columns from {sources}.",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for r in rows:
        cells = [r["bundle"], r["layers"], r["vocabulary"], r["quantization"], r["mib"], r["single_p50_ms"]]
        cells += [r["batched_ms_per_text"], r["chitchat_val_r_at_1"], *(r.get(s, "") for s in OOD_COLUMNS)]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    write(args.out, {"cpu": cpu, "rows": rows}, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
