"""
heads: linear / tied / KNN heads with and without the norm regularizer, n training seeds (scripts/heads.sh).
"""
from __future__ import annotations

import os
import statistics
import time

from base_models import HEADS, head_seeds, model
from figures import copy_figures
from harness import (
    Setting,
    full_val_loss,
    geometry,
    mean_spread,
    save,
)


def heads(s: Setting) -> None:
    t0 = time.time()
    rows, figures = [], {}
    for head, variants in HEADS.items():
        for reg in (0.0, 0.1):
            per_seed = []
            for seed in head_seeds(s, head):
                src = model(s, *variants, *(["norm_reg"] if reg else []), seed=seed)
                metrics = geometry(s, src, eval_iters=10)
                ref = metrics["models"]["ref"]
                per_seed.append({"val_loss": full_val_loss(src, s.device), "ndcg": ref["ndcg"],
                                 "mu_e": ref["embedding_norms"]["mean"], "sigma_e": ref["embedding_norms"]["std"],
                                 "hidden_norm_mean": ref["hidden_norm_mean"], "geometry_dir": metrics["out_dir"]})
            name = f"head_{head}_reg{reg}"
            figures[f"{name}_norms.png"] = os.path.join(per_seed[0]["geometry_dir"], "norm_heatmap.png")
            rows.append({"head": head, "norm_reg": reg, "val_loss": mean_spread([r["val_loss"] for r in per_seed]),
                         "ndcg": {k: mean_spread([r["ndcg"][k] for r in per_seed]) for k in per_seed[0]["ndcg"]},
                         "mu_e": mean_spread([r["mu_e"] for r in per_seed]),
                         "sigma_e": mean_spread([r["sigma_e"] for r in per_seed]),
                         "hidden_norm_mean": [statistics.fmean(col) for col in
                                              zip(*[r["hidden_norm_mean"] for r in per_seed])]})
            print(head, reg, rows[-1]["val_loss"]["mean"])
    copy_figures("heads", figures)
    save("heads", {"rows": rows, "ndcg_k": 10}, t0, s)
