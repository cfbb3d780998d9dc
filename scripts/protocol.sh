#!/usr/bin/env bash
# Reproduce results/protocol/: SmolLM2-135M's chosen recipes on the three-split protocol — seed 0 of every recipe
# (the headline), then seeds 1 and 2 (the draws), then the general case by leaving one text out — each part as two
# processes sharing the cache. See scripts/protocol.py.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}  # one thread per run: the same numbers whatever the machine's load (README)
for part in ${1:-headline draws loto slicegpt}; do
    python scripts/protocol.py --part="$part" --reverse &
    python scripts/protocol.py --part="$part"
    wait
done
