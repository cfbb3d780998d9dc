"""
grow_recipes: which width growth pays — the new directions used (fresh readers, MSG's masks), SPARKLING's recipe,
then from the best of them, one factor at a time: the switch point, the horizon, width and depth together
(scripts/grow_recipes.sh).
"""
from __future__ import annotations

import statistics
import time

import harness
from figures import plt, savefig
from growth import GROW_NOISE, continued, grow_settings, residual_rows, staged_arms, staged_baselines
from harness import (
    Setting,
    mean_spread,
    save,
    trained,
    transformed,
)
from lgpt.method import geometry as geo
from lgpt.plumbing.checkpoint import load_model
from lgpt.plumbing.configurator import load_config
from train import TrainConfig

RECIPES = {  # label: transform settings (+ the continuation's LR re-warm); each changes one factor from the row above
    # it, or (RMS kept) from today's; every arm carries AdamW, new units start with no history (SPARKLING's
    # asymmetric reset), new heads / neurons read with fresh weights at the scratch scale (grow_mode zero)
    "today's: the readers' new directions get small noise (σ = 0.1, relative), writers zero":
        {"grow_noise": GROW_NOISE},
    "fresh readers of the new directions at the scratch scale (N(0, 0.02²)), writers zero": {"grow_reader_std": 0.02},
    "MSG: fresh readers + the writers' new parts at the scratch scale behind masks opened over 100 steps":
        {"grow_reader_std": 0.02, "grow_mask_iters": 100},
    "RMS kept (the stream × √(m/d)), today's readers": {"grow_noise": GROW_NOISE, "rms_preserve": True},
    "SPARKLING: RMS kept + LR re-warm over 100 steps": {"grow_noise": GROW_NOISE, "rms_preserve": True,
                                                         "rewarm_iters": 100},
}


RECIPE_PARENTS = {  # the arm each recipe differs from by one factor
    label: parent for label, parent in zip(list(RECIPES)[1:], [0, 1, 0, 3]) for parent in [list(RECIPES)[parent]]}


SWITCHES = (0.25,)  # besides 0.5: stage 1 trains this share of the schedule
HORIZONS = (4,)  # besides 1: × the QUICK budget (2·grow_iters iterations)


def recipe_arm(s: Setting, stage1: str, arm: dict, seed: int) -> dict:
    """Stage 1 grown to the 2d model (× 2 heads and neurons, + ``arm['n_layer']`` blocks if given) by the recipe and
    trained on to the end of its schedule; the energy outside range(T) is tracked along the way (finetune.py)."""
    base = load_model(stage1)[0].config
    options = {k: v for k, v in RECIPES[arm["recipe"]].items() if k != "rewarm_iters"}
    if arm.get("n_layer"):
        options.update(n_layer=arm["n_layer"], depth_mode="interleave")
    grown, record = transformed(s, stage1, 2 * base.n_embd, "orthogonal", seed=seed, n_head=2 * base.n_head,
                                mlp_hidden=2 * base.mlp_hidden, grow_mode="zero", carry_optimizer=True, **options)
    return continued(s, stage1, grown, record, "grown-zero", RECIPES[arm["recipe"]].get("rewarm_iters", 0))


def recipe_energy(run: dict) -> dict:
    """The grown model's energy outside range(T) along training (finetune.py tracks it) and, at the end, the
    principal components that hold 95% of its residual stream's variance (``stream_dimension``)."""
    curve = run.get("energy_outside_range_T") or []
    return {"energy_curve": curve, "energy_outside_range_T": curve[-1][1] if curve else float("nan"),
            "stream_dimension": float(stream_dimension(run["out_dir"]))}


def stream_dimension(model_dir: str) -> int:
    """How many principal components hold 95% of the variance of a model's residual stream (after every block, 16
    val sequences): how much of its width a model's stream spreads over."""
    return geo.intrinsic_dimension(residual_rows(model_dir)[0])


