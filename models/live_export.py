"""A bundle from a models.live_student run: the pack's embeddings under the
run's tensors, exported int8 and parity-gated, with the reaction classifier
fitted on its own served vectors.

    python -m models.live_export --run artifacts/live-student --layers 0,1,2,3,5,7,9,10,11

A run that tuned the teacher also left its layers (`teacher-layers.npz`);
`--teacher-out DIR` writes them as a tune output folder that
models.multilingual and models.multilingual_release read.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from dataclasses import asdict
from pathlib import Path

from index.corpus import split_summary
from models.dataset import TrainPairs
from models.e5_student import export_student
from models.export import ExportConfig
from models.live_student import RUN_FILE, TEACHER_FILE, LiveConfig, Pack, load_student, student_file
from models.multilingual_tune import FIGURES_FILE
from models.pack import STUDENT_TOKENIZER
from models.train import hardware
from models.trained_layers import LAYERS_FILE


def log(message: str) -> None:
    print(f"[live-export] {message}", file=sys.stderr, flush=True)


def teacher_folder(run: Path, out: Path) -> Path:
    """The run's tuned layers as a tune output folder (layers.npz + figures.json)."""
    out.mkdir(parents=True, exist_ok=True)
    shutil.copy(run / TEACHER_FILE, out / LAYERS_FILE)
    record = json.loads((run / RUN_FILE).read_text())
    tune = record["teacher_tune"]
    figures = {
        "config": tune["config"],
        "pairs_seen": tune["train"]["steps"] * tune["config"]["batch_size"],
        "validation_before": {},
        "validation_after": {},
        "train": {**tune["train"], "device": record["device"]},
    }
    (out / FIGURES_FILE).write_text(json.dumps(figures, indent=2))
    return out


def export(pack_dir: Path, run: Path, layers: tuple[int, ...], bundles: Path, name: str) -> Path:
    started = time.perf_counter()
    pack = Pack(pack_dir)
    record = json.loads((run / RUN_FILE).read_text())
    trained = next(s for s in record["students"] if tuple(s["config"]["layers"]) == layers)
    cfg = LiveConfig(**{**trained["config"], "layers": layers})
    model = load_student(pack, layers, run / student_file(layers))
    config = ExportConfig(
        name=name,
        model_id=f"multilingual-e5-small student, layers {list(layers)} of the tuned teacher, "
        f"{pack.meta['e5_shape']['vocab']} pieces",
        kind="student",
        tokenizer_path=pack_dir / STUDENT_TOKENIZER,
        max_context_tokens=cfg.max_context_tokens,
        max_reply_tokens=cfg.max_reply_tokens,
        max_context_turns=pack.meta["max_context_turns"],
        turn_separator=pack.meta["separator"],
        training={
            "config": asdict(cfg),
            "train": trained["train"],
            "teacher": {**pack.meta["teacher"], "tune": record.get("teacher_tune")},
            "rotation_mean_cosine": record.get("rotation_mean_cosine"),
            "hardware": {"train": record["device"], "export": hardware("cpu")},
        },
        data=split_summary(),
        query_prefix=cfg.prefix,
        passage_prefix=cfg.prefix,
        language="mul",
        languages=["en", "ko"],
        fuse=True,
    )
    english = TrainPairs(pack.texts.english_contexts, pack.texts.english_replies)
    bundle, stats = export_student(model, config, bundles, pack.texts.korean_replies, english)
    log(f"{bundle}: reactions {stats} ({time.perf_counter() - started:.0f}s)")
    return bundle


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pack", type=Path, default=Path("artifacts/pack"))
    parser.add_argument("--run", type=Path, default=Path("artifacts/live-student"))
    parser.add_argument("--layers", default=",".join(map(str, LiveConfig.layers)))
    parser.add_argument("--bundles", type=Path, default=Path("artifacts/bundles"))
    parser.add_argument("--name", default="", help="default: e5-student-l<N>-int8")
    parser.add_argument("--teacher-out", type=Path, default=None, help="also write the run's tuned teacher layers")
    args = parser.parse_args()
    layers = tuple(int(x) for x in args.layers.split(","))
    if args.teacher_out:
        log(f"teacher layers -> {teacher_folder(args.run, args.teacher_out)}")
    print(export(args.pack, args.run, layers, args.bundles, args.name or f"e5-student-l{len(layers)}-int8"))


if __name__ == "__main__":
    main()
