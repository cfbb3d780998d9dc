"""
What the growth experiments share (grow_staging, grow_depth, grow_recipes): train at d, grow, continue, and compare
with the big model from scratch at equal compute — the staging, the stage-1 models, the continuation, the
scratch baselines and the energy outside range(T).
"""
from __future__ import annotations

import os
from typing import NamedTuple

import torch

from finetune import FinetuneConfig, finetune
from harness import (
    Setting,
    cached,
    full_val_loss,
    mean_spread,
    spec_of,
    trained,
    transformed,
)
from lgpt.method import geometry as geo
from lgpt.plumbing.checkpoint import load_checkpoint, load_model
from lgpt.plumbing.configurator import load_config
from lgpt.plumbing.dataset import BatchLoader, data_dir_for_checkpoint
from lgpt.plumbing.logger import read_metrics
from train import TrainConfig

GROW_NOISE, CLONE_NOISE = 0.1, 0.02  # residual symmetry breaking (both modes); cancelling noise of the clones
GROW_ARMS = [{"grow_mode": mode, "carry_optimizer": carry, "rewarm_iters": rewarm}
             for mode in ("zero", "clone") for carry in (False, True) for rewarm in (0, 100)]


def arm_label(arm: dict) -> str:
    return (f"{arm['grow_mode']}, {'carried' if arm['carry_optimizer'] else 'fresh'} AdamW, "
            + (f"re-warm {arm['rewarm_iters']}" if arm["rewarm_iters"] else "no re-warm"))


class Staging(NamedTuple):
    """When a staged run grows: stage 1 trains its first ``stage1`` of the ``total`` iterations the one cosine
    schedule spans; the grown model trains the rest."""
    stage1: int
    total: int


def grow_settings(s: Setting, horizon: int = 1, switch: float = 0.5) -> tuple[Staging, list[str], list[str]]:
    """(the staging, stage-1 args, 2d-from-scratch args) for a run of ``horizon`` × the setting's budget
    (2·grow_iters iterations) that grows at ``switch`` of it. Both models are the canonical architecture (RMSNorm,
    scalar gains), so the grown model is exactly the scratch model; stage 1 has half the width and half the heads
    (same head size) and stops at the switch of the cosine the whole staged run follows."""
    total = 2 * s.grow_iters * horizon
    staging = Staging(round(switch * total), total)
    base = load_config(TrainConfig, s.base)
    arch = ["--norm_type=rmsnorm", "--norm_gain=scalar", *s.curve_eval]
    small = arch + [f"--n_embd={base.n_embd // 2}", f"--n_head={base.n_head // 2}", f"--max_iters={staging.stage1}",
                    f"--lr_decay_iters={total}"]
    return staging, small, arch + [f"--max_iters={total}", f"--lr_decay_iters={total}"]


def with_iters(args: list[str], max_iters: int, lr_decay_iters: int | None = None) -> list[str]:
    """``args`` with its iteration settings replaced (the cosine ends at ``lr_decay_iters``, or where it did)."""
    drop = ("--max_iters",) if lr_decay_iters is None else ("--max_iters", "--lr_decay_iters")
    return [a for a in args if not a.startswith(drop)] + [f"--max_iters={max_iters}"] + (
        [] if lr_decay_iters is None else [f"--lr_decay_iters={lr_decay_iters}"])


def grow_models(s: Setting, seed: int = 0, horizon: int = 1, switch: float = 0.5) -> tuple[str, str]:
    _, small, big = grow_settings(s, horizon, switch)
    return trained(s, "grow_stage1", args=small, seed=seed), trained(s, "grow_scratch", args=big, seed=seed)


