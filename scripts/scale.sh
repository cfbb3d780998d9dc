#!/usr/bin/env bash
# Reproduce results/scale/: every headline finding across base widths d. QUICK=1 (or --quick): 4-layer char models
# d = 64…512 and BPE d = 128, 256 on tinyshakespeare (CPU); default: 12-layer GPT-2-small shapes d = 256…1024 on
# OpenWebText (GPU; python data/openwebtext/prepare.py first). See scripts/scale.py.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}  # one thread per run: the same numbers whatever the machine's load (README)
python scripts/experiments.py scale "$@"
