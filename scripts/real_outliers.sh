#!/usr/bin/env bash
# Reproduce results/real_model_outliers/: SmolLM2-135M shrunk to m = 432 with its outlier coordinates kept in or out
# of range(T), with and without a Hadamard rotation after, then quantized. See scripts/real_outliers.py.
# Needs results/real_model_geometry (scripts/real_geometry.sh) for the outlier coordinates.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}  # one thread per run: the same numbers whatever the machine's load (README)
python scripts/real_outliers.py "$@"
