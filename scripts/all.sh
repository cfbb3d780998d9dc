#!/usr/bin/env bash
# Every experiment in the order the README's results were made (later ones reuse models that earlier ones
# trained, cached in runs/), then the worked example and the README tables and figures. QUICK=1: CPU sizes.
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in -h|--help) sed -n '2,3p' "$0" | sed 's/^# //'; echo "usage: [QUICK=1] scripts/all.sh [--quick]"; exit 0;; esac
for experiment in ppl_vs_width quantization heatmaps geometry_vs_width arch_ablation heads grow_staging; do
  bash "scripts/$experiment.sh" "$@"
done
bash scripts/worked_example.sh
python scripts/report.py
