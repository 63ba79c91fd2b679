"""Teacher -> teacher vectors -> student with poly head -> reactions -> bundles.

    python -m models.train --profile full     # the release run: ~2 h on 2 CPU cores
    python -m models.train --profile quick    # a smoke run on the real corpus, minutes
    python -m models.train --device cuda      # same stages, same bundles, on a GPU

Each stage is a file of its own: `teacher.py`, `teacher_vectors.py`,
`distill.py` (student and poly head), `reactions.py`, `export.py`. Stages run
a fixed number of steps from a fixed seed. Progress is checkpointed under
artifacts/checkpoints/<profile>/: rerunning the command skips finished
stages and resumes the one in progress where it stopped. `--restart`
starts over.

`make train-minilm` runs this, then builds the student's index and
calibrates it (`models/calibrate.py`). `make train` and `make release` act on
the multilingual student instead; docs/training.md has the commands that
evaluate and release this one.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import time
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

from core.bundle import TOKENIZER_FILE, PolySpec
from index.corpus import split_summary
from models import teacher_vectors
from models.batches import Tokenise
from models.config import PROFILES, TrainConfig
from models.dataset import TURN_SEPARATOR, train_pairs
from models.distill import make_student, rows_seen, student_plan, train_student
from models.encoder import DualEncoder, load_pretrained, minilm_path
from models.evalset import eval_set
from models.export import ExportConfig, export_bundle, parity_sample
from models.reactions import train_reactions
from models.teacher import train_teacher
from models.validate import validate

STATE_FILE = "state.json"


def log(message: str) -> None:
    print(f"[train] {message}", file=sys.stderr, flush=True)


def cpu_name() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    for line in cpuinfo.read_text().splitlines() if cpuinfo.is_file() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def hardware(device: str) -> dict[str, Any]:
    info: dict[str, Any] = {"device": device, "cpu": cpu_name(), "cores": os.cpu_count()}
    info["torch_threads"] = torch.get_num_threads()
    if device.startswith("cuda") and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
    return info


class Progress:
    """Which stages are done, and their figures, in checkpoints/<profile>/state.json."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.path = directory / STATE_FILE
        self.stages: dict[str, dict[str, Any]] = json.loads(self.path.read_text()) if self.path.is_file() else {}

    def done(self, stage: str) -> bool:
        return stage in self.stages

    def finish(self, stage: str, stats: dict[str, Any]) -> None:
        self.stages[stage] = stats
        self.directory.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.stages, indent=2))
        tmp.replace(self.path)
        log(f"{stage} done: {stats}")


@dataclass
class Outputs:
    bundles: list[Path]
    stats: dict[str, dict[str, Any]]


def _load(model: DualEncoder, checkpoint: Path) -> DualEncoder:
    model.load_state_dict(torch.load(checkpoint, weights_only=False)["modules"]["model"])
    return model.eval()


