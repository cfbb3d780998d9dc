"""
recovery: finetuning by LM loss vs distillation from the original, against the control (issue #13;
scripts/recovery.sh).
"""
from __future__ import annotations

import statistics
import time

from base_models import finetune_recipe, model, shape
from figures import plt, savefig
from harness import (
    Setting,
    canonical,
    each,
    full_val_loss,
    recovery,
    save,
    transformed,
    width,
)
from lgpt.plumbing.checkpoint import load_checkpoint
from shrink_quality import CALIBRATION, CORRECTIONS

RECOVERY_TRANSFORMS = {  # the best shrink of shrink_quality (its cached transforms), and the paper's setting
    "pca + learned T + refit, m/d = 0.5": (0.5, "pca", "residual", {**CALIBRATION, **CORRECTIONS["learned T + all"]}),
    "pca + learned T + refit, m/d = 0.25": (0.25, "pca", "residual",
                                            {**CALIBRATION, **CORRECTIONS["learned T + all"]}),
    "paper: gaussian sandwich, m/d = 0.75": (0.75, "gaussian", "sandwich", {}),
}


RECOVERY_LOSSES = {"CE": (), "KD": ("--distill=True", "--distill_alpha=1.0"),
                   "KD + CE (α = 0.5)": ("--distill=True", "--distill_alpha=0.5")}


def recovery_curves(s: Setting) -> None:
    t0 = time.time()
    base = model(s, "base")
    d, n_head = shape(base)
    control = canonical(s, base)

    def row(cell: tuple) -> dict:
        label, loss = cell
        ratio, kind, porting, options = RECOVERY_TRANSFORMS[label]
        src, record = transformed(s, base, width(ratio, d, n_head), kind, porting, **options)
        return {"transform": label, "loss": loss, "zero_shot": record["val_loss_after"],
                **recovery(s, src, control, extra=RECOVERY_LOSSES[loss])}

    rows = each([(label, loss) for label in RECOVERY_TRANSFORMS for loss in RECOVERY_LOSSES], row)
    cfg = load_checkpoint(base)["config"]
    payload = {"rows": rows, "finetune": finetune_recipe(s), "reference_val_loss": full_val_loss(base, s.device),
               "tokens_per_iter": cfg["batch_size"] * cfg["block_size"] * cfg["gradient_accumulation_steps"],
               "base_training_tokens": cfg["max_iters"] * cfg["batch_size"] * cfg["block_size"]
               * cfg["gradient_accumulation_steps"]}
    plot_recovery(payload)
    save("recovery", payload, t0, s)


def plot_recovery(r: dict) -> None:
    transforms = list(dict.fromkeys(row["transform"] for row in r["rows"]))
    fig, axes = plt().subplots(1, len(transforms), figsize=(6 * len(transforms), 4.6), squeeze=False)
    for ax, label in zip(axes[0], transforms):
        for row in [row for row in r["rows"] if row["transform"] == label]:
            steps = [p[0] for p in row["seeds"][0]["gap_to_control"]]
            gaps = [[run["gap_to_control"][i][1] * 100 for run in row["seeds"]] for i in range(len(steps))]
            mean = [statistics.fmean(g) for g in gaps]
            line = ax.plot(steps, mean, label=row["loss"])[0]
            if len(row["seeds"]) > 1:
                spread = [statistics.stdev(g) for g in gaps]
                ax.fill_between(steps, [m - e for m, e in zip(mean, spread)], [m + e for m, e in zip(mean, spread)],
                                color=line.get_color(), alpha=0.2)
        ax.axhline(1, color="k", ls=":", lw=1, label="1% above the control")
        ax.axhline(0, color="k", lw=0.8)
        ax.set_yscale("symlog", linthresh=1)
        ax.set_title(label, fontsize=9)
        ax.set_xlabel(f"finetune step ({r['tokens_per_iter']} tokens each)")
        ax.set_ylabel(f"val / control − 1 (%), mean ± std of {r['finetune']['seeds']} seeds")
        ax.legend(fontsize=8)
    fig.tight_layout()
    savefig(fig, "recovery", "recovery.png")
