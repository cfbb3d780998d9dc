"""
A few maps between one and one per site (issue #40): SmolLM2-135M shrunk by per-block PCA maps shared by runs of
consecutive sites (``transform.py --porting=per_block --map_groups=G``), a shortcut matrix only where the map changes.

    python scripts/real_hybrid.py [--part=weighting|all] [--reverse]       (scripts/real_hybrid.sh)

One factor, G, everything else SliceGPT's choices as results/real_model's best per-block rows (its order, its
weighting by state size, its first-site moment: ``real_model.SLICEGPT_CHOICES``), the same calibration (32,768
tinyshakespeare train tokens, seed 0) and evaluation (the whole val splits of tinyshakespeare and Botchan,
256-token windows). G = 61 (a map per site) is results/real_model's row, quoted; G = 1 is one global map with the
same choices. At m = 432 the loss as G grows; at the original's −25% parameters (100.9 M: 282,624·m + (G − 1)·m²,
the head untied) the width each G can keep, against results/real_model_tied's tied global map. Then the diagnosis
of the loss's shape in G, one factor: the same series at m = 432 with each PCA weighted by direction (ours,
``--calib_weighting=unit``) instead of by state size (G = 61 built here: results/real_model has no such row). n = 1
per row (the maps are deterministic, one calibration draw); last, weighted by direction at −25% parameters (the
widths of the state-size rows there, and G = 61's m = 333), against the tied global map. Writes
results/real_model_hybrid/results.json after every model; ``--part=weighting`` builds only the rows weighted by
direction that results/real_model_hybrid/results.json lacks and adds them to it (its rows kept as they are).
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from real_tied_head import real_model_results  # noqa: E402

from lgpt.plumbing.checkpoint import load_model  # noqa: E402
from real_model import RATIOS, SLICEGPT_CHOICES, cell  # noqa: E402
from real_quantization import save, saved, start  # noqa: E402

UNTIED_PER_M = 282_624  # parameters per residual dimension with the head untied (embedding, 30 blocks, head)


def width_at(parameters: float, groups: int) -> int:
    """The width m whose per-block model with ``groups`` maps (groups − 1 shortcut matrices) has the parameter count
    closest to ``parameters``."""
    return min(range(1, 577), key=lambda m: abs(UNTIED_PER_M * m + (groups - 1) * m * m - parameters))


def cells(sites: int) -> list[tuple[int, int, str]]:
    """(m, G, weighting), the most telling first: a cut-short run still answers the question; G = ``sites`` (a map
    per site) only where results/real_model has no row for it."""
    quarter = 0.75 * real_model_results()["base"]["parameters"]
    m = RATIOS[0.75]
    raw = [(m, 4), (width_at(quarter, 4), 4), (m, 1), (m, 2), (m, 8), (m, 16), (width_at(quarter, 16), 16)]
    unit = [(m, g) for g in (4, 1, sites, 2, 8, 16)] + [(width_at(quarter, g), g) for g in (16, sites, 4)]
    return [(w, g, "raw") for w, g in raw] + [(w, g, "unit") for w, g in unit]


def choices(weighting: str) -> tuple[str, ...]:
    """SliceGPT's choices with the PCA's weighting replaced by ``weighting``."""
    return tuple(f"--calib_weighting={weighting}" if a.startswith("--calib_weighting=") else a
                 for a in SLICEGPT_CHOICES)


def build(src: str, data: dict[str, str], m: int, groups: int, weighting: str, sites: int) -> dict:
    """A per-block shrink with ``groups`` maps (a map per site, results/real_model's construction, at ``sites``)."""
    grouping = () if groups == sites else (f"--map_groups={groups}",)
    return cell(src, data, m, "pca", "per_block", extra=(*choices(weighting), *grouping))


def main() -> None:
    args, started, src, data = start(__doc__.split("\n\n")[0], ("weighting", "all"))
    sites = 2 * load_model(src)[0].config.n_layer + 1  # a map per site: results/real_model's per-block rows
    todo = cells(sites)
    kept = []
    if args.part == "weighting":  # what the saved results lack: their rows are kept, not rebuilt
        kept = saved("real_model_hybrid", "scripts/real_hybrid.sh")["rows"]
        have = {(x["m"], x["groups"], x.get("weighting", "raw")) for x in kept}
        todo = [c for c in todo if c[2] != "raw" and c not in have]
    if args.reverse:  # build only, from the end: the forward run writes the results in the table's order
        for m, groups, weighting in reversed(todo):
            build(src, data, m, groups, weighting, sites)
        return
    ref = real_model_results()
    payload = {"model": "SmolLM2-135M-Instruct (GGUF Q4_1, dequantized to float32)", "choices": list(SLICEGPT_CHOICES),
               "sites": sites,
               "base": {"losses": ref["base"]["losses"], "parameters": ref["base"]["parameters"]}, "rows": []}
    payload["rows"] = list(kept)
    for m, groups, weighting in todo:
        row = build(src, data, m, groups, weighting, sites)
        payload["rows"].append(dict(row, groups=groups, weighting=weighting))
        print(f"m={m} G={groups} ({weighting}): val {row['losses']['val']:.4f}, general "
              f"{row['losses']['general']:.4f}, {row['parameters'] / 1e6:.1f} M", flush=True)
        save(payload, started, "real_model_hybrid", "scripts/real_hybrid.sh")


if __name__ == "__main__":
    main()
