#!/usr/bin/env bash
# Reproduce results/real_model_tied/: SmolLM2-135M shrunk with its head kept tied, the final gain's outlying
# coordinates kept as rows of T (--tie_keep). See scripts/real_tied_head.py.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}  # one thread per run: the same numbers whatever the machine's load (README)
python scripts/real_tied_head.py "$@"
