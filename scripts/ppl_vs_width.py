"""
ppl_vs_width: zero-shot loss of every map × rule × width; recovery of one-factor comparisons
(scripts/ppl_vs_width.sh).
"""
from __future__ import annotations

import statistics
import time

from base_models import RANDOM_KINDS, RATIOS, finetune_recipe, model, paper_domain, shape
from figures import finish_zero_shot_axis, plt, rule_label, savefig, zero_shot_curve
from harness import (
    Setting,
    canonical,
    each,
    full_val_loss,
    mean_spread,
    recovery,
    save,
    transformed,
    width,
)

FINETUNED = {  # each group varies one factor; map seed 0 throughout
    "rule (same Gaussian T, m/d = 0.75)": [("gaussian", "residual", 0.75), ("gaussian", "sandwich", 0.75),
                                           ("gaussian", "paper_code", 0.75)],
    "map (residual rule, m/d = 0.5)": [("gaussian", "residual", 0.5), ("orthogonal", "residual", 0.5),
                                       ("pca", "residual", 0.5)],
    "growth (orthogonal T, m/d = 2)": [("orthogonal", "residual", 2.0), ("orthogonal", "sandwich", 2.0)],
}


def zero_shot_grid() -> list[tuple[str, str, bool]]:
    """(porting, kind, restore_attn_scale) rows of the zero-shot table."""
    rows = [("residual", k, False) for k in RANDOM_KINDS + ("pca",)]
    rows += [("sandwich", k, False) for k in RANDOM_KINDS + ("pca",)]
    rows += [("sandwich", k, True) for k in ("gaussian", "orthogonal")]
    rows += [("paper_code", k, False) for k in ("gaussian", "orthogonal")]
    return rows


def ppl_vs_width(s: Setting) -> None:
    t0 = time.time()
    base = model(s, "base")
    d, n_head = shape(base)

    def row(cell: tuple) -> dict:
        porting, kind, restore, ratio = cell
        m = width(ratio, d, n_head)
        seeds = s.seeds if kind in RANDOM_KINDS else (0,)
        zero_shot = each(seeds, lambda seed: transformed(s, base, m, kind, porting, seed=seed,
                                                         restore_attn_scale=restore)[1]["val_loss_after"])
        return {"kind": kind, "porting": porting, "restore_attn_scale": restore, "ratio": ratio, "m": m,
                "in_paper_domain": paper_domain(kind, porting, ratio), "zero_shot": mean_spread(zero_shot)}

    rows = each([(porting, kind, restore, ratio) for porting, kind, restore in zero_shot_grid() for ratio in RATIOS
                 if not (kind == "pca" and ratio > 1)], row)

    def recovered(cell: tuple) -> dict:
        group, (kind, porting, ratio) = cell
        m = width(ratio, d, n_head)
        src, record = transformed(s, base, m, kind, porting)
        control = base if porting == "paper_code" else canonical(s, base)  # paper_code keeps the architecture
        return {"group": group, "kind": kind, "porting": porting, "ratio": ratio, "m": m,
                "zero_shot": record["val_loss_after"], **recovery(s, src, control)}

    recoveries = each([(group, arm) for group, arms in FINETUNED.items() for arm in arms], recovered)
    payload = {"d": d, "reference_val_loss": full_val_loss(base, s.device), "rows": rows, "recovery": recoveries,
               "finetune": finetune_recipe(s)}
    plot_ppl_vs_width(payload)
    save("ppl_vs_width", payload, t0, s)


def plot_ppl_vs_width(r: dict) -> None:
    rules = list(dict.fromkeys(rule_label(row) for row in r["rows"]))
    fig, axes = plt().subplots(1, len(rules) + 1, figsize=(5.5 * (len(rules) + 1), 4.8), sharey=False)
    for ax, rule in zip(axes, rules):
        for kind in dict.fromkeys(row["kind"] for row in r["rows"]):
            zero_shot_curve(ax, [row for row in r["rows"] if row["kind"] == kind and rule_label(row) == rule], kind)
        finish_zero_shot_axis(ax, r["reference_val_loss"], f"zero-shot, porting = {rule}")
    ax = axes[-1]
    for row in r["recovery"]:
        steps = [p[0] for p in row["seeds"][0]["gap_to_control"]]
        gaps = [statistics.fmean(run["gap_to_control"][i][1] for run in row["seeds"]) for i in range(len(steps))]
        ax.plot(steps, [100 * g for g in gaps], label=f"{row['kind']} {row['porting']} m/d={row['ratio']:g}")
    ax.axhline(1, color="k", ls=":", lw=1, label="recovered: 1% above the control")
    ax.set_yscale("symlog", linthresh=1)
    ax.set_title(f"finetuning: gap to the control (mean of {r['finetune']['seeds']} seeds)", fontsize=9)
    ax.set_xlabel("finetune step")
    ax.set_ylabel("val / control − 1 (%)")
    ax.legend(fontsize=6)
    fig.suptitle(f"Val loss vs width ratio (d = {r['d']})")
    fig.tight_layout()
    savefig(fig, "ppl_vs_width", "ppl_vs_width.png")
