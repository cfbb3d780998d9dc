"""
The experiments behind scripts/*.sh, run by name. Each lives in its own file beside its .sh (scripts/NAME.py: its
settings, its runs, its result and its figure ``plot_NAME``) over the cache of scripts/harness.py; what several share
is in base_models.py (the trained models), growth.py (the growth experiments' staging) and figures.py; its table is
scripts/report.py's function of the same name. This file is the runner: the registry, lanes and --cost.

    python scripts/experiments.py ppl_vs_width [more experiments] [--quick]      (QUICK=1 works too)
    python scripts/experiments.py models ppl_vs_width --lane 0 --lanes 2        (lane 0 of 2 sharing the work)

--quick: the CPU setting (configs/shakespeare_char.py). Default: the GPU setting (+ configs/gpu.py, longer
finetunes, 5 seeds). Runs are cached in runs/ by a hash of their full configuration, so experiments share them
and a re-run only builds what changed. Adding an ablation: add a variant in configs/variants/ and its name to
base_models.VARIANTS, or a line to the experiment's grid in its file.

One factor at a time: rules are compared with the same T (kind, seed, width), maps with the same rule.
Recovery is always against a control — the untransformed model (canonical form, same width) finetuned with
the identical recipe, data order and eval batches. Zero-shot numbers are on the full val split; finetuning
curves on fixed eval batches (the same for every arm and seed).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("MPLBACKEND", "Agg")

import torch  # noqa: E402

import harness  # noqa: E402
from arch_ablation import arch_ablation, plot_arch_ablation  # noqa: E402
from base_models import model, model_list, scratch_model  # noqa: E402
from geometry_vs_width import geometry_vs_width, plot_geometry_vs_width  # noqa: E402
from grow_depth import grow_depth  # noqa: E402
from grow_recipes import grow_recipes, plot_grow_recipes  # noqa: E402
from grow_staging import grow_runs, grow_staging, plot_grow_staging  # noqa: E402
from harness import Setting, each  # noqa: E402
from heads import heads  # noqa: E402
from heatmaps import heatmaps  # noqa: E402
from lgpt.plumbing.cli import run_cli  # noqa: E402
from lgpt.plumbing.errors import ConfigError  # noqa: E402
from ppl_vs_width import plot_ppl_vs_width, ppl_vs_width  # noqa: E402
from quantization import quantization  # noqa: E402
from recovery import plot_recovery, recovery_curves  # noqa: E402
from sandwich_ablation import sandwich_ablation  # noqa: E402
from scale import plot_scale, scale  # noqa: E402
from shrink_quality import SHRINK_RATIOS, plot_shrink_quality, shrink_quality  # noqa: E402
from shrink_vs_scratch import plot_shrink_vs_scratch_rates, shrink_vs_scratch, shrink_vs_scratch_rates  # noqa: E402


def models(s: Setting) -> None:
    """Train every model of ``model_list`` and shrink_quality's from-scratch models, and build grow_staging's runs
    (lanes share them through ``each``): the long runs first, so no lane ends on one."""
    each(model_list(s), lambda entry: model(s, *entry[0], seed=entry[1]))
    each(SHRINK_RATIOS, lambda ratio: scratch_model(s, ratio))
    grow_runs(s)


PLOTS = {"ppl_vs_width": plot_ppl_vs_width, "shrink_quality": plot_shrink_quality, "recovery": plot_recovery,
         "geometry_vs_width": plot_geometry_vs_width, "arch_ablation": plot_arch_ablation,
         "grow_staging": plot_grow_staging, "scale": plot_scale, "grow_recipes": plot_grow_recipes,
         "shrink_vs_scratch_rates": plot_shrink_vs_scratch_rates}


def replot(experiment: str, payload: dict) -> None:
    """Redraw an experiment's figure from its results.json (scripts/report.py calls this)."""
    if experiment in PLOTS:
        PLOTS[experiment](payload)


