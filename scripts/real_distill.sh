#!/usr/bin/env bash
# Reproduce results/real_model_distill/: SmolLM2-135M shrunk to −25% parameters (head tied), distilled from the
# original, against the original distilled from itself with the identical recipe; then the parts that add to it
# (the hidden-state term, the temperature, the learned starts, the general case from the calibration mix, the best
# learned start's data orders, lower rates, the rate decayed to 0, the text's labels in the loss and the mix's data
# orders), each as two processes sharing the cache.
# See scripts/real_distill.py.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}  # one thread per run: the same numbers whatever the machine's load (README)
python scripts/real_distill.py --reverse "$@" &
python scripts/real_distill.py "$@"
wait
if [ $# -eq 0 ]; then  # the whole experiment: the added parts too (a --part given runs that part alone)
    for part in features temperature learned mix learned_draws learned_rates to_zero labels mix_draws; do
        python scripts/real_distill.py --part="$part" --reverse &
        python scripts/real_distill.py --part="$part"
        wait
    done
fi
