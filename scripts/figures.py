"""
Figure helpers shared by the experiments' ``plot_<name>`` functions (scripts/report.py redraws every figure from
results/*/results.json).
"""
from __future__ import annotations

import os

import harness
from harness import (
    RESULTS,
)


def plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as pyplot
    return pyplot


def plain_log_axis(ax) -> None:
    """A log-scale y axis labelled with plain numbers (2, 3, 4) instead of 2×10⁰."""
    from matplotlib.ticker import FormatStrFormatter
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(FormatStrFormatter("%.3g"))
    ax.yaxis.set_minor_formatter(FormatStrFormatter("%.3g"))


def copy_figures(experiment: str, figures: dict[str, str]) -> None:
    """Copy run figures ({name: path}) into results/<experiment>/, removing its figures no longer made."""
    import shutil
    if not harness.writes_results():
        return
    out_dir = os.path.join(RESULTS, experiment)
    os.makedirs(out_dir, exist_ok=True)
    for old in os.listdir(out_dir):
        if old.endswith(".png") and old not in figures:
            os.remove(os.path.join(out_dir, old))
    for name, path in figures.items():
        shutil.copy(path, os.path.join(out_dir, name))


def savefig(fig, experiment: str, name: str) -> None:
    if not harness.writes_results():
        plt().close(fig)
        return
    os.makedirs(os.path.join(RESULTS, experiment), exist_ok=True)
    fig.savefig(os.path.join(RESULTS, experiment, name), dpi=110)
    plt().close(fig)


def zero_shot_curve(ax, rows: list[dict], label: str) -> None:
    """Zero-shot loss (mean ± std over seeds) against m/d."""
    if rows:
        ax.errorbar([p["ratio"] for p in rows], [p["zero_shot"]["mean"] for p in rows],
                    yerr=[p["zero_shot"]["std"] for p in rows], marker="o", capsize=3, label=label)


def finish_zero_shot_axis(ax, reference: float, title: str) -> None:
    ax.axhline(reference, color="k", lw=1, label="original model (width d)")
    plain_log_axis(ax)
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("m / d")
    ax.set_ylabel("zero-shot val loss (full val split, log scale)")
    ax.legend(fontsize=7)


def rule_label(row: dict) -> str:
    return row["porting"] + (" (attention scale restored)" if row.get("restore_attn_scale") else "")
