#!/usr/bin/env bash
# Two live-student recipes on one lent GPU machine (models/live_student.py), sharing
# one teacher tune, packed so that what comes back fits the device tool's limits
# (at most 8 files of 16 MiB): each student's tensors travel as int8 rows
# (models/pack.py's to_int8; models/live_export.py reads them as it reads fp16).
#
#   bash models/live_gpu.sh artifacts/pack "$OUT"      # on the GPU machine, the pack carried
#   cat OUT/live.tar.* | tar x -C artifacts            # here: artifacts/live-a, artifacts/live-b
#   PYTHON=.venv/bin/python DEVICE=cpu STEPS=3 TUNE_STEPS=2 ROTATION=64 LAYERS=0,11 bash models/live_gpu.sh artifacts/pack /tmp/o
#                                                      # a smoke run of the same script on the CPU
#
# Both recipes: English targets are rotated MiniLM alone, Korean the tuned e5's.
# a: the chitchat task at weight TASK_A (0.25); b: at TASK_B (1, as runs 1 and 2; empty: no b).
# LR sets both students' peak learning rate (LiveConfig.lr: 1e-4).
set -uo pipefail

pack=${1:-artifacts/pack}
out=${2:-artifacts/live-gpu}
layers=${LAYERS:-0,1,2,3,5,7,9,10,11}
budget=${BUDGET_S:-190}  # each student's seconds; the teacher tune takes TUNE_S more
work=$(mktemp -d)
mkdir -p "$out" "$work/live-a" "$work/live-b"
export PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
common=(--pack "$pack" --device "${DEVICE:-cuda}" --english-targets minilm --broad-batch "${BROAD:-512}"
    ${STEPS:+--steps "$STEPS"} ${ROTATION:+--rotation-texts "$ROTATION"} ${LR:+--lr "$LR"})

# Whatever finished travels, even when a later stage failed.
finish() {
    for run in live-a live-b; do
        for student in "$work/$run"/student-l*.npz; do
            [ -f "$student" ] || continue
            "$py" -c "import sys, numpy as np; from models.pack import to_int8
np.savez(sys.argv[1], **to_int8({k: v.astype(np.float32) for k, v in np.load(sys.argv[1]).items()}))" "$student"
        done
        # Checkpoints (no resume outlives the machine) and the teacher's layers (the 12-layer
        # build of a tuned teacher was judged in run 1) stay behind: 64 MiB come back at most.
        rm -f "$work/$run"/*.pt "$work/$run/teacher-layers.npz"
    done
    tar cf - -C "$work" live-a live-b | split -b 15M - "$out/live.tar."
    ls -la "$out"
}
trap finish EXIT

[ "${DEVICE:-cuda}" = cpu ] || nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
"$py" -m models.live_student "${common[@]}" --work "$work/live-a" --tune-teacher --tune-budget-s "${TUNE_S:-30}" \
    ${TUNE_STEPS:+--tune-steps "$TUNE_STEPS"} \
    --task-weight "${TASK_A:-0.25}" --student "$layers:$budget" 2>&1 | tee "$out/live-a.log" || exit 1
[ -f "$work/live-a/teacher-layers.npz" ] || exit 1
[ -n "${TASK_B-1}" ] || exit 0  # TASK_B= (empty): recipe a alone
"$py" -m models.live_student "${common[@]}" --work "$work/live-b" --teacher-layers "$work/live-a/teacher-layers.npz" \
    --task-weight "${TASK_B:-1}" --student "$layers:$budget" 2>&1 | tee "$out/live-b.log"
