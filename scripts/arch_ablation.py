"""
arch_ablation: which variant recovers fastest, for the paper's rule and ours at the same map and width
(scripts/arch_ablation.sh).
"""
from __future__ import annotations

import statistics
import time

from base_models import VARIANTS, finetune_recipe, model, shape
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
from lgpt.plumbing.checkpoint import load_model

ABLATION_MAP = ("gaussian", 0.75)  # the paper's JL map, inside its domain (m < d); map seed 0 for every arm


def arch_ablation(s: Setting) -> None:
    t0 = time.time()
    kind, ratio = ABLATION_MAP

    def row(cell: tuple) -> dict:
        variant, porting, norms = cell
        src = model(s, variant)
        d, n_head = shape(src)
        out, record = transformed(s, src, width(ratio, d, n_head), kind, porting, norms)
        control = canonical(s, src, norms)
        return {"variant": variant, "porting": porting, "norms": norms, "head_after": load_model(out)[0].config.head,
                "zero_shot": record["val_loss_after"], "notes": record["notes"], **recovery(s, out, control),
                "reference": full_val_loss(src, s.device)}  # last: evaluated once the runs above are in

    # fold unties tied and KNN heads; scalar keeps the head the variant has
    rows = each([(variant, porting, norms) for variant in VARIANTS for porting, norms in
                 [("residual", "fold"), ("sandwich", "fold")]
                 + ([("residual", "scalar")] if variant in ("tied_head", "knn_head") else [])], row)
    payload = {"map": {"kind": kind, "ratio": ratio}, "rows": rows, "finetune": finetune_recipe(s)}
    plot_arch_ablation(payload)
    save("arch_ablation", payload, t0, s)


def plot_arch_ablation(r: dict) -> None:
    arms = list(dict.fromkeys((row["porting"], row["norms"]) for row in r["rows"]))
    fig, axes = plt().subplots(1, len(arms), figsize=(6.5 * len(arms), 4.8), squeeze=False)
    for ax, (porting, norms) in zip(axes[0], arms):
        for row in [row for row in r["rows"] if (row["porting"], row["norms"]) == (porting, norms)]:
            steps = [p[0] for p in row["seeds"][0]["gap_to_control"]]
            gaps = [statistics.fmean(run["gap_to_control"][i][1] for run in row["seeds"]) for i in range(len(steps))]
            ax.plot(steps, [100 * g for g in gaps], marker=".", label=row["variant"])
        ax.axhline(1, color="k", ls=":", lw=1, label="recovered (1% above the control)")
        ax.set_yscale("symlog", linthresh=1)
        ax.set_title(f"{r['map']['kind']} m/d={r['map']['ratio']:g}, porting={porting}, norms={norms}", fontsize=9)
        ax.set_xlabel("finetune step")
        ax.set_ylabel(f"val / control − 1 (%), mean of {r['finetune']['seeds']} seeds")
        ax.legend(fontsize=8)
    fig.tight_layout()
    savefig(fig, "arch_ablation", "recovery_curves.png")