def recipe_setting(s: Setting, name: str, recipes: list[str], horizon: int = 1, switch: float = 0.5,
                   depth: bool = False) -> dict:
    """One staging (switch, horizon; ``depth``: stage 1 also has half the blocks) with its baselines and the arms of
    ``recipes`` over the seeds."""
    read_before = set(harness.READ)  # the runs this setting reads first: its cost (shared runs count once)
    staging, small, big = grow_settings(s, horizon, switch)
    n_layer = load_config(TrainConfig, s.base).n_layer
    if depth:
        small = small + [f"--n_layer={n_layer // 2}"]
    pairs = [(trained(s, "grow_stage1", args=small, seed=seed), trained(s, "grow_scratch", args=big, seed=seed))
             for seed in s.seeds]
    result = staged_baselines(s, staging, big, pairs)
    costs = result.pop("costs")
    # how much of its width the 2d model trained from scratch uses: its energy outside its own best d dimensions
    # (what no growth can beat by leaving range(T)), and the spread of its stream and of stage 1's
    result["scratch_energy_outside_top_d"] = mean_spread([geo.energy_outside_top(
        residual_rows(b)[0], load_model(b)[0].config.n_embd // 2) for _, b in pairs])
    result["scratch_stream_dimension"] = mean_spread([float(stream_dimension(b)) for _, b in pairs])
    result["stage1_stream_dimension"] = mean_spread([float(stream_dimension(a)) for a, _ in pairs])
    arms = [{"recipe": r, **({"n_layer": n_layer} if depth else {})} for r in recipes]
    result["arms"] = staged_arms(s, arms, lambda arm: arm["recipe"], recipe_arm, pairs, result["scratch"], costs,
                                 recipe_energy)
    first_read = [v for k, v in harness.READ.items() if k not in read_before]
    return {"name": name, "horizon": horizon, "switch": switch, "depth": depth, **result,
            "cost": {"runs": len(first_read), "single_core_minutes": sum(first_read) / 60}}


def grow_recipes(s: Setting) -> None:
    """The recipes at the QUICK budget, switch 50%; then the best of them (lowest mean final loss) with one factor
    changed at a time: the switch, the horizon, and width + depth grown together."""
    t0 = time.time()
    main = recipe_setting(s, "switch 50%, QUICK budget", list(RECIPES))
    best = min(main["arms"], key=lambda arm: arm["full_val_loss"]["mean"])["recipe"]
    variations = [recipe_setting(s, f"switch {round(100 * f)}%", [best], switch=f) for f in SWITCHES]
    variations += [recipe_setting(s, f"horizon {h}× the QUICK budget", [best], horizon=h) for h in HORIZONS]
    variations.append(recipe_setting(s, "width + depth (stage 1: half width, half the blocks)", [best], depth=True))
    result = {"recipes": RECIPES, "parents": RECIPE_PARENTS, "best": best, "settings": [main, *variations]}
    plot_grow_recipes(result)
    save("grow_recipes", result, t0, s)


def plot_grow_recipes(r: dict) -> None:
    """Left: the share of the residual energy outside range(T) over training, per recipe (mean over seeds). Right:
    each arm's gap to the scratch curve at equal compute (stage 1 counted), per setting."""
    fig, (left, right) = plt().subplots(1, 2, figsize=(13, 4.5))
    for arm in r["settings"][0]["arms"]:
        curves = [seed["energy_curve"] for seed in arm["seeds"] if seed.get("energy_curve")]
        if curves:
            left.plot([i for i, _ in curves[0]], [statistics.mean(c[k][1] for c in curves)
                                                  for k in range(len(curves[0]))], marker="o", ms=3,
                      label=arm["recipe"][:48])
    left.set(yscale="log", xlabel="iteration", ylabel="residual energy outside range(T)",
             title="Do the new directions get used? (mean over seeds)")
    left.legend(fontsize=6)
    for setting in r["settings"]:
        for arm in setting["arms"]:
            gaps = [seed["gap_to_scratch_at_equal_flops"] for seed in arm["seeds"]]
            x = [f for f, _ in gaps[0]]
            y = [100 * statistics.mean(g[k][1] for g in gaps) for k in range(len(x))]
            right.plot(x, y, marker="o", ms=3, label=f"{setting['name'][:28]}: {arm['recipe'][:30]}")
    right.axhline(0, color="k", lw=0.8)
    right.set(xlabel="training compute (× the scratch run's, stage 1 counted)",
              ylabel="gap to the scratch curve at equal compute (%)", title="Below 0: ahead of scratch")
    right.legend(fontsize=5)
    savefig(fig, "grow_recipes", "grow_recipes.png")
