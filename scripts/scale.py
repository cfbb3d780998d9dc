"""
scale: every headline finding across base widths d (issue #25; scripts/scale.sh).
"""
from __future__ import annotations

import os
import time

from base_models import RANDOM_KINDS, finetune_recipe, model
from figures import plt, savefig
from geometry_vs_width import GEOMETRY_PROBES, geometry_row
from harness import (
    ROOT,
    Setting,
    canonical,
    each,
    full_val_loss,
    geometry,
    mean_spread,
    recovery,
    save,
    trained,
    transformed,
    width,
)
from lgpt.plumbing.checkpoint import load_model
from lgpt.plumbing.configurator import load_config
from recovery import RECOVERY_LOSSES
from shrink_quality import CALIBRATION, CORRECTIONS
from train import TrainConfig

SCALE_HEAD_SIZE = {"char": 32, "bpe": 32, "owt": 64}  # n_head = d / head size: only the width changes with d
SCALE_SEEDS_AT_ENDS = 3  # training seeds at the smallest and the largest char width (the yardstick at both ends)
SCALE_RATIOS = (0.25, 0.5, 0.75)
SCALE_EXACT_RATIOS = (1.5, 2.0)  # exactness: residual porting, orthogonal map (seed 0): exact at m ≥ d
SCALE_AT = 0.5  # geometry, recovery and the training-seed yardstick are measured at m/d = 0.5
SCALE_METHODS = {  # label: (kind, porting, options); the random kind gets n = 3 map seeds
    "paper: Gaussian sandwich": ("gaussian", "sandwich", {}),  # Algorithm 1, inside its domain (m < d)
    "residual, Gaussian": ("gaussian", "residual", {}),
    "residual, PCA": ("pca", "residual", CALIBRATION),
    "recommended: PCA + learned T + refit": ("pca", "residual", {**CALIBRATION, **CORRECTIONS["learned T + all"]}),
}


SCALE_RECOVERED = ("residual, Gaussian", "recommended: PCA + learned T + refit")


# QUICK measures recovery on the char family only: a BPE finetune step costs ~10× a char one on the CPU (the
# 50257-way softmax), 30 BPE finetunes would double the experiment; the GPU setting measures every family
SCALE_LOSSES = ("CE", "KD + CE (α = 0.5)")
SCALE_EXTRAPOLATE = (768, 2048)  # GPT-2 small, a 1B-class Llama


def scale_widths(s: Setting) -> dict[str, tuple[int, ...]]:
    """Base widths per family. QUICK: 4-layer character models d = 64…512 and 4-layer BPE models d = 128, 256 on
    tinyshakespeare, every one with its family's CPU recipe (same tokens, same schedule). GPU: 12-layer GPT-2-small
    shapes on OpenWebText, d = 256…1024."""
    return {"char": (64, 128, 256, 512), "bpe": (128, 256)} if s.quick else {"owt": (256, 512, 768, 1024)}


def scale_overlays(s: Setting, family: str) -> list[str]:
    return {"char": [], "bpe": [os.path.join(ROOT, "configs", "shakespeare.py")],
            "owt": [os.path.join(ROOT, "configs", "openwebtext.py")]}[family]


def scale_seeds(s: Setting, family: str, d: int) -> tuple[int, ...]:
    first = next(iter(scale_widths(s)))  # the first family (char in QUICK) carries the training-seed yardstick
    ends = scale_widths(s)[first] if family == first else ()
    return s.seeds[:SCALE_SEEDS_AT_ENDS] if d in (ends[:1] + ends[-1:]) else s.seeds[:1]


def scale_model(s: Setting, family: str, d: int, seed: int = 0) -> str:
    """The family's base model at width d (n_head = d / 32), trained with the family's recipe unchanged."""
    if family == "char" and s.quick and d == load_config(TrainConfig, s.base).n_embd:
        return model(s, "base", seed=seed)  # the Results' own base model: the same run, one cache entry
    return trained(s, f"scale_{family}_d{d}", scale_overlays(s, family),
                   [f"--n_embd={d}", f"--n_head={d // SCALE_HEAD_SIZE[family]}"], seed=seed, curve=False)


def scale_transform(s: Setting, base: str, d: int, n_head: int, method: str, ratio: float, seed: int = 0):
    kind, porting, options = SCALE_METHODS[method]
    return transformed(s, base, width(ratio, d, n_head), kind, porting, seed=seed, **options)


def relative_gap(loss: float, reference: float) -> float:
    return loss / reference - 1


