#!/usr/bin/env bash
# Every experiment from an empty (or partial) cache in runs/, then the worked example and the README tables and
# figures. Two lanes, one core each, sharing the work run by run. QUICK=1: CPU sizes.
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in -h|--help) sed -n '2,3p' "$0" | sed 's/^# //'; echo "usage: [QUICK=1] scripts/all.sh [--quick]"; exit 0;; esac
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}  # two single-threaded lanes beat one two-threaded lane on 2 cores
lanes() {  # run the two command lines given as $1 and $2 side by side; fail if either fails
  bash -c "$1" & local a=$!
  bash -c "$2" & local b=$!
  local ra=0 rb=0
  wait "$a" || ra=$?
  wait "$b" || rb=$?
  return $((ra || rb))
}
# each lane walks the whole list (lane 1 from the end) and builds what the other is not building; the trained
# models come first for lane 0; lane 1 runs the worked example (its own CLIs and runs) first, then
# grow_staging's long continuations
all="models ppl_vs_width shrink_quality recovery geometry_vs_width heatmaps quantization heads arch_ablation grow_staging sandwich_ablation"
e="python scripts/experiments.py $all"
lanes "$e --lane 0 --lanes 2 $*" "bash scripts/worked_example.sh && $e --lane 1 --lanes 2 $*"
python scripts/report.py
