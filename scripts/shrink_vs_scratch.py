"""
shrink_vs_scratch: the recommended shrink against the same small architecture trained from scratch at **equal total
compute**, its learning rate swept (issue #41; scripts/shrink_vs_scratch.sh).

The shrunk model inherits the original's training: its compute is the original's training (6·N_d FLOPs per token
over the base budget; the transform's calibration, learned map and refit are not counted — their seconds are in
the table). The scratch model of width m (the base's heads, head size and MLP, as shrink_quality's) gets the same
FLOPs: round(base iterations × N_d / N_m) iterations of its own cosine schedule. Its learning rate (and min_lr, kept
at a tenth) is swept on training seed 0 and the best one — chosen on the full val split, which favours the scratch
side — is trained on every seed. The shrink is applied to each training seed of the original. n = 3 on both
sides; the verdict is the one rule's (Welch: the seeds are not paired).
"""
from __future__ import annotations

import copy
import time

from base_models import model, shape
from harness import Setting, each, full_val_loss, mean_spread, save, trained, transformed, width
from lgpt.plumbing.checkpoint import load_model
from lgpt.plumbing.configurator import load_config
from model import GPT
from shrink_quality import CALIBRATION, CORRECTIONS
from train import TrainConfig

SVS_RATIOS = (0.25, 0.5, 0.75)
LR_FACTORS = (0.5, 1.0, 2.0)  # × the base config's learning_rate, on training seed 0
RECIPE = "learned T + all"  # the recommended shrink of shrink_quality


def scratch_args(d: int, n_head: int, m: int, iters: int, lr: float) -> list[str]:
    return [f"--n_embd={m}", f"--head_dim={d // n_head}", f"--mlp_hidden={4 * d}", f"--max_iters={iters}",
            f"--lr_decay_iters={iters}", f"--learning_rate={lr:g}", f"--min_lr={lr / 10:g}"]


def shrink_vs_scratch(s: Setting) -> None:
    t0 = time.time()
    seeds = s.seeds[:3]
    bases = [model(s, "base", seed=seed) for seed in seeds]
    d, n_head = shape(bases[0])
    base_cfg = load_config(TrainConfig, s.base)
    original = load_model(bases[0])[0]
    flops_d = 6 * original.get_num_params()

    def cell(ratio: float) -> dict:
        m = width(ratio, d, n_head)
        small = copy.deepcopy(original.config)
        small.n_embd = m
        flops_m = 6 * GPT(small).get_num_params()
        iters = round(base_cfg.max_iters * flops_d / flops_m)
        shrunk = [transformed(s, b, m, "pca", **CALIBRATION, **CORRECTIONS[RECIPE])[1] for b in bases]
        sweep = [{"lr_factor": f, "learning_rate": base_cfg.learning_rate * f,
                  "val_loss": full_val_loss(trained(s, f"svs_m{m}_lr{f:g}", args=scratch_args(
                      d, n_head, m, iters, base_cfg.learning_rate * f), seed=seeds[0], curve=False), s.device)}
                 for f in LR_FACTORS]
        best = min(sweep, key=lambda x: x["val_loss"])
        scratch = [best["val_loss"]] + [full_val_loss(trained(s, f"svs_m{m}_lr{best['lr_factor']:g}", args=scratch_args(
            d, n_head, m, iters, best["learning_rate"]), seed=seed, curve=False), s.device) for seed in seeds[1:]]
        return {"ratio": ratio, "m": m, "flops_per_token": {"original": flops_d, "small": flops_m},
                "scratch_iters": iters, "base_iters": base_cfg.max_iters, "lr_sweep": sweep,
                "best_lr_factor": best["lr_factor"], "at_edge": best["lr_factor"] in (min(LR_FACTORS), max(LR_FACTORS)),
                "shrunk_val_loss": mean_spread([r["val_loss_after"] for r in shrunk]),
                "transform_seconds": mean_spread([r["seconds"] for r in shrunk]),
                "scratch_val_loss": mean_spread(scratch)}

    rows = each(list(SVS_RATIOS), cell)
    save("shrink_vs_scratch", {"d": d, "recipe": RECIPE, "lr_factors": list(LR_FACTORS),
                               "base_learning_rate": base_cfg.learning_rate, "seeds": list(seeds),
                               "original_val_loss": mean_spread([full_val_loss(b, s.device) for b in bases]),
                               "rows": rows}, t0, s)
