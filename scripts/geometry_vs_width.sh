#!/usr/bin/env bash
# Reproduce results/geometry_vs_width/: train → transform → finetune → eval. QUICK=1 (or --quick): CPU sizes.
# See scripts/geometry_vs_width.py for what it runs.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}  # one thread per run: the same numbers whatever the machine's load (README)
python scripts/experiments.py geometry_vs_width "$@"
