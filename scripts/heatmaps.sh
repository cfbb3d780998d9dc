#!/usr/bin/env bash
# Reproduce results/heatmaps/: train → transform → finetune → eval. QUICK=1 (or --quick): CPU sizes.
# See scripts/experiments.py (heatmaps) for what it runs.
set -euo pipefail
cd "$(dirname "$0")/.."
python scripts/experiments.py heatmaps "$@"
