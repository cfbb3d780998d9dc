"""
shrink_quality: how far one global map gets zero-shot, with each correction of refit.py (issue #12;
scripts/shrink_quality.sh).
"""
from __future__ import annotations

import time

from base_models import RANDOM_KINDS, model, scratch_model, shape
from figures import finish_zero_shot_axis, plt, savefig, zero_shot_curve
from harness import (
    Setting,
    each,
    full_val_loss,
    mean_spread,
    save,
    transformed,
    width,
)

SHRINK_RATIOS = (0.25, 0.5, 0.75)
SHRINK_KINDS = ("pca", "gaussian", "orthogonal")
CORRECTIONS = {"none": {}, "gains": {"refit": "gains"}, "readers": {"refit": "readers"}, "all": {"refit": "all"},
               "learned T + all": {"refit": "all", "learn_steps": 100}}


CALIBRATION = {"calib_batches": 16}  # 16 × 16 = 256 training sequences for PCA, the fits and the learned map


# how far more work on the best recipe goes (PCA only): 4× the learned map's steps and 4× the calibration text
LONGER = {"learned T ×4 steps + all, ×4 calibration": {"refit": "all", "learn_steps": 400, "calib_batches": 64}}


def shrink_quality(s: Setting) -> None:
    t0 = time.time()
    base = model(s, "base")
    d, n_head = shape(base)

    def row(cell: tuple) -> dict:
        ratio, kind, label, options = cell
        m = width(ratio, d, n_head)
        records = each(s.seeds if kind in RANDOM_KINDS else (0,),
                       lambda seed: transformed(s, base, m, kind, seed=seed, **{**CALIBRATION, **options})[1])
        return {"ratio": ratio, "m": m, "kind": kind, "correction": label,
                "zero_shot": mean_spread([r["val_loss_after"] for r in records]),
                "seconds": mean_spread([r["seconds"] for r in records])}

    def scratch_row(ratio: float) -> dict:
        src = scratch_model(s, ratio)
        return {"ratio": ratio, "m": width(ratio, d, n_head), "val_loss": full_val_loss(src, s.device)}

    rows = each([(ratio, kind, label, options) for ratio in SHRINK_RATIOS for kind in SHRINK_KINDS
                 for label, options in [*CORRECTIONS.items(), *(LONGER.items() if kind == "pca" else ())]], row)
    scratch = each(SHRINK_RATIOS, scratch_row)
    base_seeds = [full_val_loss(model(s, "base", seed=seed), s.device) for seed in s.seeds[:3]]
    payload = {"d": d, "reference_val_loss": full_val_loss(base, s.device), "rows": rows, "scratch": scratch,
               "base_training_seeds": mean_spread(base_seeds), "calibration_sequences": 16 * 16,
               "learn_steps": CORRECTIONS["learned T + all"]["learn_steps"]}
    plot_shrink_quality(payload)
    save("shrink_quality", payload, t0, s)


def plot_shrink_quality(r: dict) -> None:
    fig, axes = plt().subplots(1, len(SHRINK_KINDS), figsize=(5.5 * len(SHRINK_KINDS), 4.6), sharey=True)
    for ax, kind in zip(axes, SHRINK_KINDS):
        for label in CORRECTIONS:
            zero_shot_curve(ax, [row for row in r["rows"] if row["kind"] == kind and row["correction"] == label],
                            label)
        ax.plot([p["ratio"] for p in r["scratch"]], [p["val_loss"] for p in r["scratch"]], "k--", marker="s",
                label="width m trained from scratch")
        finish_zero_shot_axis(ax, r["reference_val_loss"], f"{kind} map, residual porting")
    fig.tight_layout()
    savefig(fig, "shrink_quality", "shrink_quality.png")
