#!/usr/bin/env bash
# The README's worked example, with the CLIs a user would type:
# train → transform (shrink to m/d = 0.5 with PCA, residual porting) → finetune 200 steps against a control
# (the untransformed model finetuned with the same recipe) → geometry eval.
# Writes runs/worked_example/* (checkpoints) and results/worked_example/ (JSON + PNG).
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}  # one thread per run: the same numbers whatever the machine's load (README)
case "${1:-}" in -h|--help) sed -n '2,4p' "$0" | sed 's/^# //'; exit 0;; esac
export WANDB_MODE=${WANDB_MODE:-offline}
runs=runs/worked_example
out=results/worked_example
mkdir -p "$runs" "$out"
# a base run that was interrupted (Ctrl-C: exit 130, checkpoint marked incomplete) is trained again, not reused
python -m lgpt.plumbing.checkpoint "$runs/base" || python train.py configs/shakespeare_char.py --out_dir="$runs/base" \
  --progress_bar=False --overwrite=True
python transform.py --in_dir="$runs/base" --out_dir="$runs/m64" --width=64 --kind=pca --porting=residual --norms=fold \
  --overwrite=True
# the control: the untransformed model in the transform's canonical form (T = I, width d = 128), same recipe
python transform.py --in_dir="$runs/base" --out_dir="$runs/canonical" --width=128 --kind=truncate --porting=residual \
  --norms=fold --eval_iters=0 --overwrite=True
recipe=(--max_iters=200 --eval_interval=10 --eval_iters=20 --eval_seed=0 --progress_bar=False --overwrite=True)
python finetune.py --in_dir="$runs/canonical" --out_dir="$runs/control" "${recipe[@]}"
python finetune.py --in_dir="$runs/m64" --out_dir="$runs/m64-ft" --control_dir="$runs/control" "${recipe[@]}"
python eval_geometry.py --ref_dir="$runs/base" --in_dir="$runs/m64" --out_dir="$out/zero_shot" --wandb_log=False
python eval_geometry.py --ref_dir="$runs/base" --in_dir="$runs/m64-ft" --out_dir="$out/finetuned" --wandb_log=False
cp "$runs/m64-ft/finetune.json" "$out/finetune.json"
cp "$runs/control/finetune.json" "$out/control.json"
python - "$runs" "$out" <<'PY'
import json, sys
from lgpt.plumbing.checkpoint import read_checkpoint_file  # weights only: nothing in the file runs
runs, out = sys.argv[1], sys.argv[2]
record = read_checkpoint_file(f"{runs}/m64/ckpt.pt")["transform"]
summary = {k: v for k, v in record.items() if k not in ("T", "T_pinv")}
json.dump({"transform": summary}, open(f"{out}/transform.json", "w"), indent=2)
PY
echo "results in $out"