def scale_width(s: Setting, family: str, d: int) -> dict:
    """Every measurement of one base width on its seed-0 model: zero-shot gaps, exactness, geometry and recovery
    at m/d = 0.5."""
    base, n_head = scale_model(s, family, d), d // SCALE_HEAD_SIZE[family]
    reference = full_val_loss(base, s.device)
    zero_shot = [{"method": method, "ratio": ratio, "m": width(ratio, d, n_head),
                  "gap": scale_gaps(s, base, d, n_head, method, ratio, reference, s.seeds)}
                 for method in SCALE_METHODS for ratio in SCALE_RATIOS]
    exact = [abs(transformed(s, base, width(ratio, d, n_head), "orthogonal")[1]["val_loss_after"] - reference)
             for ratio in SCALE_EXACT_RATIOS]
    m = width(SCALE_AT, d, n_head)
    geometry_rows, reports = {}, {}
    for kind in ("gaussian", "pca"):
        options = {} if kind in RANDOM_KINDS else CALIBRATION
        seeds = s.seeds if kind in RANDOM_KINDS else (0,)
        reports[kind] = [geometry(s, base, transformed(s, base, m, kind, seed=seed, **options)[0],
                                  n_probes=GEOMETRY_PROBES, eval_iters=10, figures=False) for seed in seeds]
        per_seed = [geometry_row(r) for r in reports[kind]]
        geometry_rows[kind] = {k: mean_spread([r[k] for r in per_seed]) for k in per_seed[0] if k != "jl_eps_bound"}
        geometry_rows[kind]["jl_eps_bound"] = per_seed[0]["jl_eps_bound"]
    control = canonical(s, base)
    recoveries = []
    for method in SCALE_RECOVERED if family != "bpe" else ():
        src = scale_transform(s, base, d, n_head, method, SCALE_AT)[0]
        recoveries += [{"method": method, "loss": loss, **recovery(s, src, control, extra=RECOVERY_LOSSES[loss])}
                       for loss in SCALE_LOSSES]
    for row in recoveries:  # the curves stay in the runs; the tables read the summaries
        for run in row["seeds"]:
            run.pop("curve"), run.pop("control_curve")
    return {"family": family, "d": d, "n_head": n_head, "params": load_model(base)[0].get_num_params(),
            "reference_val_loss": reference, "zero_shot": zero_shot, "exact_max_abs_delta": max(exact),
            "geometry_m": m, "geometry": geometry_rows, "recovery": recoveries,
            # principal components holding 95% of the original's residual variance (embeddings, then each block)
            "intrinsic_dimension": reports["pca"][0]["models"]["ref"]["intrinsic_dimension"]}


def scale_gaps(s: Setting, base: str, d: int, n_head: int, method: str, ratio: float, reference: float,
               seeds: tuple[int, ...]) -> dict:
    """Zero-shot gaps (val / original − 1, full val split) of one method at one m/d, over the map seeds (one for
    PCA)."""
    seeds = seeds if SCALE_METHODS[method][0] in RANDOM_KINDS else (0,)
    return mean_spread([relative_gap(scale_transform(s, base, d, n_head, method, ratio, seed)[1]["val_loss_after"],
                                     reference) for seed in seeds])


def scale_yardstick(s: Setting, family: str, d: int) -> dict:
    """The training-seed spread at one width: every trained model's val loss and its gaps at m/d = 0.5 (map seed
    0), so a difference between widths can be read against the difference between two trainings of one width."""
    bases = each(scale_seeds(s, family, d), lambda seed: scale_model(s, family, d, seed))  # lanes split the seeds
    n_head = d // SCALE_HEAD_SIZE[family]
    references = [full_val_loss(b, s.device) for b in bases]
    return {"family": family, "d": d, "val_loss": mean_spread(references),
            "gap": {method: mean_spread([scale_gaps(s, b, d, n_head, method, SCALE_AT, ref, (0,))["mean"]
                                         for b, ref in zip(bases, references)]) for method in SCALE_METHODS}}


def loglog_fit(ds: list[int], ys: list[float], at: tuple[int, ...] = ()) -> dict:
    """Least-squares line log y = a + b·log d: the slope b with its 95% interval (t with n − 2 degrees of
    freedom; none from two points), the factor per doubling of d (2^b), and y predicted at ``at`` with its 95%
    prediction interval — extrapolations, not findings."""
    import numpy as np
    from scipy import stats
    x, y = np.log(np.asarray(ds, float)), np.log(np.asarray(ys, float))
    n = len(x)
    b, a = np.polyfit(x, y, 1)
    fit = {"n": n, "slope": float(b), "per_doubling": float(2 ** b), "slope_ci": None, "predict": {}}
    if n > 2:
        resid = y - (a + b * x)
        s2 = float(resid @ resid) / (n - 2)
        sxx = float(((x - x.mean()) ** 2).sum())
        t = float(stats.t.ppf(0.975, n - 2))
        half = t * (s2 / sxx) ** 0.5
        fit["slope_ci"] = [float(b - half), float(b + half)]
        for d in at:
            x0 = np.log(d)
            spread = t * (s2 * (1 + 1 / n + (x0 - x.mean()) ** 2 / sxx)) ** 0.5
            centre = a + b * x0
            fit["predict"][str(d)] = [float(np.exp(centre)), float(np.exp(centre - spread)),
                                      float(np.exp(centre + spread))]
    return fit


