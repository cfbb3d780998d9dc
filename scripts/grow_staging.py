"""
grow_staging: train at d, grow everything to the standard 2d model, continue; vs the 2d model from scratch
(scripts/grow_staging.sh).
"""
from __future__ import annotations

import statistics
import time

from figures import plt, savefig
from growth import (
    CLONE_NOISE,
    GROW_ARMS,
    GROW_NOISE,
    arm_label,
    grow_arm,
    grow_models,
    grow_settings,
    range_energy,
    staged_arms,
    staged_baselines,
    val_curve,
    with_iters,
)
from harness import (
    Setting,
    each,
    full_val_loss,
    save,
    trained,
)


def grow_runs(s: Setting) -> None:
    """Build every continued run grow_staging reads (with its stage-1 and scratch models)."""
    each([(seed, arm) for seed in s.seeds for arm in GROW_ARMS],
         lambda cell: grow_arm(s, grow_models(s, cell[0])[0], cell[1], cell[0]))


def grow_staging(s: Setting) -> None:
    t0 = time.time()
    staging, small, big = grow_settings(s)
    pairs = [grow_models(s, seed) for seed in s.seeds]
    result = staged_baselines(s, staging, big, pairs)
    costs = result.pop("costs")
    result["flops_per_token"] = {"d": costs[2], "2d": costs[3]}
    # the small model not grown: stage 1's run continued at width d to the end (its first iterations are stage 1's)
    not_grown = [trained(s, "grow_small_full", args=with_iters(small, staging.total), seed=seed) for seed in s.seeds]
    arms = staged_arms(s, GROW_ARMS, arm_label, grow_arm, pairs, result["scratch"], costs,
                       lambda run: {"energy_outside_range_T": 1 - range_energy(run["out_dir"])})
    result.update({"grow_noise": GROW_NOISE, "clone_noise": CLONE_NOISE,
                   "not_grown": [{"curve": val_curve(p), "full_val_loss": full_val_loss(p, s.device)}
                                 for p in not_grown], "arms": arms})
    plot_grow_staging(result)
    save("grow_staging", result, t0, s)


def plot_grow_staging(r: dict) -> None:
    """Val loss against training compute (fraction of the scratch run's), mean over seeds; one panel per mode."""
    tokens, flops = r["tokens_per_iter"], r["flops_per_token"]
    total = 2 * r["iters_per_stage"] * tokens * flops["2d"]

    def mean_curve(curves: list, x) -> tuple[list, list]:
        return [x(i) / total for i, _ in curves[0]], [statistics.fmean(c[k][1] for c in curves)
                                                      for k in range(len(curves[0]))]

    modes = sorted({a["grow_mode"] for a in r["arms"]})
    fig, axes = plt().subplots(1, len(modes), figsize=(7 * len(modes), 5), sharey=True, squeeze=False)
    for ax, mode in zip(axes[0], modes):
        ax.plot(*mean_curve([c["curve"] for c in r["scratch"]], lambda i: i * tokens * flops["2d"]), "k-",
                label="2d from scratch")
        ax.plot(*mean_curve([c["curve"] for c in r["not_grown"]], lambda i: i * tokens * flops["d"]), "k:",
                label="stage 1 (d), then not grown: continued at d")
        ax.axhline(r["scratch_equal_compute_full_val_loss"]["mean"], color="grey", lw=0.8, ls="--",
                   label="2d from scratch at the staged compute, full val")
        offset = r["iters_per_stage"] * tokens * (flops["d"] - flops["2d"])  # stage 1 ran at d's cost
        for arm in (a for a in r["arms"] if a["grow_mode"] == mode):
            ax.plot(*mean_curve([c["curve"] for c in arm["seeds"]], lambda i, o=offset: o + i * tokens * flops["2d"]),
                    label=arm["label"])
        ax.set_xlabel("training compute / the 2d-from-scratch run's (stage 1 counted)")
        ax.set_title(f"grown d → 2d, {mode} mode (mean of n = {len(r['scratch'])} seeds)")
        ax.legend(fontsize=8)
    axes[0][0].set_ylabel("val loss (the same 50 fixed val batches for every curve)")
    low, high = axes[0][0].get_ylim()
    axes[0][0].set_ylim(top=min(high, low + 0.8))  # stage 1's first evaluations would flatten the rest
    fig.tight_layout()
    savefig(fig, "grow_staging", "grow_staging.png")
