#!/usr/bin/env bash
# Reproduce results/shrink_vs_scratch/: the recommended shrink vs the small model from scratch at equal total compute,
# its learning rate swept, n = 3. QUICK=1 (or --quick): CPU sizes. See scripts/shrink_vs_scratch.py for what it runs.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}  # one thread per run: the same numbers whatever the machine's load (README)
python scripts/experiments.py shrink_vs_scratch "$@"
