#!/usr/bin/env bash
# Reproduce results/real_model_distill/: SmolLM2-135M shrunk to −25% parameters (head tied), distilled from the
# original, against the original distilled from itself with the identical recipe. See scripts/real_distill.py.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}  # one thread per run: the same numbers whatever the machine's load (README)
python scripts/real_distill.py --reverse "$@" &
python scripts/real_distill.py "$@"
wait
