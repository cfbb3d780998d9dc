"""
geometry_vs_width: what each map does to the geometry of the hidden states, across widths
(scripts/geometry_vs_width.sh).
"""
from __future__ import annotations

import time

from base_models import RANDOM_KINDS, RATIOS, model, shape
from figures import plt, savefig
from harness import (
    Setting,
    each,
    geometry,
    mean_spread,
    save,
    transformed,
    width,
)

GEOMETRY_KINDS = ("gaussian", "srht", "orthogonal", "pca")
GEOMETRY_PROBES = 2048  # hidden states compared per layer: all 2.1 M pairs at the geometry experiments' N


def geometry_vs_width(s: Setting) -> None:
    t0 = time.time()
    base = model(s, "base")
    d, n_head = shape(base)

    def row(cell: tuple) -> dict:
        kind, ratio = cell
        m = width(ratio, d, n_head)
        per_seed = each(s.seeds if kind in RANDOM_KINDS else (0,), lambda seed: geometry_row(
            geometry(s, base, transformed(s, base, m, kind, seed=seed)[0], n_probes=GEOMETRY_PROBES, eval_iters=10,
                     figures=False)))
        return {"kind": kind, "m": m, "ratio": ratio,
                **{k: mean_spread([r[k] for r in per_seed]) for k in per_seed[0] if k != "jl_eps_bound"},
                "jl_eps_bound": per_seed[0]["jl_eps_bound"]}

    rows = each([(kind, ratio) for kind in GEOMETRY_KINDS for ratio in RATIOS if not (kind == "pca" and ratio > 1)],
                row)
    plot_geometry_vs_width({"d": d, "rows": rows})
    save("geometry_vs_width", {"d": d, "rows": rows, "n_points": rows[-1]["n_points"]["values"][0]}, t0, s)


def geometry_row(metrics: dict) -> dict:
    fa = metrics["feature_alignment"]
    return {"ae_map": metrics["angular_error"]["map"], "ae_model": metrics["angular_error"]["model"],
            "hc_map": metrics["concordance"]["map"]["pearson"], "hc_model": metrics["concordance"]["model"]["pearson"],
            "jl_eps_empirical_max": metrics["jl"]["empirical_eps"]["max"],
            "jl_eps_empirical_q99": metrics["jl"]["empirical_eps"]["q99"], "jl_eps_bound": metrics["jl"]["bound_eps"],
            "n_points": metrics["jl"]["n_points"], "fa_tokens": fa["frequent_tokens"],
            "fa_pcs": fa["principal_directions"], "fa_readers": fa["readers"]}


def plot_geometry_vs_width(r: dict) -> None:
    fig, axes = plt().subplots(1, 3, figsize=(17, 4.6))
    d = r["d"]
    for kind in GEOMETRY_KINDS:
        pts = [row for row in r["rows"] if row["kind"] == kind]
        ms = [p["m"] for p in pts]
        line = axes[0].plot(ms, [p["hc_map"]["mean"] for p in pts], marker="o", label=f"{kind} map-level")[0]
        color = line.get_color()
        axes[0].plot(ms, [p["hc_model"]["mean"] for p in pts], "--", marker="x", color=color,
                     label=f"{kind} model-level")
        axes[1].plot(ms, [p["ae_map"]["mean"] for p in pts], marker="o", color=color, label=f"{kind} map-level")
        axes[1].plot(ms, [p["ae_model"]["mean"] for p in pts], "--", marker="x", color=color,
                     label=f"{kind} model-level")
        axes[2].plot(ms, [p["jl_eps_empirical_max"]["mean"] for p in pts], marker="o", color=color,
                     label=f"{kind} empirical max ε")
    bound = [(p["m"], p["jl_eps_bound"]) for p in r["rows"] if p["kind"] == "gaussian" and p["jl_eps_bound"]]
    if bound:  # below the JL minimum width the lemma guarantees nothing: only the widths where it does
        axes[2].plot(*zip(*bound), "k*", markersize=12, ls=":", label="JL bound ε (δ = 0.05); none < 1 below")
    for ax, (title, ylabel) in zip(axes, [("hyperspherical concordance", "HC (Pearson)"),
                                          ("angular error", "AE (radians)"),
                                          ("pairwise distance distortion", "ε")]):
        ax.axvline(d, color="grey", lw=0.8)
        ax.set_title(title)
        ax.set_xlabel("new width m (grey: d)")
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=7)
    fig.tight_layout()
    savefig(fig, "geometry_vs_width", "geometry_vs_width.png")
