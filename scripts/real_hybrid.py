"""
A few maps between one and one per site (issue #40): SmolLM2-135M shrunk by per-block PCA maps shared by runs of
consecutive sites (``transform.py --porting=per_block --map_groups=G``), a shortcut matrix only where the map changes.

    python scripts/real_hybrid.py [--reverse]            (scripts/real_hybrid.sh; reuses real_model.sh's cache)

One factor, G, everything else SliceGPT's choices as results/real_model's best per-block rows (its order, its
weighting by state size, its first-site moment: ``real_model.SLICEGPT_CHOICES``), the same calibration (32,768
tinyshakespeare train tokens, seed 0) and evaluation (the whole val splits of tinyshakespeare and Botchan,
256-token windows). G = 61 (a map per site) is results/real_model's row, quoted; G = 1 is one global map with the
same choices. At m = 432 the loss as G grows; at the original's −25% parameters (100.9 M: 282,624·m + (G − 1)·m²,
the head untied) the width each G can keep, against results/real_model_tied's tied global map. n = 1 per row (the
maps are deterministic, one calibration draw). Writes results/real_model_hybrid/results.json after every model.
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from real_tied_head import real_model_results  # noqa: E402

from checkpoint import load_model  # noqa: E402
from real_model import RATIOS, SLICEGPT_CHOICES, cell  # noqa: E402
from real_quantization import save, start  # noqa: E402

UNTIED_PER_M = 282_624  # parameters per residual dimension with the head untied (embedding, 30 blocks, head)


def width_at(parameters: float, groups: int) -> int:
    """The width m whose per-block model with ``groups`` maps (groups − 1 shortcut matrices) has the parameter count
    closest to ``parameters``."""
    return min(range(1, 577), key=lambda m: abs(UNTIED_PER_M * m + (groups - 1) * m * m - parameters))


def cells() -> list[tuple[int, int]]:
    """(m, G), the most telling first: a cut-short run still answers the question."""
    quarter = 0.75 * real_model_results()["base"]["parameters"]
    m = RATIOS[0.75]
    return [(m, 4), (width_at(quarter, 4), 4), (m, 1), (m, 2), (m, 8), (m, 16), (width_at(quarter, 16), 16)]


def build(src: str, data: dict[str, str], m: int, groups: int) -> dict:
    return cell(src, data, m, "pca", "per_block", extra=(*SLICEGPT_CHOICES, f"--map_groups={groups}"))


def main() -> None:
    args, started, src, data = start(__doc__.split("\n\n")[0])
    todo = cells()
    if args.reverse:  # build only, from the end: the forward run writes the results in the table's order
        for m, groups in reversed(todo):
            build(src, data, m, groups)
        return
    ref = real_model_results()
    sites = 2 * load_model(src)[0].config.n_layer + 1  # a map per site: results/real_model's per-block rows
    payload = {"model": "SmolLM2-135M-Instruct (GGUF Q4_1, dequantized to float32)", "choices": list(SLICEGPT_CHOICES),
               "sites": sites,
               "base": {"losses": ref["base"]["losses"], "parameters": ref["base"]["parameters"]}, "rows": []}
    for m, groups in todo:
        row = build(src, data, m, groups)
        payload["rows"].append(dict(row, groups=groups))
        print(f"m={m} G={groups}: val {row['losses']['val']:.4f}, general {row['losses']['general']:.4f}, "
              f"{row['parameters'] / 1e6:.1f} M", flush=True)
        save(payload, started, "real_model_hybrid", "scripts/real_hybrid.sh")


if __name__ == "__main__":
    main()
