#!/usr/bin/env bash
# Reproduce results/real_model_hybrid/: SmolLM2-135M shrunk by per-block maps shared by runs of sites (--map_groups).
# See scripts/real_hybrid.py.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}  # one thread per run: the same numbers whatever the machine's load (README)
python scripts/real_hybrid.py "$@"
