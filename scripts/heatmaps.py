"""
heatmaps: the worked example's figures — norm and cosine heatmaps of one model before and after a transform
(scripts/heatmaps.sh).
"""
from __future__ import annotations

import os
import time

from base_models import model, shape
from figures import copy_figures
from harness import (
    Setting,
    geometry,
    save,
    transformed,
    width,
)

HEATMAPS = {  # the first two share T (Gaussian, seed 0, m/d = 0.75): only the rule differs
    "gaussian_residual_0.75": ("gaussian", "residual", 0.75), "gaussian_sandwich_0.75": ("gaussian", "sandwich", 0.75),
    "pca_residual_0.5": ("pca", "residual", 0.5), "orthogonal_residual_1.0": ("orthogonal", "residual", 1.0)}


def heatmaps(s: Setting) -> None:
    t0 = time.time()
    base = model(s, "base")
    d, n_head = shape(base)
    summary, figures = {}, {}
    for label, (kind, porting, ratio) in HEATMAPS.items():
        src, record = transformed(s, base, width(ratio, d, n_head), kind, porting)
        metrics = geometry(s, base, src, eval_iters=10)
        for fig in ("cosine_heatmaps", "norm_heatmap"):
            figures[f"{label}_{fig}.png"] = os.path.join(metrics["out_dir"], metrics["figures"][fig])
        summary[label] = {"zero_shot": record["val_loss_after"], "ae_model": metrics["angular_error"]["model"],
                          "hc_model": metrics["concordance"]["model"]["pearson"]}
    copy_figures("heatmaps", figures)
    save("heatmaps", {"runs": summary}, t0, s)
