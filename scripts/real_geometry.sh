#!/usr/bin/env bash
# Reproduce results/real_model_geometry/eval_geometry*: eval_geometry.py on SmolLM2-135M alone, against its PCA
# shrink (m = 432) and against its Hadamard rotation (m = 576). See scripts/real_geometry.py.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}  # one thread per run: the same numbers whatever the machine's load
python scripts/real_geometry.py "$@"
