#!/usr/bin/env bash
# Reproduce results/real_gemma3/: the real Gemma 3 270M grown (zero padding, split, orthogonal) and shrunk (the
# SmolLM2 training-free recipe at −25% and −50% parameters), its peri-LN output gains carried or averaged, on dev.
# See scripts/real_gemma3.py.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}  # one thread per run: the same numbers whatever the machine's load (README)
python scripts/real_gemma3.py --part="${1:-all}"
python scripts/report.py
