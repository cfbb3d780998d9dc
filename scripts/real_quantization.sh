#!/usr/bin/env bash
# Reproduce results/real_model_quantization/: SmolLM2-135M rotated at m = d (none / Hadamard / Haar / PCA /
# compressed-tensors' Hadamard), then quantized (W4, W4 g64, W4A4). See scripts/real_quantization.py.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}  # one thread per run: the same numbers whatever the machine's load
python scripts/real_quantization.py "$@"