def grow_arm(s: Setting, stage1: str, arm: dict, seed: int) -> dict:
    """Stage 1 grown to the 2d model by ``arm`` and trained on to 2·iters along stage 1's schedule."""
    base = load_model(stage1)[0].config
    grown, record = transformed(s, stage1, 2 * base.n_embd, "orthogonal", seed=seed, n_head=2 * base.n_head,
                                mlp_hidden=2 * base.mlp_hidden, grow_mode=arm["grow_mode"], grow_noise=GROW_NOISE,
                                clone_noise=CLONE_NOISE if arm["grow_mode"] == "clone" else 0.0,
                                carry_optimizer=arm["carry_optimizer"])
    return continued(s, stage1, grown, record, f"grown-{arm['grow_mode']}", arm["rewarm_iters"])


def continued(s: Setting, stage1: str, grown: str, record: dict, label: str, rewarm_iters: int) -> dict:
    """The grown model trained on to the end of stage 1's schedule (its recipe, seed and state), with its curve on
    the fixed eval batches, its full-val loss and its directory (``out_dir``)."""
    run_cfg = load_checkpoint(stage1)["config"]
    recipe = [f"--{k}={run_cfg[k]}" for k in ("learning_rate", "min_lr", "warmup_iters", "lr_decay_iters",
                                              "weight_decay", "beta1", "beta2", "batch_size", "grad_clip",
                                              "gradient_accumulation_steps")]
    cfg = load_config(FinetuneConfig, s.common + recipe + s.curve_eval + [
        f"--in_dir={grown}", "--out_dir=unset", "--init_state=True", f"--max_iters={run_cfg['lr_decay_iters']}",
        f"--rewarm_iters={rewarm_iters}", f"--seed={run_cfg['seed']}", f"--device={s.device}",
        "--log_interval=100"])

    def build(out: str) -> dict:
        cfg.out_dir, cfg.overwrite = out, True
        summary = finetune(cfg)
        return dict(summary, full_val_loss=full_val_loss(out, s.device), zero_shot=record["val_loss_after"])

    path, result = cached("finetune", f"{label}-s{run_cfg['seed']}", spec_of(cfg), build)
    return dict(result, out_dir=path)


def val_curve(path: str) -> list[list[float]]:
    return [[r["iter"], r["val/loss"]] for r in read_metrics(os.path.join(path, "metrics.jsonl")) if "val/loss" in r]


def staged_baselines(s: Setting, staging: Staging, big: list[str], pairs: list[tuple[str, str]]) -> dict:
    """What every staged run is measured against, for stage-1 / scratch ``pairs`` (one per seed): the FLOPs per token
    of both models (≈ 6·N, N without wpe), the staged compute as a fraction of the scratch run's (stage 1
    counted), the big model trained from scratch (its curve: the equal-compute comparison along the way) and the big
    model given the staged compute with its cosine fully decayed (both equal-compute baselines)."""
    base = load_config(TrainConfig, s.base)
    tokens = base.batch_size * base.block_size * base.gradient_accumulation_steps
    small, full = (6 * load_model(path)[0].get_num_params() for path in pairs[0])
    staged = staging.stage1 * small + (staging.total - staging.stage1) * full  # per token of one iteration
    equal_iters = round(staged / full)
    equal = [trained(s, "grow_scratch_eq", args=with_iters(big, equal_iters, equal_iters), seed=seed)
             for seed in s.seeds]
    scratch = [{"curve": val_curve(b), "full_val_loss": full_val_loss(b, s.device)} for _, b in pairs]
    return {"staging": staging._asdict(), "iters_per_stage": staging.stage1, "tokens_per_iter": tokens,
            "flops_per_token": {"stage1": small, "full": full},
            "staged_flops_fraction": staged / (staging.total * full),
            "equal_compute_iters": equal_iters, "eval": s.curve_eval,
            "stage1": [{"curve": val_curve(a), "full_val_loss": full_val_loss(a, s.device)} for a, _ in pairs],
            "scratch": scratch, "scratch_full_val_loss": mean_spread([r["full_val_loss"] for r in scratch]),
            "scratch_equal_compute_full_val_loss": mean_spread([full_val_loss(e, s.device) for e in equal]),
            "costs": (staging, tokens, small, full)}


