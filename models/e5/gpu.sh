#!/usr/bin/env bash
# The e5 teacher variants, in one call on a lent GPU:
#
#   bash models/e5/gpu.sh OUT_DIR [TEACHER_S]
#
# The student is the CPU's recipe (models/e5/student.py, `make train-student`): it learns the
# default bundle's cached vectors, and needs no GPU.
# It reads only artifacts/e5-pack (`python -m models.e5.pack`, built here first) and the
# image's torch stack. Three teacher variants train side by side (the GPU is far from
# full with one); the one with the best mean R@1 on half A of the human dev sets is
# kept (models/e5/teacher.py: choose). Each stage's outputs are copied to OUT_DIR as soon as they exist, so a run
# cut short still returns what it finished; files over the transfer's 16 MB come in parts
# (`cat NAME.part-* > NAME`).
set -uo pipefail
out=${1:?an output folder}; teacher_s=${2:-170}
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
mkdir -p "$out" artifacts/logs
py=${PYTHON:-python3}
keep() { (cd "$(dirname "$1")" && split -b 15M -d "$(basename "$1")" "$2.part-") && mv "$(dirname "$1")/$2".part-* "$out/"; }
logs() { tar -cf "$out/figures.tar" artifacts/logs artifacts/*/figures.json 2>/dev/null; }

nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
declare -A variants=(
  [teacher-l6]="--trained-layers 6"
  [teacher-l8]="--trained-layers 8"
  [teacher-l6-b128]="--trained-layers 6 --batch-size 128 --lr 6e-5"
)
for name in "${!variants[@]}"; do
  # shellcheck disable=SC2086
  $py -m models.e5.teacher --device cuda --out "artifacts/$name" --budget-s "$teacher_s" ${variants[$name]} \
    > "artifacts/logs/$name.log" 2>&1 &
done
wait
tail -n 3 artifacts/logs/teacher-*.log
best=$($py -m models.e5.teacher --choose artifacts/teacher-l6 artifacts/teacher-l8 artifacts/teacher-l6-b128) || { logs; exit 1; }
echo "chosen teacher: $best"
cp "$best/layers.npz" artifacts/teacher.npz && keep artifacts/teacher.npz teacher.npz
echo "$best" > artifacts/logs/chosen_teacher.txt
logs

ls -la "$out"