EXPERIMENTS = {f.__name__: f for f in (ppl_vs_width, geometry_vs_width, heatmaps, arch_ablation, heads,
                                       grow_staging, quantization, shrink_quality, scale, sandwich_ablation,
                                       grow_depth, grow_recipes, shrink_vs_scratch,
                                       shrink_vs_scratch_rates)} | {
    "recovery": recovery_curves}


def run_experiment(name: str, s: Setting) -> None:
    torch.manual_seed(0)
    harness.READ.clear()
    models(s) if name == "models" else EXPERIMENTS[name](s)


def in_lanes(s: Setting, names: list[str], lane: int, lanes: int, poll: float = 15.0) -> None:
    """Lane ``lane`` of ``lanes`` processes that share the work of ``names`` (scripts/all.sh runs two). Every lane
    walks every experiment, odd lanes from the back of the list (and of each grid); the owner of an experiment
    (position modulo ``lanes``) writes its results, the others only build its runs. A run another lane is building
    is passed over (Busy), and its experiment is come back to once that run is done or its lane has died."""
    harness.SKIP_BUSY, harness.LANE = True, lane
    pending = {name: None for name in (names if lane % 2 == 0 else reversed(names))}  # name → run it waits for
    while pending:
        built = len(harness.BUILT)
        for name, waiting_for in list(pending.items()):
            if waiting_for is not None and harness.building_elsewhere(waiting_for):
                continue
            harness.PREFETCH = names.index(name) % lanes != lane
            try:
                run_experiment(name, s)
                del pending[name]
            except harness.Busy as busy:
                pending[name] = busy.path
                print(f"lane {lane}: {name} waits for {busy} (another lane is building it)", flush=True)
        if pending and len(harness.BUILT) == built:
            time.sleep(poll)
    harness.PREFETCH = False


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("experiments", nargs="+", choices=sorted(EXPERIMENTS) + ["models"])
    parser.add_argument("--quick", action="store_true", help="CPU sizes (also QUICK=1)")
    parser.add_argument("--lane", type=int, default=0, help="which of --lanes processes this is (0-based)")
    parser.add_argument("--lanes", type=int, default=1, help="how many processes share the work (scripts/all.sh: "
                        "2, one per core); each builds what the others are not building")
    parser.add_argument("--cost", action="store_true", help="build and write nothing: sum the recorded build "
                        "times of the cached runs these experiments read (what they cost from an empty cache)")
    args = parser.parse_args(argv)
    if not 0 <= args.lane < args.lanes:
        raise ConfigError(f"--lane={args.lane} must be in 0..{args.lanes - 1} (--lanes={args.lanes})")
    quick = args.quick or os.environ.get("QUICK", "0") not in ("", "0")
    setting = Setting(quick)
    if args.lanes > 1 and not args.cost:
        in_lanes(setting, list(dict.fromkeys(args.experiments)), args.lane, args.lanes)
        return
    if args.cost:
        harness.TRACE = {}
    costs = {}
    for name in args.experiments:
        before = set(harness.TRACE or ())
        run_experiment(name, setting)
        if args.cost:
            costs[name] = sum(v for k, v in harness.TRACE.items() if k not in before)
    if args.cost:
        total = sum(harness.TRACE.values())
        for name, seconds in costs.items():
            print(f"{name}: {seconds / 60:.1f} min of runs first read here")
        stages = {}
        for path, seconds in harness.TRACE.items():
            stage = os.path.basename(path).split("-")[0]
            stages[stage] = stages.get(stage, 0.0) + seconds
        print("by stage: " + ", ".join(f"{k} {v / 60:.1f} min" for k, v in sorted(stages.items())))
        print(f"{len(harness.TRACE)} runs, {total / 60:.1f} single-core minutes in all "
              f"(two lanes: at best {total / 120:.1f} min)")


if __name__ == "__main__":  # an interrupted run exits 130 and leaves no completion marker
    raise SystemExit(run_cli(main))
