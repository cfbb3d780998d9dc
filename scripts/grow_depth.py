"""
grow_depth: depth growth (transform.py --n_layer) as the positive control of growing (scripts/grow_depth.sh).
"""
from __future__ import annotations

import time

from growth import continued, grow_settings, staged_arms, staged_baselines, with_iters
from harness import (
    Setting,
    save,
    trained,
    transformed,
)
from lgpt.plumbing.checkpoint import load_model
from lgpt.plumbing.configurator import load_config
from train import TrainConfig

DEPTH_ARMS = [{"depth_mode": "interleave", "carry_optimizer": True}, {"depth_mode": "stack", "carry_optimizer": True},
              {"depth_mode": "gstack", "carry_optimizer": True}, {"depth_mode": "interleave", "carry_optimizer": False}]


def depth_arm_label(arm: dict) -> str:
    kind = {"interleave": "interleaved copies, zero writers", "stack": "stacked copies, zero writers",
            "gstack": "G_stack (stack repeated, writers kept)"}[arm["depth_mode"]]
    return f"{kind}, {'carried' if arm['carry_optimizer'] else 'fresh'} AdamW"


def depth_models(s: Setting, seed: int = 0) -> tuple[str, str]:
    """(half-depth stage 1, the full model from scratch): stage 1 has half the blocks, the same width and heads,
    and stops halfway through the 2·iters cosine; the scratch model is grow_staging's (the same cache entry)."""
    staging, _, big = grow_settings(s)
    half = load_config(TrainConfig, s.base).n_layer // 2
    small = with_iters(big, staging.stage1, staging.total) + [f"--n_layer={half}"]
    return trained(s, "depth_stage1", args=small, seed=seed), trained(s, "grow_scratch", args=big, seed=seed)


def depth_arm(s: Setting, stage1: str, arm: dict, seed: int) -> dict:
    """Stage 1 grown to full depth by ``arm`` (T = I: the width is kept) and trained on along its schedule."""
    base = load_model(stage1)[0].config
    grown, record = transformed(s, stage1, base.n_embd, "truncate", seed=seed, n_layer=2 * base.n_layer,
                                depth_mode=arm["depth_mode"], carry_optimizer=arm["carry_optimizer"])
    return continued(s, stage1, grown, record, f"deeper-{arm['depth_mode']}", 0)


def grow_depth(s: Setting) -> None:
    """The half-depth model grown to full depth halfway through the schedule, against the full model trained from
    scratch (its curve at equal compute, and a run given the staged compute and fully decayed), n seeds."""
    t0 = time.time()
    staging, _, big = grow_settings(s)
    pairs = [depth_models(s, seed) for seed in s.seeds]
    base = load_config(TrainConfig, s.base)
    result = staged_baselines(s, staging, big, pairs)
    costs = result.pop("costs")
    result["flops_per_token"] = {"half": costs[2], "full": costs[3]}
    result["n_layer"] = {"stage1": base.n_layer // 2, "full": base.n_layer}
    result["arms"] = staged_arms(s, DEPTH_ARMS, depth_arm_label, depth_arm, pairs, result["scratch"], costs)
    save("grow_depth", result, t0, s)
