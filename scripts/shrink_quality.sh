#!/usr/bin/env bash
# Reproduce results/shrink_quality/: train → transform with each refit.py correction → zero-shot eval. QUICK=1 (or --quick): CPU sizes.
# See scripts/shrink_quality.py for what it runs.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}  # one thread per run: the same numbers whatever the machine's load (README)
python scripts/experiments.py shrink_quality "$@"