def staged_arms(s: Setting, arms: list[dict], label, run_arm, pairs: list, scratch: list, costs: tuple,
                extra=lambda run: {}) -> list[dict]:
    """Every arm's continued runs over the seeds, measured against the same seed's scratch curve (``costs``:
    the staging, tokens per iteration, FLOPs per token of the small and the big model), with each seed's
    ``extra(run)`` and the mean ± std over seeds of the final loss, the zero-shot loss and the extras."""
    out = []
    for arm in arms:
        per_seed = []
        for seed, (stage1, _), ref in zip(s.seeds, pairs, scratch):
            run = run_arm(s, stage1, arm, seed)
            per_seed.append({"seed": seed, "curve": run["curve"], "full_val_loss": run["full_val_loss"],
                             "zero_shot": run["zero_shot"], **extra(run),
                             **against_scratch(run["curve"], ref["curve"], *costs)})
        keys = ["full_val_loss", "zero_shot", *(k for k, v in extra(run).items() if isinstance(v, float))]
        out.append({**arm, "label": label(arm), "seeds": per_seed,
                    **{key: mean_spread([r[key] for r in per_seed]) for key in keys},
                    "flops_to_target": [r["flops_to_target"] for r in per_seed],
                    "final_gap_to_scratch_curve": mean_spread([r["gap_to_scratch_at_equal_flops"][-1][1]
                                                               for r in per_seed])})
    return out


def against_scratch(run_curve: list, scratch_curve: list, staging: Staging, tokens: int, small_flops: float,
                    big_flops: float) -> dict:
    """A staged run's curve (iterations stage1 … total) against the big model's scratch curve, in training compute
    with stage 1 counted (small_flops, big_flops: FLOPs per token): its gap at equal compute, where scratch
    overtakes it, and the compute it needs to reach the scratch model's final loss (× the scratch run's)."""
    scratch_flops = staging.total * tokens * big_flops
    curve = [[staging.stage1 * tokens * small_flops + (i - staging.stage1) * tokens * big_flops, v]
             for i, v in run_curve]
    target = scratch_curve[-1][1]  # the scratch model's final loss (same seed, same eval batches)
    hit = next((f for f, v in curve if v <= target), None)
    scratch_at = [interpolate([(i * tokens * big_flops, v) for i, v in scratch_curve], f) for f, _ in curve]
    gaps = [[f / scratch_flops, v / r - 1] for (f, v), r in zip(curve, scratch_at)]
    return {"scratch_overtakes_at": next((f for f, gap in gaps if gap > 0), None),
            "flops_to_target": None if hit is None else hit / scratch_flops, "gap_to_scratch_at_equal_flops": gaps}


def interpolate(points: list[tuple[float, float]], x: float) -> float:
    """Linear interpolation of y at x on a sorted (x, y) curve (clamped at the ends)."""
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if x0 <= x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return points[-1][1] if x > points[-1][0] else points[0][1]


def residual_rows(model_dir: str) -> tuple[torch.Tensor, dict]:
    """The residual stream after every block (rows of N×width) on 16 val sequences (eval seed 0), and the checkpoint."""
    model_, ckpt = load_model(model_dir)
    x, _ = BatchLoader(data_dir_for_checkpoint(ckpt), model_.config.block_size, 16).get_batch("val", 0)
    with torch.no_grad():
        _, _, hidden = model_(x, return_hidden=True)
    return torch.cat([h.reshape(-1, h.shape[-1]) for h in hidden[1:]]), ckpt


def range_energy(continued_dir: str) -> float:
    """Fraction of the continued model's residual energy that stays in range(T) (the old directions)."""
    H, ckpt = residual_rows(continued_dir)
    return 1 - geo.energy_outside_range(H, ckpt["transform"]["T"])
