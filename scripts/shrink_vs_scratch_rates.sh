#!/usr/bin/env bash
# Reproduce results/shrink_vs_scratch_rates/: the shrink against the small model from scratch with the same
# learning-rate sweep for the original and the small model, chosen on dev, read on test (issue #70), n = 3.
# QUICK=1 (or --quick): CPU sizes. See shrink_vs_scratch_rates in scripts/shrink_vs_scratch.py for what it runs.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}  # one thread per run: the same numbers whatever the machine's load (README)
python scripts/experiments.py shrink_vs_scratch_rates "$@"
