#!/usr/bin/env bash
# Reproduce results/real_model_gpu/ on one CUDA GPU: SmolLM2-135M shrunk to −50% parameters (head tied) and
# distilled from the original for as many steps as --budget_s holds (at most 50 M tokens), against its control.
# Other options write their own folder, results/real_model_gpu_<what>: --start=learned (the arms start from the
# learned map) adds _learned, --width=432 (−25%) _m432, --text=mix (calibrated and distilled on the mix) _mix,
# --teacher_tokens=N (N > 0: the original's continuations after the train split) _teacher, in that order.
# See scripts/real_distill_gpu.py. The GGUF is fetched and the texts are tokenized as for the CPU rows.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}  # the same tokens and cache keys as the CPU experiments (README)
learned="" m432="" mix="" teacher=""
for arg in "$@"; do
    case $arg in
        --start=learned) learned=_learned ;;
        --width=432) m432=_m432 ;;
        --text=mix) mix=_mix ;;
        --teacher_tokens=0) ;;
        --teacher_tokens=*) teacher=_teacher ;;
    esac
done
out=results/real_model_gpu$learned$m432$mix$teacher
data=$(TEXTS="shakespeare novel${mix:+ mix}" python - <<'PY'
import os
import sys

sys.path[:0] = ["scripts", "."]
import real_model  # noqa: E402

src, _ = real_model.imported()  # fetch.py --what=smollm2, imported as our checkpoint
folder = os.path.join("runs", "real_distill_gpu_data")
os.makedirs(folder, exist_ok=True)
for text in os.environ["TEXTS"].split():
    link = os.path.join(folder, text)
    if not os.path.islink(link):
        os.symlink(os.path.abspath(real_model.prepared(src, text)), link)
print(folder)
PY
)
gguf=$(python -c 'from fetch import SMOLLM2_GGUF, cache_path; print(cache_path(SMOLLM2_GGUF))')
python scripts/real_distill_gpu.py --gguf="$gguf" --data="$data" --out="$out" "$@"
