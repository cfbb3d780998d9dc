"""
Keeping a tied head tied through a shrink (issue #40): a PCA map that keeps the final norm's outlying-gain
coordinates as rows of their own (``transform.py --tie_head=True --tie_keep=K``), on SmolLM2-135M.

    python scripts/real_tied_head.py [--reverse]         (scripts/real_tied_head.sh; reuses real_model.sh's cache)

A tied model of width m has 233,472·m parameters (the embedding once, 30 blocks, no shortcut matrix): m = 432 is
the original's −25% (100.9 M) and m = 288 its −50% (67.2 M), in the form every exporter knows (Hugging Face,
GGUF). Folding the final norm's per-dimension gain γ into the head unties it; keeping it tied needs
diag(γ)·Tᵀ ≈ Tᵀ·diag(γ′), which fails for a PCA map that mixes SmolLM2's two negative gains (γ_247 = −2.1,
γ_17 = −1.3) with the rest (median +1.8): results/real_model's tied row, val 10.45. One factor at a time, every
map the same PCA calibration as results/real_model (32,768 tinyshakespeare train tokens, unit weighting):
- m = 432, ``--tie_keep`` K = 2, 8, 32 (the K coordinates whose gain lies farthest from the median kept as rows
  of T; K = 0 is results/real_model's tied row, quoted);
- m = 432, K = 32 with ``--refit=readers`` (the least-squares readers refit, then the tie);
- m = 288, K = 32, with and without ``--refit=readers``.
Losses: the whole val splits of tinyshakespeare and Botchan, 256-token windows, one thread per process; n = 1
(the maps are deterministic). Writes results/real_model_tied/results.json after every model.
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from real_model import RATIOS, cell  # noqa: E402
from real_quantization import save, start  # noqa: E402

TIE = "--tie_head=True"
READERS = "--refit=readers"
# (m, tie_keep, more options), the most telling first: a cut-short run still answers the question
CELLS = [(RATIOS[0.75], 32, ()), (RATIOS[0.75], 2, ()), (RATIOS[0.75], 8, ()), (RATIOS[0.75], 32, (READERS,)),
         (RATIOS[0.5], 32, ()), (RATIOS[0.5], 32, (READERS,))]


def options(keep: int, more: tuple[str, ...]) -> tuple[str, ...]:
    return (TIE, f"--tie_keep={keep}", *more)


def main() -> None:
    args, started, src, data = start(__doc__.split("\n\n")[0])
    if args.reverse:  # build only, from the end: the forward run writes the results in the table's order
        for m, keep, more in reversed(CELLS):
            cell(src, data, m, "pca", extra=options(keep, more))
        return
    rows = []
    for m, keep, more in CELLS:
        row = cell(src, data, m, "pca", extra=options(keep, more))
        rows.append(dict(row, tie_keep=keep, refit="readers" if READERS in more else "none"))
        print(f"m={m} tie_keep={keep} {' '.join(more)}: val {row['losses']['val']:.4f}, "
              f"general {row['losses']['general']:.4f}", flush=True)
        save({"model": "SmolLM2-135M-Instruct (GGUF Q4_1, dequantized to float32)", "rows": rows}, started,
             "real_model_tied", "scripts/real_tied_head.sh")


if __name__ == "__main__":
    main()
