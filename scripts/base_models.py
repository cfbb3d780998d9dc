"""
The trained models the experiments share (the base config and its variants, from-scratch baselines), and
small helpers about them; ``experiments.py models`` trains them all first, in lanes.
"""
from __future__ import annotations

import os

from harness import (
    ROOT,
    Setting,
    trained,
    width,
)
from lgpt.plumbing.checkpoint import load_model

RATIOS = (0.25, 0.5, 0.75, 1.0, 1.5, 2.0)
RANDOM_KINDS = ("gaussian", "rademacher", "sparse", "srht", "orthogonal")
VARIANTS = ("base", "peri_ln", "scalar_gain", "rmsnorm", "tied_head", "knn_head", "norm_reg")
HEADS = {"linear": [], "tied": ["tied_head"], "knn": ["knn_head"]}


def overlays(*variants: str) -> list[str]:
    return [os.path.join(ROOT, "configs", "variants", f"{v}.py") for v in variants if v != "base"]


def model(s: Setting, *variants: str, seed: int = 0) -> str:
    """The trained model of the base config + these variants (one cache entry per variant set and seed)."""
    names = [v for v in variants if v != "base"]
    return trained(s, "+".join(names) or "base", overlays(*names), seed=seed, curve=False)  # no table reads curves


def scratch_model(s: Setting, ratio: float) -> str:
    """The base architecture at width m = ratio·d (the base's heads, head size and MLP) trained from scratch with
    the base's budget: shrink_quality's baseline."""
    d, n_head = shape(model(s, "base"))
    m = width(ratio, d, n_head)
    return trained(s, f"scratch_m{m}", args=[f"--n_embd={m}", f"--head_dim={d // n_head}", f"--mlp_hidden={4 * d}"],
                   curve=False)


def shape(src: str) -> tuple[int, int]:
    cfg = load_model(src)[0].config
    return cfg.n_embd, cfg.n_head


def paper_domain(kind: str, porting: str, ratio: float) -> bool:
    """Inside the paper's stated method: Algorithm 1 (a JL map, m < d) or, for m > d, its growth recipe
    (S = Tᵀ of an orthonormal T: our orthogonal kind). Only meaningful for the paper's rules."""
    if porting == "residual":
        return True
    return ratio < 1 or (ratio > 1 and kind == "orthogonal")


def head_seeds(s: Setting, head: str) -> tuple[int, ...]:
    """Training seeds of the heads experiment. QUICK (the 2-core CPU budget): n = 3 for the linear head, where the
    regularizer's effect is measured, n = 1 for tied and KNN heads; the GPU setting: n = 3 for every head."""
    return s.seeds[:3] if head == "linear" or not s.quick else s.seeds[:1]


def model_list(s: Setting) -> list[tuple[tuple[str, ...], int]]:
    heads = [(tuple(HEADS[h]) + (("norm_reg",) if reg else ()) or ("base",), seed) for h in HEADS for reg in (0, 1)
             for seed in head_seeds(s, h)]
    return list(dict.fromkeys([(("base",), 0)] + [((v,), 0) for v in VARIANTS] + heads))


def finetune_recipe(s: Setting) -> dict:
    return {"iters": s.finetune_iters, "eval_interval": s.finetune_eval_interval,
            "eval_iters": s.finetune_eval_iters, "seeds": len(s.seeds)}
