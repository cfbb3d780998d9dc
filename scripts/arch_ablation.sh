#!/usr/bin/env bash
# Reproduce results/arch_ablation/: train → transform → finetune → eval. QUICK=1 (or --quick): CPU sizes.
# See scripts/experiments.py (arch_ablation) for what it runs.
set -euo pipefail
cd "$(dirname "$0")/.."
python scripts/experiments.py arch_ablation "$@"
