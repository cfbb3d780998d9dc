#!/usr/bin/env bash
# Reproduce results/grow_recipes/: width-growth recipes (fresh readers, MSG masks, SPARKLING), then the best one at
# another switch point, a 4× horizon, and with depth grown too; n seeds, against both equal-compute baselines.
# QUICK=1 (or --quick): CPU sizes. See scripts/grow_recipes.py for what it runs.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}  # one thread per run: the same numbers whatever the machine's load (README)
python scripts/experiments.py grow_recipes "$@"
