#!/usr/bin/env bash
# The README's worked example, with the CLIs a user would type:
# train → transform (shrink to m/d = 0.5 with PCA, head porting) → finetune 200 steps → geometry eval.
# Writes runs/worked_example/* (checkpoints) and results/worked_example/ (JSON + PNG).
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in -h|--help) sed -n '2,4p' "$0" | sed 's/^# //'; exit 0;; esac
export WANDB_MODE=${WANDB_MODE:-offline}
runs=runs/worked_example
out=results/worked_example
mkdir -p "$runs" "$out"
# a base run that was interrupted (Ctrl-C: exit 130, checkpoint marked incomplete) is trained again, not reused
python checkpoint.py "$runs/base" || python train.py configs/shakespeare_char.py --out_dir="$runs/base" \
  --progress_bar=False --overwrite=True
python transform.py --in_dir="$runs/base" --out_dir="$runs/m64" --width=64 --kind=pca --porting=residual --norms=fold \
  --overwrite=True
python finetune.py --in_dir="$runs/m64" --out_dir="$runs/m64-ft" --max_iters=200 --progress_bar=False --overwrite=True
python eval_geometry.py --ref_dir="$runs/base" --in_dir="$runs/m64" --out_dir="$out/zero_shot" --wandb_log=False
python eval_geometry.py --ref_dir="$runs/base" --in_dir="$runs/m64-ft" --out_dir="$out/finetuned" --wandb_log=False
cp "$runs/m64-ft/finetune.json" "$out/finetune.json"
python - "$runs" "$out" <<'PY'
import json, sys, torch
runs, out = sys.argv[1], sys.argv[2]
record = torch.load(f"{runs}/m64/ckpt.pt", weights_only=False)["transform"]
summary = {k: v for k, v in record.items() if k not in ("T", "T_pinv")}
json.dump({"transform": summary}, open(f"{out}/transform.json", "w"), indent=2)
PY
echo "results in $out"