def scale_fits(s: Setting, rows: list[dict]) -> list[dict]:
    """Log–log fits of the zero-shot gap against d per family, method and m/d, and of PCA's advantage."""
    fits = []
    for family in scale_widths(s):
        for method in SCALE_METHODS:
            for ratio in SCALE_RATIOS:
                points = [(row["d"], cell["gap"]["mean"]) for row in rows if row["family"] == family
                          for cell in row["zero_shot"] if cell["method"] == method and cell["ratio"] == ratio]
                if len(points) > 1 and all(g > 0 for _, g in points):
                    fits.append({"family": family, "method": method, "ratio": ratio,
                                 **loglog_fit(*zip(*points), at=SCALE_EXTRAPOLATE)})
            if method == "residual, PCA":  # PCA's advantage: the Gaussian map's gap over PCA's, against d
                gaps = {(row["d"], c["method"]): c["gap"]["mean"] for row in rows if row["family"] == family
                        for c in row["zero_shot"] if c["ratio"] == SCALE_AT}
                ds = sorted({d for d, _ in gaps})
                ratios = [gaps[(d, "residual, Gaussian")] / gaps[(d, method)] for d in ds]
                if len(ds) > 1 and all(x > 0 for x in ratios):
                    fits.append({"family": family, "method": "advantage: Gaussian gap / PCA gap", "ratio": SCALE_AT,
                                 **loglog_fit(ds, ratios, at=SCALE_EXTRAPOLATE)})
    return fits


def scale(s: Setting) -> None:
    t0 = time.time()
    widths = [(family, d) for family, ds in scale_widths(s).items() for d in ds]
    rows = each(widths, lambda cell: scale_width(s, *cell))
    fits = scale_fits(s, rows)
    payload = {"rows": rows, "fits": fits, "ratios": SCALE_RATIOS, "exact_ratios": SCALE_EXACT_RATIOS,
               "at": SCALE_AT, "head_size": SCALE_HEAD_SIZE, "finetune": finetune_recipe(s),
               "losses": {loss: list(RECOVERY_LOSSES[loss]) for loss in SCALE_LOSSES}, "n_probes": GEOMETRY_PROBES,
               "calibration_sequences": 16 * 16, "learn_steps": CORRECTIONS["learned T + all"]["learn_steps"],
               "yardstick": []}
    plot_scale(payload)
    save("scale", payload, t0, s)  # the headline rows first: the extra training seeds are the longest runs
    for family, ds in scale_widths(s).items():  # smallest first; saved as each width's yardstick is in
        for d in ds:
            if len(scale_seeds(s, family, d)) > 1:
                payload["yardstick"].append(scale_yardstick(s, family, d))
                save("scale", payload, t0, s)


def plot_scale(r: dict) -> None:
    """Zero-shot gap against base width d, log–log, one panel per m/d: a line per method and family (mean over map
    seeds, ± their std), its fitted slope [95% interval] in the legend, and the JL bound's slope (−1/2) beside."""
    ratios = r["ratios"]
    fig, axes = plt().subplots(1, len(ratios), figsize=(6 * len(ratios), 5), squeeze=False)
    styles = {"char": "-", "bpe": "--", "owt": "-"}
    fits = {(f["family"], f["method"], f["ratio"]): f for f in r["fits"]}
    for ax, ratio in zip(axes[0], ratios):
        colors = {}
        for family in dict.fromkeys(row["family"] for row in r["rows"]):
            rows = [row for row in r["rows"] if row["family"] == family]
            for method in dict.fromkeys(c["method"] for c in rows[0]["zero_shot"]):
                cells = [(row["d"], c["gap"]) for row in rows for c in row["zero_shot"]
                         if c["method"] == method and c["ratio"] == ratio]
                fit = fits.get((family, method, ratio))
                slope = "" if fit is None else f", slope {fit['slope']:+.2f}" + (
                    "" if fit["slope_ci"] is None else " [{:+.2f}, {:+.2f}]".format(*fit["slope_ci"]))
                line = ax.errorbar([d for d, _ in cells], [100 * g["mean"] for _, g in cells],
                                   yerr=[100 * g["std"] for _, g in cells], ls=styles[family], marker="o", capsize=3,
                                   color=colors.get(method), label=f"{family}: {method}{slope}")
                colors[method] = line[0].get_color()
        anchor = [(row["d"], c["gap"]["mean"]) for row in r["rows"] for c in row["zero_shot"]
                  if row is r["rows"][0] and c["method"] == "residual, Gaussian" and c["ratio"] == ratio]
        if anchor:  # the JL bound: ε ∝ 1/√m = 1/√(ratio·d), a slope of −1/2 through the first Gaussian point
            d0, g0 = anchor[0]
            ds = sorted({row["d"] for row in r["rows"]})
            ax.plot(ds, [100 * g0 * (d / d0) ** -0.5 for d in ds], "k:", lw=1.5, label="JL bound's slope (ε ∝ 1/√m)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("base width d (log scale)")
        ax.set_ylabel("zero-shot gap: val / original − 1 (%, full val split)")
        ax.set_title(f"m/d = {ratio:g}", fontsize=10)
        ax.legend(fontsize=6)
    fig.suptitle("Does the transform work better as the model grows? (char: solid, BPE: dashed)")
    fig.tight_layout()
    savefig(fig, "scale", "scale.png")
