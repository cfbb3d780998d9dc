"""
quantization: same-width rotations before int8/int4 round-to-nearest (scripts/quantization.sh).
"""
from __future__ import annotations

import statistics
import time

import torch

from base_models import RANDOM_KINDS, model, shape
from harness import (
    Setting,
    full_val_loss,
    mean_spread,
    save,
    transformed,
)
from lgpt.method import geometry as geo
from lgpt.plumbing.checkpoint import load_model
from lgpt.plumbing.dataset import BatchLoader, data_dir_for_checkpoint, evaluate_loss

ROTATIONS = {"no rotation (fold only, T = I)": "truncate", "orthogonal rotation": "orthogonal",
             "SRHT rotation": "srht"}


def quantization(s: Setting) -> None:
    t0 = time.time()
    base = model(s, "base")
    d, _ = shape(base)
    rows = []
    for label, kind in ROTATIONS.items():
        per_seed = []
        for seed in (s.seeds if kind in RANDOM_KINDS else (0,)):
            src, _ = transformed(s, base, d, kind, seed=seed)
            rotated, ckpt = load_model(src)
            loader = BatchLoader(data_dir_for_checkpoint(ckpt), rotated.config.block_size, 32)
            row = {"fp32": evaluate_loss(rotated, loader, "val", None), "weight_kurtosis": statistics.fmean(
                geo.excess_kurtosis(p) for p in rotated.parameters() if p.dim() == 2)}
            for bits in (8, 4):
                row[f"int{bits}"] = evaluate_loss(quantized(rotated, bits), loader, "val", None)
            per_seed.append(row)
        rows.append({"rotation": label, **{k: mean_spread([r[k] for r in per_seed]) for k in per_seed[0]}})
        print(label, rows[-1]["int4"]["mean"])
    original, _ = load_model(base)
    save("quantization", {"rows": rows, "original_val_loss": full_val_loss(base, "cpu"),
                          "original_weight_kurtosis": statistics.fmean(
                              geo.excess_kurtosis(p) for p in original.parameters() if p.dim() == 2)}, t0, s)


def quantized(model_, bits: int):
    import copy
    q = copy.deepcopy(model_)
    with torch.no_grad():
        for p in q.parameters():
            if p.dim() == 2:
                p.copy_(geo.rtn_quantize(p, bits))
    return q
