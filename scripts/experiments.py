"""
The experiments behind scripts/*.sh. Each is one short unit — its grid, its runs, its result — over the cache
of scripts/harness.py; its table is scripts/report.py's function of the same name, its figure ``plot_<name>``.

    python scripts/experiments.py ppl_vs_width [more experiments] [--quick]      (QUICK=1 works too)
    python scripts/experiments.py models ppl_vs_width --lane 0 --lanes 2        (lane 0 of 2 sharing the work)

--quick: the CPU setting (configs/shakespeare_char.py). Default: the GPU setting (+ configs/gpu.py, longer
finetunes, 5 seeds). Runs are cached in runs/ by a hash of their full configuration, so experiments share them
and a re-run only builds what changed. Adding an ablation: add a variant in configs/variants/ and its name to
VARIANTS, or a line to a grid below.

One factor at a time: rules are compared with the same T (kind, seed, width), maps with the same rule.
Recovery is always against a control — the untransformed model (canonical form, same width) finetuned with
the identical recipe, data order and eval batches. Zero-shot numbers are on the full val split; finetuning
curves on fixed eval batches (the same for every arm and seed).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import NamedTuple

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("MPLBACKEND", "Agg")

import torch  # noqa: E402

import geometry as geo  # noqa: E402
import harness  # noqa: E402
from checkpoint import load_checkpoint, load_model  # noqa: E402
from cli import run_cli  # noqa: E402
from configurator import load_config  # noqa: E402
from dataset import BatchLoader, data_dir_for_checkpoint, evaluate_loss  # noqa: E402
from errors import ConfigError  # noqa: E402
from finetune import FinetuneConfig, finetune  # noqa: E402
from harness import (  # noqa: E402
    RESULTS,
    ROOT,
    Setting,
    cached,
    canonical,
    each,
    full_val_loss,
    geometry,
    mean_spread,
    recovery,
    save,
    spec_of,
    trained,
    transformed,
    width,
)
from logger import read_metrics  # noqa: E402
from train import TrainConfig  # noqa: E402

RATIOS = (0.25, 0.5, 0.75, 1.0, 1.5, 2.0)
RANDOM_KINDS = ("gaussian", "rademacher", "sparse", "srht", "orthogonal")
VARIANTS = ("base", "peri_ln", "scalar_gain", "rmsnorm", "tied_head", "knn_head", "norm_reg")
HEADS = {"linear": [], "tied": ["tied_head"], "knn": ["knn_head"]}


def overlays(*variants: str) -> list[str]:
    return [os.path.join(ROOT, "configs", "variants", f"{v}.py") for v in variants if v != "base"]


def model(s: Setting, *variants: str, seed: int = 0) -> str:
    """The trained model of the base config + these variants (one cache entry per variant set and seed)."""
    names = [v for v in variants if v != "base"]
    return trained(s, "+".join(names) or "base", overlays(*names), seed=seed, curve=False)  # no table reads curves


def scratch_model(s: Setting, ratio: float) -> str:
    """The base architecture at width m = ratio·d (the base's heads, head size and MLP) trained from scratch with
    the base's budget: shrink_quality's baseline."""
    d, n_head = shape(model(s, "base"))
    m = width(ratio, d, n_head)
    return trained(s, f"scratch_m{m}", args=[f"--n_embd={m}", f"--head_dim={d // n_head}", f"--mlp_hidden={4 * d}"],
                   curve=False)


def shape(src: str) -> tuple[int, int]:
    cfg = load_model(src)[0].config
    return cfg.n_embd, cfg.n_head


def paper_domain(kind: str, porting: str, ratio: float) -> bool:
    """Inside the paper's stated method: Algorithm 1 (a JL map, m < d) or, for m > d, its growth recipe
    (S = Tᵀ of an orthonormal T: our orthogonal kind). Only meaningful for the paper's rules."""
    if porting == "residual":
        return True
    return ratio < 1 or (ratio > 1 and kind == "orthogonal")


# ----------------------------------------------------------------------------------------------
# The trained models every experiment uses (``models`` trains them, in lanes, before the experiments run)


def head_seeds(s: Setting, head: str) -> tuple[int, ...]:
    """Training seeds of the heads experiment. QUICK (the 2-core CPU budget): n = 3 for the linear head, where the
    regularizer's effect is measured, n = 1 for tied and KNN heads; the GPU setting: n = 3 for every head."""
    return s.seeds[:3] if head == "linear" or not s.quick else s.seeds[:1]


def model_list(s: Setting) -> list[tuple[tuple[str, ...], int]]:
    heads = [(tuple(HEADS[h]) + (("norm_reg",) if reg else ()) or ("base",), seed) for h in HEADS for reg in (0, 1)
             for seed in head_seeds(s, h)]
    return list(dict.fromkeys([(("base",), 0)] + [((v,), 0) for v in VARIANTS] + heads))


def models(s: Setting) -> None:
    """Train every model of ``model_list`` and shrink_quality's from-scratch models, and build grow_staging's runs
    (lanes share them through ``each``): the long runs first, so no lane ends on one."""
    each(model_list(s), lambda entry: model(s, *entry[0], seed=entry[1]))
    each(SHRINK_RATIOS, lambda ratio: scratch_model(s, ratio))
    grow_runs(s)


# ----------------------------------------------------------------------------------------------
# ppl_vs_width: zero-shot loss of every map × rule × width; recovery of one-factor comparisons


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


# ----------------------------------------------------------------------------------------------
# sandwich_ablation: where our `sandwich` differs from the paper's Algorithm 1, and what each difference costs


SANDWICH_ARMS = {  # (norms, rescale_gains); one factor at a time from ours, on the same T (gaussian, seeds)
    "ours: fold + rescale": ("fold", True),
    "norm gains averaged, LayerNorm kept (no folding)": ("scalar", True),
    "no gain / ε rescale": ("fold", False),
    "neither (Algorithm 1 as we read it)": ("scalar", False),
}
SANDWICH_RATIOS = (0.25, 0.5, 0.75)  # Algorithm 1's domain: m < d


def sandwich_ablation(s: Setting) -> None:
    """The paper's sandwich rule (Q, K, V, O → T·W·T⁺) with each of our two additions taken away: folding (per-
    dimension gains into the readers, LayerNorm → RMSNorm with centred writers) and the √(d/m) gain / d/m ε
    rescale. Same Gaussian T per seed in every arm; zero-shot on the full val split."""
    t0 = time.time()
    base = model(s, "base")
    d, n_head = shape(base)

    def row(cell: tuple) -> dict:
        arm, ratio = cell
        norms, rescale = SANDWICH_ARMS[arm]
        m = width(ratio, d, n_head)
        losses = each(s.seeds, lambda seed: transformed(s, base, m, "gaussian", "sandwich", norms, seed=seed,
                                                        rescale_gains=rescale)[1]["val_loss_after"])
        return {"arm": arm, "norms": norms, "rescale_gains": rescale, "ratio": ratio, "m": m,
                "zero_shot": mean_spread(losses)}

    rows = each([(arm, ratio) for arm in SANDWICH_ARMS for ratio in SANDWICH_RATIOS], row)
    save("sandwich_ablation", {"d": d, "kind": "gaussian", "seeds": list(s.seeds),
                               "reference_val_loss": full_val_loss(base, s.device), "rows": rows}, t0, s)


def finetune_recipe(s: Setting) -> dict:
    return {"iters": s.finetune_iters, "eval_interval": s.finetune_eval_interval,
            "eval_iters": s.finetune_eval_iters, "seeds": len(s.seeds)}


# ----------------------------------------------------------------------------------------------
# shrink_quality: how far one global map gets zero-shot, with each correction of refit.py (issue #12)


SHRINK_RATIOS = (0.25, 0.5, 0.75)
SHRINK_KINDS = ("pca", "gaussian", "orthogonal")
CORRECTIONS = {"none": {}, "gains": {"refit": "gains"}, "readers": {"refit": "readers"}, "all": {"refit": "all"},
               "learned T + all": {"refit": "all", "learn_steps": 100}}
CALIBRATION = {"calib_batches": 16}  # 16 × 16 = 256 training sequences for PCA, the fits and the learned map
# how far more work on the best recipe goes (PCA only): 4× the learned map's steps and 4× the calibration text
LONGER = {"learned T ×4 steps + all, ×4 calibration": {"refit": "all", "learn_steps": 400, "calib_batches": 64}}


def shrink_quality(s: Setting) -> None:
    t0 = time.time()
    base = model(s, "base")
    d, n_head = shape(base)

    def row(cell: tuple) -> dict:
        ratio, kind, label, options = cell
        m = width(ratio, d, n_head)
        records = each(s.seeds if kind in RANDOM_KINDS else (0,),
                       lambda seed: transformed(s, base, m, kind, seed=seed, **{**CALIBRATION, **options})[1])
        return {"ratio": ratio, "m": m, "kind": kind, "correction": label,
                "zero_shot": mean_spread([r["val_loss_after"] for r in records]),
                "seconds": mean_spread([r["seconds"] for r in records])}

    def scratch_row(ratio: float) -> dict:
        src = scratch_model(s, ratio)
        return {"ratio": ratio, "m": width(ratio, d, n_head), "val_loss": full_val_loss(src, s.device)}

    rows = each([(ratio, kind, label, options) for ratio in SHRINK_RATIOS for kind in SHRINK_KINDS
                 for label, options in [*CORRECTIONS.items(), *(LONGER.items() if kind == "pca" else ())]], row)
    scratch = each(SHRINK_RATIOS, scratch_row)
    base_seeds = [full_val_loss(model(s, "base", seed=seed), s.device) for seed in s.seeds[:3]]
    payload = {"d": d, "reference_val_loss": full_val_loss(base, s.device), "rows": rows, "scratch": scratch,
               "base_training_seeds": mean_spread(base_seeds), "calibration_sequences": 16 * 16,
               "learn_steps": CORRECTIONS["learned T + all"]["learn_steps"]}
    plot_shrink_quality(payload)
    save("shrink_quality", payload, t0, s)


# ----------------------------------------------------------------------------------------------
# recovery: finetuning by LM loss vs distillation from the original, against the control (issue #13)


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


# ----------------------------------------------------------------------------------------------
# arch_ablation: which variant recovers fastest, for the paper's rule and ours at the same map and width


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


# ----------------------------------------------------------------------------------------------
# geometry_vs_width, heatmaps


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


HEATMAPS = {  # the first two share T (Gaussian, seed 0, m/d = 0.75): only the rule differs
    "gaussian_residual_0.75": ("gaussian", "residual", 0.75), "gaussian_sandwich_0.75": ("gaussian", "sandwich", 0.75),
    "pca_residual_0.5": ("pca", "residual", 0.5), "orthogonal_residual_1.0": ("orthogonal", "residual", 1.0)}


def heatmaps(s: Setting) -> None:
    t0 = time.time()
    base = model(s, "base")
    d, n_head = shape(base)
    summary, figures = {}, {}
    for label, (kind, porting, ratio) in HEATMAPS.items():
        src, record = transformed(s, base, width(ratio, d, n_head), kind, porting)
        metrics = geometry(s, base, src, eval_iters=10)
        for fig in ("cosine_heatmaps", "norm_heatmap"):
            figures[f"{label}_{fig}.png"] = os.path.join(metrics["out_dir"], metrics["figures"][fig])
        summary[label] = {"zero_shot": record["val_loss_after"], "ae_model": metrics["angular_error"]["model"],
                          "hc_model": metrics["concordance"]["model"]["pearson"]}
    copy_figures("heatmaps", figures)
    save("heatmaps", {"runs": summary}, t0, s)


# ----------------------------------------------------------------------------------------------
# heads: linear / tied / KNN heads with and without the norm regularizer, n training seeds


def heads(s: Setting) -> None:
    t0 = time.time()
    rows, figures = [], {}
    for head, variants in HEADS.items():
        for reg in (0.0, 0.1):
            per_seed = []
            for seed in head_seeds(s, head):
                src = model(s, *variants, *(["norm_reg"] if reg else []), seed=seed)
                metrics = geometry(s, src, eval_iters=10)
                ref = metrics["models"]["ref"]
                per_seed.append({"val_loss": full_val_loss(src, s.device), "ndcg": ref["ndcg"],
                                 "mu_e": ref["embedding_norms"]["mean"], "sigma_e": ref["embedding_norms"]["std"],
                                 "hidden_norm_mean": ref["hidden_norm_mean"], "geometry_dir": metrics["out_dir"]})
            name = f"head_{head}_reg{reg}"
            figures[f"{name}_norms.png"] = os.path.join(per_seed[0]["geometry_dir"], "norm_heatmap.png")
            rows.append({"head": head, "norm_reg": reg, "val_loss": mean_spread([r["val_loss"] for r in per_seed]),
                         "ndcg": {k: mean_spread([r["ndcg"][k] for r in per_seed]) for k in per_seed[0]["ndcg"]},
                         "mu_e": mean_spread([r["mu_e"] for r in per_seed]),
                         "sigma_e": mean_spread([r["sigma_e"] for r in per_seed]),
                         "hidden_norm_mean": [statistics.fmean(col) for col in
                                              zip(*[r["hidden_norm_mean"] for r in per_seed])]})
            print(head, reg, rows[-1]["val_loss"]["mean"])
    copy_figures("heads", figures)
    save("heads", {"rows": rows, "ndcg_k": 10}, t0, s)


# ----------------------------------------------------------------------------------------------
# grow_staging: train at d, grow everything to the standard 2d model, continue; vs the 2d model from scratch


GROW_ARMS = [{"grow_mode": mode, "carry_optimizer": carry, "rewarm_iters": rewarm}
             for mode in ("zero", "clone") for carry in (False, True) for rewarm in (0, 100)]
GROW_NOISE, CLONE_NOISE = 0.1, 0.02  # residual symmetry breaking (both modes); cancelling noise of the clones


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


def grow_runs(s: Setting) -> None:
    """Build every continued run grow_staging reads (with its stage-1 and scratch models)."""
    each([(seed, arm) for seed in s.seeds for arm in GROW_ARMS],
         lambda cell: grow_arm(s, grow_models(s, cell[0])[0], cell[1], cell[0]))


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


# ----------------------------------------------------------------------------------------------
# grow_depth: depth growth (transform.py --n_layer) as the positive control of growing


DEPTH_ARMS = [{"depth_mode": "interleave", "carry_optimizer": True}, {"depth_mode": "stack", "carry_optimizer": True},
              {"depth_mode": "gstack", "carry_optimizer": True}, {"depth_mode": "interleave", "carry_optimizer": False}]


def depth_arm_label(arm: dict) -> str:
    kind = {"interleave": "interleaved copies, zero writers", "stack": "stacked copies, zero writers",
            "gstack": "G_stack (stack repeated, writers kept)"}[arm["depth_mode"]]
    return f"{kind}, {'carried' if arm['carry_optimizer'] else 'fresh'} AdamW"


def depth_models(s: Setting, seed: int = 0) -> tuple[str, str]:
    """(half-depth stage 1, the full model from scratch): stage 1 has half the blocks, the same width and heads,
    and stops halfway through the 2·iters cosine; the scratch model is grow_staging's (the same cache entry)."""
    staging, _, big = grow_settings(s)
    half = load_config(TrainConfig, s.base).n_layer // 2
    small = with_iters(big, staging.stage1, staging.total) + [f"--n_layer={half}"]
    return trained(s, "depth_stage1", args=small, seed=seed), trained(s, "grow_scratch", args=big, seed=seed)


def depth_arm(s: Setting, stage1: str, arm: dict, seed: int) -> dict:
    """Stage 1 grown to full depth by ``arm`` (T = I: the width is kept) and trained on along its schedule."""
    base = load_model(stage1)[0].config
    grown, record = transformed(s, stage1, base.n_embd, "truncate", seed=seed, n_layer=2 * base.n_layer,
                                depth_mode=arm["depth_mode"], carry_optimizer=arm["carry_optimizer"])
    return continued(s, stage1, grown, record, f"deeper-{arm['depth_mode']}", 0)


def grow_depth(s: Setting) -> None:
    """The half-depth model grown to full depth halfway through the schedule, against the full model trained from
    scratch (its curve at equal compute, and a run given the staged compute and fully decayed), n seeds."""
    t0 = time.time()
    staging, _, big = grow_settings(s)
    pairs = [depth_models(s, seed) for seed in s.seeds]
    base = load_config(TrainConfig, s.base)
    result = staged_baselines(s, staging, big, pairs)
    costs = result.pop("costs")
    result["flops_per_token"] = {"half": costs[2], "full": costs[3]}
    result["n_layer"] = {"stage1": base.n_layer // 2, "full": base.n_layer}
    result["arms"] = staged_arms(s, DEPTH_ARMS, depth_arm_label, depth_arm, pairs, result["scratch"], costs)
    save("grow_depth", result, t0, s)


# ----------------------------------------------------------------------------------------------
# grow_recipes: which width growth pays — the new directions used (fresh readers, MSG's masks), SPARKLING's recipe,
# then from the best of them, one factor at a time: the switch point, the horizon, width and depth together


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


# ----------------------------------------------------------------------------------------------
# quantization: same-width rotations before int8/int4 round-to-nearest


ROTATIONS = {"no rotation (fold only, T = I)": "truncate", "orthogonal rotation": "orthogonal",
             "SRHT rotation": "srht"}


def quantization(s: Setting) -> None:
    t0 = time.time()
    base = model(s, "base")
    d, _ = shape(base)
    rows = []
    for label, kind in ROTATIONS.items():
        per_seed = []
        for seed in (s.seeds if kind in RANDOM_KINDS else (0,)):
            src, _ = transformed(s, base, d, kind, seed=seed)
            rotated, ckpt = load_model(src)
            loader = BatchLoader(data_dir_for_checkpoint(ckpt), rotated.config.block_size, 32)
            row = {"fp32": evaluate_loss(rotated, loader, "val", None), "weight_kurtosis": statistics.fmean(
                geo.excess_kurtosis(p) for p in rotated.parameters() if p.dim() == 2)}
            for bits in (8, 4):
                row[f"int{bits}"] = evaluate_loss(quantized(rotated, bits), loader, "val", None)
            per_seed.append(row)
        rows.append({"rotation": label, **{k: mean_spread([r[k] for r in per_seed]) for k in per_seed[0]}})
        print(label, rows[-1]["int4"]["mean"])
    original, _ = load_model(base)
    save("quantization", {"rows": rows, "original_val_loss": full_val_loss(base, "cpu"),
                          "original_weight_kurtosis": statistics.fmean(
                              geo.excess_kurtosis(p) for p in original.parameters() if p.dim() == 2)}, t0, s)


def quantized(model_, bits: int):
    import copy
    q = copy.deepcopy(model_)
    with torch.no_grad():
        for p in q.parameters():
            if p.dim() == 2:
                p.copy_(geo.rtn_quantize(p, bits))
    return q


# ----------------------------------------------------------------------------------------------
# scale: every headline finding across base widths d (issue #25)


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


# ----------------------------------------------------------------------------------------------
# Figures (scripts/report.py redraws them from results/*/results.json)


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


def plot_shrink_quality(r: dict) -> None:
    fig, axes = plt().subplots(1, len(SHRINK_KINDS), figsize=(5.5 * len(SHRINK_KINDS), 4.6), sharey=True)
    for ax, kind in zip(axes, SHRINK_KINDS):
        for label in CORRECTIONS:
            zero_shot_curve(ax, [row for row in r["rows"] if row["kind"] == kind and row["correction"] == label],
                            label)
        ax.plot([p["ratio"] for p in r["scratch"]], [p["val_loss"] for p in r["scratch"]], "k--", marker="s",
                label="width m trained from scratch")
        finish_zero_shot_axis(ax, r["reference_val_loss"], f"{kind} map, residual porting")
    fig.tight_layout()
    savefig(fig, "shrink_quality", "shrink_quality.png")


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


PLOTS = {"ppl_vs_width": plot_ppl_vs_width, "shrink_quality": plot_shrink_quality, "recovery": plot_recovery,
         "geometry_vs_width": plot_geometry_vs_width, "arch_ablation": plot_arch_ablation,
         "grow_staging": plot_grow_staging, "scale": plot_scale, "grow_recipes": plot_grow_recipes}


def replot(experiment: str, payload: dict) -> None:
    """Redraw an experiment's figure from its results.json (scripts/report.py calls this)."""
    if experiment in PLOTS:
        PLOTS[experiment](payload)


EXPERIMENTS = {f.__name__: f for f in (ppl_vs_width, geometry_vs_width, heatmaps, arch_ablation, heads,
                                       grow_staging, quantization, shrink_quality, scale, sandwich_ablation,
                                       grow_depth, grow_recipes)} | {
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
