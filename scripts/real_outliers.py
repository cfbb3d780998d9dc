"""
Width and outliers together (issue #43): does a shrink that keeps SmolLM2-135M's outlier coordinates in range(T)
quantize better than one that keeps them out?

    python scripts/real_outliers.py [--reverse]          (scripts/real_outliers.sh; reuses real_model.sh's cache)

One factor at a time, at m = 432 (−25% width), every map the same PCA (calibrated as in results/real_model: 32,768
tinyshakespeare train tokens, unit weighting):
- ``in range``: the stream's top-432 directions, which keep 0.999 of e_507's energy (coordinate 507 carries the
  massive activation, up to ~24,900: results/real_model_geometry);
- ``507 out``: the same PCA with e_507 kept out of range(T) (``transform.py --pca_exclude=507``);
- ``all out``: every coordinate results/real_model_geometry names massive (≥ 100× the median coordinate; 22 of
  them) kept out;
each as it is and rotated afterwards at m = 432 by a Hadamard rotation (``transform.py --kind=hadamard`` on the
shrunk model: exact), so that the table also says whether a rotation can stand in for keeping the outliers.
Quantizations (quantize.py, as results/real_model_quantization): none (float), W4A4 (per channel / per token at
the readers), W8A8 at every linear layer, W4 with groups of 48 (64 does not divide 432); a model already worse
than a uniform guess in float gets W4A4 only. Losses: the whole val splits of tinyshakespeare and Botchan,
256-token windows, one thread; n = 1 (the maps are deterministic; the Hadamard rotation uses seed 0).
Writes results/real_model_outliers/results.json after every model.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from harness import RESULTS  # noqa: E402
from lgpt.method import geometry as geo  # noqa: E402
from lgpt.method.quantize import Quantization, activation_outliers, block_linears  # noqa: E402
from lgpt.plumbing.checkpoint import load_checkpoint, load_model  # noqa: E402
from lgpt.plumbing.dataset import BatchLoader  # noqa: E402
from real_model import BLOCK, RATIOS, losses, transformed  # noqa: E402
from real_quantization import INT8, quantized_losses, start  # noqa: E402
from real_quantization import save as write  # noqa: E402

M = RATIOS[0.75]
MASSIVE = os.path.join(RESULTS, "real_model_geometry", "results.json")  # scripts/massive_activations.py
# groups of 48: 64 (the m = d study's) does not divide m = 432; 48 divides 432, 576 and 1536
SETTINGS = (Quantization(weight_bits=4, act_bits=4), INT8, Quantization(weight_bits=4, group=48))
VOCAB = 49152  # SmolLM2's vocabulary: log V = 10.80 is a uniform guess's loss


def outlier_coordinates() -> list[int]:
    """The coordinates results/real_model_geometry names massive, largest first (507 first)."""
    with open(MASSIVE) as f:
        return [entry["coordinate"] for entry in json.load(f)["massive"]]


def variants(outliers: list[int]) -> list[tuple[str, tuple[str, ...]]]:
    """(name, transform.py options) of each shrink, in the order they are built."""
    return [("in range", ()), ("507 out", ("--pca_exclude=507",)),
            ("all out", ("--pca_exclude=" + ",".join(map(str, outliers)),))]


@torch.no_grad()
def model_facts(model_dir: str, window: torch.Tensor, outliers: list[int]) -> dict:
    """How much of each outlier coordinate range(T) keeps (‖T·e_i‖² of the shrink's T; a rotation after it does not
    change it), and how outlier-heavy the readers' inputs and the weights are."""
    model, ckpt = load_model(model_dir)
    record = ckpt["transform"]
    source = load_checkpoint(record["source"])["transform"] if record["kind"] == "hadamard" else record
    kept = source["T"].double()[:, outliers].pow(2).sum(0)
    return {"exact_step": bool(record["exact"]), "kept_507": kept[0].item(),
            "kept_outliers_mean": kept.mean().item(), "readers_input": activation_outliers(model, window),
            "weight_kurtosis": statistics.fmean(geo.excess_kurtosis(m.weight) for m in block_linears(model).values())}


def models(src: str, data: dict[str, str], outliers: list[int]) -> list[tuple[str, bool, str]]:
    """(variant, rotated, directory) of every model, shrunk first and then rotated, built (or read from the cache)
    in the table's order."""
    out = []
    for name, options in variants(outliers):
        shrunk, _ = transformed(src, data, M, "pca", extra=options)
        rotated, _ = transformed(shrunk, data, M, "hadamard")
        out += [(name, False, shrunk), (name, True, rotated)]
    return out


def main() -> None:
    args, started, src, data = start(__doc__.split("\n\n")[0])
    outliers = outlier_coordinates()
    built = models(src, data, outliers)
    if args.reverse:
        for _name, _rotated, out in reversed(built):
            row = {"losses": {"float": losses(out, data)}}
            for q in reversed(SETTINGS):
                if q == SETTINGS[0] or not broken(row):
                    quantized_losses(out, data, q)
        return
    window = next(iter(BatchLoader(data["shakespeare"], BLOCK, 1, "cpu").full_split("val")))[0]
    rows = [{"variant": name, "rotation": "hadamard" if rotated else "none", "out_dir": out,
             **model_facts(out, window, outliers), "losses": {}} for name, rotated, out in built]
    for row in rows:  # float first for every model, then each setting: a cut-short run still compares the rows
        row["losses"]["float"] = losses(row["out_dir"], data)
        save(rows, outliers, started)
    for q in SETTINGS:
        for row in rows:
            if q != SETTINGS[0] and broken(row):
                continue
            row["losses"][q.label] = quantized_losses(row["out_dir"], data, q)
            print(f"{row['variant']} / {row['rotation']} {q.label}: val {row['losses'][q.label]['val']:.4f}, "
                  f"general {row['losses'][q.label]['general']:.4f}", flush=True)
            save(rows, outliers, started)


def broken(row: dict) -> bool:
    """Worse than a uniform guess before any rounding (val loss above log V): such a model gets the first setting
    (W4A4, where the outliers matter most) and no more — rounding cannot say anything further about it."""
    return row["losses"]["float"]["val"] > math.log(VOCAB)


def save(rows: list[dict], outliers: list[int], started: float) -> None:
    write({"model": "SmolLM2-135M-Instruct (GGUF Q4_1, dequantized to float32)", "m": M, "block": BLOCK,
           "outliers": outliers, "settings": [dict(dataclasses.asdict(q), label=q.label) for q in SETTINGS],
           "rows": rows}, started, "real_model_outliers", "scripts/real_outliers.sh")


if __name__ == "__main__":
    main()
