#!/usr/bin/env bash
# Reproduce results/quant_frontier/: SmolLM2-135M and our −25% / −50% models quantized by llama.cpp's own quantizer,
# their loss from llama.cpp's logits (two processes, one per core, sharing the cache), then every point's speed on
# the whole (otherwise idle) machine. Needs llama-cpp-python (pip install llama-cpp-python) and the protocol's runs
# (scripts/protocol.sh builds them; missing ones are built here). See scripts/quant_frontier.py.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
python scripts/quant_frontier.py --part=loss --points_first &
python scripts/quant_frontier.py --part=loss
wait
python scripts/quant_frontier.py --part=speed
