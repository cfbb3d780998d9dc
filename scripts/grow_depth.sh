#!/usr/bin/env bash
# Reproduce results/grow_depth/: half-depth stage 1 → transform.py --n_layer → continued, against scratch.
# QUICK=1 (or --quick): CPU sizes. See scripts/grow_depth.py for what it runs.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}  # one thread per run: the same numbers whatever the machine's load (README)
python scripts/experiments.py grow_depth "$@"