def run(
    cfg: TrainConfig,
    artifacts: Path,
    teacher: DualEncoder,
    tokenizer_path: Path,
    model_id: str,
    data_path: Path | None = None,
    parity_texts: list[str] | None = None,
    min_parity_cosine: float = 0.99,
    prefix: str = "chitchat",
    device: str = "cpu",
) -> Outputs:
    torch.manual_seed(cfg.seed)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    bundles_root = artifacts / "bundles"
    progress = Progress(artifacts / "checkpoints" / cfg.profile)
    ckpt = progress.directory
    started = time.perf_counter()
    tok = Tokenise(tokenizer_path, cfg.max_context_tokens, cfg.max_reply_tokens)
    pairs = train_pairs(cfg.max_context_turns, data_path)
    val = eval_set(cfg.validation_examples, cfg.seed, "validation", data_path)
    parity_texts = parity_texts or parity_sample()
    data = split_summary(data_path)
    log(f"{len(pairs)} train pairs loaded in {time.perf_counter() - started:.1f}s; split {data['split_sha256'][:12]}")

    def export(model: DualEncoder, role: str, quantize: bool, servable: bool, **extra: Any) -> Path:
        layers = int(model.body.config.num_hidden_layers)
        config = ExportConfig(
            name=f"{prefix}-{role}-l{layers}-{'int8' if quantize else 'fp32'}",
            model_id=f"{model_id} ({role}, {cfg.profile} profile)",
            kind=role,
            tokenizer_path=tokenizer_path,
            max_context_tokens=cfg.max_context_tokens,
            max_reply_tokens=cfg.max_reply_tokens,
            max_context_turns=cfg.max_context_turns,
            turn_separator=TURN_SEPARATOR,
            quantize=quantize,
            min_parity_cosine=min_parity_cosine,
            servable=servable,
            training=training_record(cfg, progress.stages, device),
            data=data,
            **extra,
        )
        return export_bundle(model.cpu(), config, bundles_root, parity_texts)

    # 1. The teacher, then its bundles: the int8 one encodes the teacher vectors.
    teacher_ckpt = ckpt / "teacher.pt"
    if not progress.done("teacher"):
        stats = train_teacher(teacher, pairs, tok, cfg, teacher_ckpt, device)
        progress.finish("teacher", {**stats, **validate(teacher, tok, val, cfg.max_context_turns, cfg.rerank_depth)})
    if teacher.context_head is None:
        teacher.add_heads()
    _load(teacher.cpu(), teacher_ckpt)
    teacher_int8 = bundles_root / f"{prefix}-teacher-l{teacher.body.config.num_hidden_layers}-int8"
    if not progress.done("teacher_bundles"):
        t0 = time.perf_counter()
        export(teacher, "teacher", quantize=False, servable=False)
        export(teacher, "teacher", quantize=True, servable=False)
        progress.finish("teacher_bundles", {"seconds": round(time.perf_counter() - t0, 1)})

    # 2. The teacher's vectors for every pair, once.
    vectors_path = ckpt / "teacher_vectors.npz"
    if not progress.done("teacher_vectors"):
        t0 = time.perf_counter()
        rows = rows_seen(*student_plan(pairs, cfg))
        teacher_vectors.compute(teacher_int8, pairs, rows).save(vectors_path)
        progress.finish("teacher_vectors", {"seconds": round(time.perf_counter() - t0, 1), "pairs": len(rows)})

    # 3. The student and its poly head, distilled from those vectors.
    student = make_student(teacher, cfg)
    student_ckpt = ckpt / "student.pt"
    if not progress.done("student"):
        vectors = teacher_vectors.TeacherVectors.load(vectors_path)
        stats = train_student(student, vectors, pairs, tok, cfg, student_ckpt, device)
        progress.finish("student", {**stats, **validate(student, tok, val, cfg.max_context_turns, cfg.rerank_depth)})
    _load(student.cpu(), student_ckpt)

    # 4. Reactions, then the student's bundles, which carry the head and the classifier.
    t0 = time.perf_counter()
    reactions, stats = train_reactions(student, pairs, tok, "cpu")
    progress.finish("reactions", {**stats, "seconds": round(time.perf_counter() - t0, 1)})
    assert student.poly_head is not None
    head = PolySpec(codes=student.poly_head.num_codes, weight=round(float(student.poly_head.weight.item()), 6))
    t0 = time.perf_counter()
    bundles = [
        export(student, "student", quantize=False, servable=False, poly=head, reactions=reactions),
        export(student, "student", quantize=True, servable=True, poly=head, reactions=reactions),
    ]
    progress.finish("student_bundles", {"seconds": round(time.perf_counter() - t0, 1)})
    bundles[:0] = [teacher_int8.with_name(teacher_int8.name.replace("int8", "fp32")), teacher_int8]
    log(f"done in {time.perf_counter() - started:.0f}s this run; stages: {json.dumps(progress.stages)}")
    return Outputs(bundles, progress.stages)


def training_record(cfg: TrainConfig, stages: dict[str, dict[str, Any]], device: str) -> dict[str, Any]:
    """What a bundle's manifest says about how it was trained."""
    return {
        "profile": cfg.profile,
        "config": asdict(cfg),
        "stages": dict(stages),
        "seconds_total": round(sum(float(s.get("seconds", 0)) for s in stages.values()), 1),
        "hardware": hardware(device),
        "recorded_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", choices=sorted(PROFILES), default="quick")
    parser.add_argument("--artifacts", type=Path, default=Path("artifacts"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu", help="torch device for training, e.g. cuda")
    parser.add_argument("--restart", action="store_true", help="drop this profile's checkpoints first")
    args = parser.parse_args()
    cfg = replace(PROFILES[args.profile], seed=args.seed)
    if args.restart:
        shutil.rmtree(args.artifacts / "checkpoints" / cfg.profile, ignore_errors=True)
    log(f"profile {cfg.profile}: {asdict(cfg)}")
    model_id = "sentence-transformers/all-MiniLM-L6-v2"
    run(cfg, args.artifacts, load_pretrained(), minilm_path() / TOKENIZER_FILE, model_id, device=args.device)


if __name__ == "__main__":
    main()
