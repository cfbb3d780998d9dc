"""
The experiments behind scripts/*.sh: each runs train → transform → finetune → eval through the
project's own Python APIs and writes JSON and PNG into results/<experiment>/.

    python scripts/experiments.py ppl_vs_width [--quick]      (QUICK=1 works too)

--quick: the CPU setting (configs/shakespeare_char.py, about 20 minutes or less per experiment on 2 cores).
Default: the paper-scale GPU setting (configs/shakespeare_char.py + configs/gpu.py, longer finetunes,
more seeds). Trained models are cached in runs/ (keyed by their settings), so experiments share them.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("MPLBACKEND", "Agg")

import torch  # noqa: E402

import geometry as geo  # noqa: E402
from checkpoint import load_checkpoint, load_model  # noqa: E402
from cli import run_cli  # noqa: E402
from configurator import config_from_dict, load_config  # noqa: E402
from dataset import BatchLoader, data_dir_for_checkpoint, evaluate_loss  # noqa: E402
from eval_geometry import GeometryConfig, evaluate_geometry  # noqa: E402
from finetune import FinetuneConfig, finetune  # noqa: E402
from logger import read_metrics  # noqa: E402
from train import TrainConfig, get_lr, train  # noqa: E402
from transform import KINDS, TransformConfig, transform_checkpoint  # noqa: E402

RUNS = os.path.join(ROOT, "runs")
RESULTS = os.path.join(ROOT, "results")
RATIOS = (0.25, 0.5, 0.75, 1.0, 1.5, 2.0)


class Setting:
    """QUICK (CPU) or full (GPU) sizes of everything an experiment runs."""

    def __init__(self, quick: bool):
        self.quick = quick
        self.base = [os.path.join(ROOT, "configs", "shakespeare_char.py")]
        if not quick:
            self.base.append(os.path.join(ROOT, "configs", "gpu.py"))
        self.finetune_iters = 100 if quick else 1000
        self.seeds = (0, 1) if quick else (0, 1, 2)
        self.common = ["--progress_bar=False", "--wandb_log=" + os.environ.get("WANDB_LOG", "False")]
        self.device = "cpu" if quick else ("cuda" if torch.cuda.is_available() else "cpu")


def variant_overlay(name: str) -> list[str]:
    return [] if name == "base" else [os.path.join(ROOT, "configs", "variants", f"{name}.py")]


def trained(s: Setting, name: str, args: list[str]) -> str:
    """Train (once) a model of the base config + ``args``; cached in runs/<name>-<hash>/."""
    argv = s.base + args + s.common
    key = hashlib.sha1(json.dumps(argv).encode()).hexdigest()[:8]
    out = os.path.join(RUNS, f"{name}-{'quick' if s.quick else 'full'}-{key}")
    if not os.path.exists(os.path.join(out, "done.json")):
        t0 = time.time()
        # overwrite: a run without done.json is partial (interrupted): start it again
        summary = train(load_config(TrainConfig, argv + [f"--out_dir={out}", "--overwrite=True"]))
        with open(os.path.join(out, "done.json"), "w") as f:
            json.dump(dict(summary, seconds=time.time() - t0, argv=argv), f)
    return out


def transformed(s: Setting, src: str, width: int, kind: str, porting: str, seed: int = 0, norms: str = "fold",
                grow_noise: float = 0.0, eval_iters: int | None = None) -> tuple[str, dict]:
    name = f"{os.path.basename(src)}-{kind}-{porting}-{norms}-m{width}-s{seed}-g{grow_noise}"
    out = os.path.join(RUNS, "transformed", name)
    path = os.path.join(out, "record.json")
    if not os.path.exists(path):
        record = transform_checkpoint(TransformConfig(
            in_dir=src, out_dir=out, width=width, kind=kind, porting=porting, norms=norms, seed=seed,
            grow_noise=grow_noise, eval_iters=eval_iters, device=s.device,
            eval_reference=False, overwrite=True))  # the reference is evaluated once per experiment
        with open(path, "w") as f:
            json.dump({k: v for k, v in record.items() if k not in ("T", "T_pinv")}, f)
    with open(path) as f:
        return out, json.load(f)


def finetuned(s: Setting, src: str, iters: int, extra: list[str] = (), seed: int = 0) -> dict:
    out = src + f"-ft{iters}" + (f"-seed{seed}" if seed else "")
    extra = [*extra, f"--seed={1337 + seed}"]
    path = os.path.join(out, "finetune.json")
    if not os.path.exists(path):
        finetune(load_config(FinetuneConfig, s.common + [f"--in_dir={src}", f"--out_dir={out}", f"--max_iters={iters}",
                                                         f"--lr_decay_iters={iters}", "--eval_interval=20",
                                                         "--eval_iters=50", "--log_interval=50", "--overwrite=True",
                                                         *extra]))
    with open(path) as f:
        return json.load(f)


def full_val_loss(model_dir: str, device: str) -> float:
    model, ckpt = load_model(model_dir, device=device)
    data_dir = data_dir_for_checkpoint(ckpt)
    return evaluate_loss(model, BatchLoader(data_dir, model.config.block_size, 32, device), "val", None)


def save(experiment: str, payload: dict, started: float, s: Setting) -> None:
    out = os.path.join(RESULTS, experiment)
    os.makedirs(out, exist_ok=True)
    payload = dict(payload, meta={"quick": s.quick, "seconds": round(time.time() - started),
                                  "hardware": hardware(), "command": f"scripts/{experiment}.sh"
                                  + (" --quick" if s.quick else "")})
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(payload, f, indent=2)
    print(f"wrote {out}/results.json")


def hardware() -> str:
    if torch.cuda.is_available():
        return torch.cuda.get_device_name()
    return f"CPU ({platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__})"


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


def mean_spread(values: list[float]) -> dict:
    return {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0,
            "values": values}


# ----------------------------------------------------------------------------------------------
# Experiments


def ppl_vs_width(s: Setting) -> None:
    """Val loss against m/d for every projection kind × porting rule, zero-shot and after finetuning."""
    t0 = time.time()
    base = trained(s, "base", [])
    d = load_model(base)[0].config.n_embd
    reference = full_val_loss(base, s.device)
    rows = []
    finetune_kinds = {("gaussian", "sandwich"), ("orthogonal", "head"), ("pca", "head")}
    for porting in ("head", "sandwich"):
        for kind in KINDS:
            for ratio in RATIOS:
                m = int(round(ratio * d))
                if kind == "pca" and m > d:
                    continue
                seeds = s.seeds if kind in ("gaussian", "rademacher", "sparse", "srht", "orthogonal") else (0,)
                zero_shot = []
                for seed in seeds:
                    out, record = transformed(s, base, m, kind, porting, seed)
                    zero_shot.append(record["val_loss_after"])
                row = {"kind": kind, "porting": porting, "ratio": ratio, "m": m,
                       "zero_shot": mean_spread(zero_shot)}
                if (kind, porting) in finetune_kinds or not s.quick:
                    out, _ = transformed(s, base, m, kind, porting, seeds[0])
                    ft = finetuned(s, out, s.finetune_iters)
                    row["finetuned"] = ft["val_loss"]
                    row["steps_to_recover"] = ft["steps_to_recover"]
                rows.append(row)
                print(row)
    payload = {"d": d, "reference_val_loss": reference, "finetune_iters": s.finetune_iters, "rows": rows}
    plot_ppl_vs_width(payload)
    save("ppl_vs_width", payload, t0, s)


def plot_ppl_vs_width(r: dict) -> None:
    fig, axes = plt().subplots(1, 2, figsize=(14, 5), sharey=True)
    for ax, porting in zip(axes, ("head", "sandwich")):
        for kind in KINDS:
            pts = [row for row in r["rows"] if row["kind"] == kind and row["porting"] == porting]
            if not pts:
                continue
            line = ax.errorbar([p["ratio"] for p in pts], [p["zero_shot"]["mean"] for p in pts],
                               yerr=[p["zero_shot"]["std"] for p in pts], marker="o", label=f"{kind} zero-shot",
                               capsize=3)
            ft = [p for p in pts if "finetuned" in p]
            if ft:
                ax.plot([p["ratio"] for p in ft], [p["finetuned"] for p in ft], "--", marker="x",
                        color=line[0].get_color(), label=f"{kind} +{r['finetune_iters']} steps")
        ax.axhline(r["reference_val_loss"], color="k", lw=1, label="original model")
        plain_log_axis(ax)
        ax.set_title(f"porting = {porting}")
        ax.set_xlabel("m / d")
        ax.set_ylabel("val loss (full val split, log scale)")
        ax.legend(fontsize=7, ncol=2)
    fig.suptitle(f"Val loss vs width ratio (d = {r['d']})")
    fig.tight_layout()
    os.makedirs(os.path.join(RESULTS, "ppl_vs_width"), exist_ok=True)
    fig.savefig(os.path.join(RESULTS, "ppl_vs_width", "ppl_vs_width.png"), dpi=110)


def geometry_vs_width(s: Setting) -> None:
    """HC and AE (map-level and model-level) against m, with the JL bound's ε."""
    t0 = time.time()
    base = trained(s, "base", [])
    d = load_model(base)[0].config.n_embd
    rows = []
    for kind in ("gaussian", "srht", "orthogonal", "pca"):
        for ratio in RATIOS:
            m = int(round(ratio * d))
            if kind == "pca" and m > d:
                continue
            out, _ = transformed(s, base, m, kind, "head")
            metrics = evaluate_geometry(load_config(GeometryConfig, [f"--ref_dir={base}", f"--in_dir={out}",
                                                            f"--out_dir={out}-geom", "--n_probes=2048",
                                                            "--eval_iters=10", "--wandb_log=False"]))
            row = {"kind": kind, "m": m, "ratio": ratio,
                   "ae_map": metrics["angular_error"]["map"], "ae_model": metrics["angular_error"]["model"],
                   "hc_map": metrics["concordance"]["map"]["pearson"],
                   "hc_model": metrics["concordance"]["model"]["pearson"],
                   "jl_eps_empirical_max": metrics["jl"]["empirical_eps"]["max"],
                   "jl_eps_empirical_q99": metrics["jl"]["empirical_eps"]["q99"],
                   "jl_eps_bound": metrics["jl"]["bound_eps"], "n_points": metrics["jl"]["n_points"],
                   "fa_tokens": metrics["feature_alignment"]["frequent_tokens"],
                   "fa_pcs": metrics["feature_alignment"]["principal_directions"]}
            rows.append(row)
            print(row)
    plot_geometry_vs_width({"d": d, "rows": rows})
    save("geometry_vs_width", {"d": d, "rows": rows}, t0, s)


def heatmaps(s: Setting) -> None:
    """Similarity and hidden-norm heatmaps before/after: ours (pca, head) and the paper's (gaussian, sandwich)."""
    t0 = time.time()
    import shutil
    base = trained(s, "base", [])
    d = load_model(base)[0].config.n_embd
    out_dir = os.path.join(RESULTS, "heatmaps")
    summary = {}
    for label, (kind, porting, ratio) in {"pca_head_0.5": ("pca", "head", 0.5),
                                          "gaussian_sandwich_0.75": ("gaussian", "sandwich", 0.75),
                                          "orthogonal_head_1.0": ("orthogonal", "head", 1.0)}.items():
        src, _ = transformed(s, base, int(ratio * d), kind, porting)
        metrics = evaluate_geometry(load_config(GeometryConfig, [f"--ref_dir={base}", f"--in_dir={src}",
                                                        f"--out_dir={src}-heat", "--wandb_log=False",
                                                        "--eval_iters=10"]))
        os.makedirs(out_dir, exist_ok=True)
        for fig in ("cosine_heatmaps", "norm_heatmap", "concordance"):
            shutil.copy(os.path.join(src + "-heat", metrics["figures"][fig]),
                        os.path.join(out_dir, f"{label}_{fig}.png"))
        summary[label] = {"val_loss": metrics["loss"]["new"]["val_loss"], "ae_model": metrics["angular_error"]["model"],
                          "hc_model": metrics["concordance"]["model"]["pearson"]}
    save("heatmaps", {"runs": summary}, t0, s)


def ablation_seeds(s: Setting) -> tuple[int, ...]:
    """Finetuning seeds per (variant, transform): one in QUICK (the CPU budget), all of s.seeds otherwise."""
    return (0,) if s.quick else s.seeds


ABLATION_VARIANTS = ("base", "peri_ln", "scalar_gain", "rmsnorm", "tied_head", "knn_head", "norm_reg")


def arch_ablation(s: Setting) -> None:
    """Which variants need the fewest finetuning steps after a transform: the paper's porting and ours."""
    t0 = time.time()
    rows = []
    transforms = {"paper: gaussian sandwich m/d=0.75": ("gaussian", "sandwich", 0.75),
                  "ours: pca head m/d=0.5": ("pca", "head", 0.5)}
    for variant in ABLATION_VARIANTS:
        src = trained(s, variant, variant_overlay(variant))
        d = load_model(src)[0].config.n_embd
        for label, (kind, porting, ratio) in transforms.items():
            out, record = transformed(s, src, int(ratio * d), kind, porting)
            runs = [finetuned(s, out, 2 * s.finetune_iters, seed=seed) for seed in ablation_seeds(s)]
            ft = runs[0]
            rows.append({"variant": variant, "transform": label, "reference": ft["reference_val_loss"],
                         "zero_shot": record["val_loss_after"], "finetuned": ft["val_loss"],
                         "steps_to_recover": ft["steps_to_recover"], "curve": ft["curve"],
                         "steps_per_seed": [r["steps_to_recover"] for r in runs],
                         "notes": record["notes"]})
            print({k: v for k, v in rows[-1].items() if k != "curve"})
    payload = {"rows": rows, "finetune_iters": 2 * s.finetune_iters}
    plot_arch_ablation(payload)
    save("arch_ablation", payload, t0, s)


def heads(s: Setting) -> None:
    """Val loss and NDCG with linear / tied / KNN heads, with and without the norm regularizer."""
    t0 = time.time()
    import shutil
    rows = []
    out_dir = os.path.join(RESULTS, "heads")
    os.makedirs(out_dir, exist_ok=True)
    overlay = {"linear": [], "tied": ["tied_head"], "knn": ["knn_head"]}
    for head in ("linear", "tied", "knn"):
        for reg in (0.0, 0.1):
            name = f"head_{head}_reg{reg}"
            variants = overlay[head] + (["norm_reg"] if reg else [])  # the ablation's models where they coincide
            src = trained(s, "+".join(variants) or "base", [p for v in variants for p in variant_overlay(v)])
            metrics = evaluate_geometry(load_config(GeometryConfig, [f"--ref_dir={src}", f"--out_dir={src}-geom",
                                                            "--wandb_log=False", "--eval_iters=10"]))
            ref = metrics["models"]["ref"]
            rows.append({"head": head, "norm_reg": reg, "val_loss": full_val_loss(src, s.device),
                         "ndcg": ref["ndcg"], "embedding_norms": ref["embedding_norms"],
                         "hidden_norm_mean": ref["hidden_norm_mean"]})
            shutil.copy(os.path.join(src + "-geom", "norm_heatmap.png"), os.path.join(out_dir, f"{name}_norms.png"))
            print(rows[-1])
    save("heads", {"rows": rows, "ndcg_k": 10}, t0, s)


def grow_staging(s: Setting) -> None:
    """Train at width d, grow to 2d (with / without symmetry breaking), continue; vs 2d from scratch."""
    t0 = time.time()
    iters = 1000 if s.quick else 2500
    # one cosine schedule over both stages: stage 1 stops halfway, the grown model continues from there
    small = ["--n_embd=64", "--n_head=4", "--mlp_hidden=256", f"--max_iters={iters}", f"--lr_decay_iters={2 * iters}"]
    # the grown model keeps heads and MLP: from scratch we train exactly that architecture at 2d
    big = ["--n_embd=128", "--n_head=4", "--head_dim=16", "--mlp_hidden=256"]
    stage1 = trained(s, "grow_stage1", small)
    run_cfg = load_checkpoint(stage1)["config"]
    batch = [f"--batch_size={run_cfg['batch_size']}",
             f"--gradient_accumulation_steps={run_cfg['gradient_accumulation_steps']}"]
    tokens = run_cfg["batch_size"] * run_cfg["block_size"] * run_cfg["gradient_accumulation_steps"]
    lr_at_switch = get_lr(iters, config_from_dict(TrainConfig, run_cfg, "stage 1 config"))
    schedule = [f"--learning_rate={lr_at_switch}", "--warmup_iters=0", f"--lr_decay_iters={iters}",
                f"--min_lr={run_cfg['min_lr']}", f"--weight_decay={run_cfg['weight_decay']}"]
    curves = {}
    for label, noise in (("grown, no symmetry breaking", 0.0), ("grown, symmetry breaking σ=0.1", 0.1),
                         ("grown, symmetry breaking σ=1", 1.0)):
        out, _ = transformed(s, stage1, 128, "orthogonal", "head", grow_noise=noise)
        cont = out + "-continued"
        if not os.path.exists(os.path.join(cont, "done.json")):
            cfg = load_config(FinetuneConfig, s.common + [
                f"--in_dir={out}", f"--out_dir={cont}", f"--max_iters={iters}", "--eval_interval=100",
                "--eval_iters=100", "--overwrite=True", *schedule, *batch])
            summary = finetune(cfg)
            residual = range_energy(cont)
            with open(os.path.join(cont, "done.json"), "w") as f:
                json.dump(dict(summary, energy_in_range=residual), f)
        with open(os.path.join(cont, "done.json")) as f:
            done = json.load(f)
        curves[label] = {"curve": done["curve"], "energy_in_range_T": done["energy_in_range"]}
    stage1_curve = [(r["iter"], r["val/loss"]) for r in read_metrics(os.path.join(stage1, "metrics.jsonl"))
                    if "val/loss" in r]
    scratch = trained(s, "grow_scratch", big + [f"--max_iters={2 * iters}", f"--lr_decay_iters={2 * iters}"])
    scratch_curve = [(r["iter"], r["val/loss"]) for r in read_metrics(os.path.join(scratch, "metrics.jsonl"))
                     if "val/loss" in r]
    flops_small, flops_big = (6 * load_model(p)[0].get_num_params() for p in (stage1, scratch))
    result = {"iters_per_stage": iters, "flops_per_token": {"d": flops_small, "2d": flops_big},
              "stage1": stage1_curve, "scratch": scratch_curve, "grown": curves}
    result["tokens_per_iter"] = tokens
    result["lr_at_switch"] = lr_at_switch
    offset = iters * tokens * flops_small
    staged_total = offset + iters * tokens * flops_big  # compute of stage 1 + continuation
    result["staged_total_flops"] = staged_total
    result["scratch_loss_at_staged_compute"] = interpolate(
        [(i * tokens * flops_big, v) for i, v in scratch_curve], staged_total)
    plot_grow_staging(result)
    # compute to reach the scratch model's final loss
    target = scratch_curve[-1][1]
    result["target_val_loss"] = target
    result["scratch_flops_to_target"] = (2 * iters) * tokens * flops_big
    for c in curves.values():
        hit = next((i for i, v in c["curve"] if v <= target), None)
        c["flops_to_target"] = None if hit is None else offset + hit * tokens * flops_big
    save("grow_staging", result, t0, s)


def interpolate(points: list[tuple[float, float]], x: float) -> float:
    """Linear interpolation of y at x on a sorted (x, y) curve (clamped at the ends)."""
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if x0 <= x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return points[-1][1] if x > points[-1][0] else points[0][1]


def range_energy(continued: str) -> float:
    """Fraction of the continued model's residual energy that stays in range(T) (the old directions)."""
    model, ckpt = load_model(continued)
    T = ckpt["transform"]["T"].double()
    P = T @ T.T
    x, _ = BatchLoader(data_dir_for_checkpoint(ckpt), model.config.block_size, 16).get_batch("val", 0)
    with torch.no_grad():
        _, _, hidden = model(x, return_hidden=True)
    H = torch.cat([h.reshape(-1, h.shape[-1]) for h in hidden[1:]]).double()
    return ((H @ P).pow(2).sum() / H.pow(2).sum()).item()


def quantization(s: Setting) -> None:
    """Same-width rotations before int8/int4 round-to-nearest weight quantization."""
    t0 = time.time()
    base = trained(s, "base", [])
    d = load_model(base)[0].config.n_embd
    rows = []
    for label, kind in (("no rotation (fold only, T = I)", "truncate"), ("orthogonal rotation", "orthogonal"),
                        ("SRHT rotation", "srht")):
        src, _ = transformed(s, base, d, kind, "head")
        model, ckpt = load_model(src)
        loader = BatchLoader(data_dir_for_checkpoint(ckpt), model.config.block_size, 32)
        row = {"rotation": label, "fp32": evaluate_loss(model, loader, "val", None),
               "weight_kurtosis": statistics.fmean(geo.excess_kurtosis(p) for p in model.parameters() if p.dim() == 2)}
        for bits in (8, 4):
            q = quantized(model, bits)
            row[f"int{bits}"] = evaluate_loss(q, loader, "val", None)
        rows.append(row)
        print(row)
    original, _ = load_model(base)
    save("quantization", {"rows": rows, "original_val_loss": full_val_loss(base, "cpu"),
                          "original_weight_kurtosis": statistics.fmean(
                              geo.excess_kurtosis(p) for p in original.parameters() if p.dim() == 2)}, t0, s)


def quantized(model, bits: int):
    import copy
    q = copy.deepcopy(model)
    with torch.no_grad():
        for p in q.parameters():
            if p.dim() == 2:
                p.copy_(geo.rtn_quantize(p, bits))
    return q


def plot_geometry_vs_width(r: dict) -> None:
    fig, axes = plt().subplots(1, 3, figsize=(17, 4.6))
    d = r["d"]
    for kind in ("gaussian", "srht", "orthogonal", "pca"):
        pts = [row for row in r["rows"] if row["kind"] == kind]
        ms = [p["m"] for p in pts]
        line = axes[0].plot(ms, [p["hc_map"] for p in pts], marker="o", label=f"{kind} map-level")[0]
        color = line.get_color()
        axes[0].plot(ms, [p["hc_model"] for p in pts], "--", marker="x", color=color, label=f"{kind} model-level")
        axes[1].plot(ms, [p["ae_map"] for p in pts], marker="o", color=color, label=f"{kind} map-level")
        axes[1].plot(ms, [p["ae_model"] for p in pts], "--", marker="x", color=color, label=f"{kind} model-level")
        axes[2].plot(ms, [p["jl_eps_empirical_max"] for p in pts], marker="o", color=color,
                     label=f"{kind} empirical max ε")
    bound = [(p["m"], p["jl_eps_bound"]) for p in r["rows"] if p["kind"] == "gaussian" and p["jl_eps_bound"]]
    if bound:  # below the JL minimum width the lemma guarantees nothing: only the widths where it does
        axes[2].plot(*zip(*bound), "k*", markersize=12, ls=":",
                     label=f"JL bound ε (δ = 0.05, N = {r['rows'][0]['n_points']}); none < 1 below")
    for ax, (title, ylabel) in zip(axes, [("hyperspherical concordance", "HC (Pearson)"),
                                          ("angular error", "AE (radians)"),
                                          ("pairwise distance distortion", "ε")]):
        ax.axvline(d, color="grey", lw=0.8)
        ax.set_title(title)
        ax.set_xlabel("new width m (grey: d)")
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=7)
    fig.tight_layout()
    os.makedirs(os.path.join(RESULTS, "geometry_vs_width"), exist_ok=True)
    fig.savefig(os.path.join(RESULTS, "geometry_vs_width", "geometry_vs_width.png"), dpi=110)


def plot_arch_ablation(r: dict) -> None:
    transforms = list(dict.fromkeys(row["transform"] for row in r["rows"]))
    fig, axes = plt().subplots(1, len(transforms), figsize=(7 * len(transforms), 4.8), squeeze=False)
    for ax, label in zip(axes[0], transforms):
        for row in [row for row in r["rows"] if row["transform"] == label]:
            steps, vals = zip(*row["curve"])
            ax.plot(steps, [v / row["reference"] for v in vals], marker=".", label=row["variant"])
        ax.axhline(1.01, color="k", ls=":", lw=1, label="recovered (1% of reference)")
        ax.set_title(f"recovery — {label}")
        ax.set_xlabel("finetune step")
        ax.set_ylabel("val loss / reference val loss")
        ax.legend(fontsize=8)
    fig.tight_layout()
    os.makedirs(os.path.join(RESULTS, "arch_ablation"), exist_ok=True)
    fig.savefig(os.path.join(RESULTS, "arch_ablation", "recovery_curves.png"), dpi=110)


def plot_grow_staging(r: dict) -> None:
    tokens, flops = r["tokens_per_iter"], r["flops_per_token"]
    fig, ax = plt().subplots(figsize=(8, 5))
    ax.plot([i * tokens * flops["2d"] for i, _ in r["scratch"]], [v for _, v in r["scratch"]], label="2d from scratch")
    ax.plot([i * tokens * flops["d"] for i, _ in r["stage1"]], [v for _, v in r["stage1"]], label="stage 1 (d)")
    offset = r["iters_per_stage"] * tokens * flops["d"]
    for label, c in r["grown"].items():
        ax.plot([offset + i * tokens * flops["2d"] for i, _ in c["curve"]], [v for _, v in c["curve"]], label=label)
    ax.set_xlabel("training compute (FLOPs ≈ 6·N·tokens)")
    ax.set_ylabel("val loss")
    plain_log_axis(ax)
    ax.set_title("Growing d → 2d (staging) vs training 2d from scratch")
    ax.legend()
    fig.tight_layout()
    os.makedirs(os.path.join(RESULTS, "grow_staging"), exist_ok=True)
    fig.savefig(os.path.join(RESULTS, "grow_staging", "grow_staging.png"), dpi=110)


PLOTS = {"ppl_vs_width": plot_ppl_vs_width, "geometry_vs_width": plot_geometry_vs_width,
         "arch_ablation": plot_arch_ablation, "grow_staging": plot_grow_staging}


def replot(experiment: str, payload: dict) -> None:
    """Redraw an experiment's figure from its results.json (scripts/report.py calls this)."""
    if experiment in PLOTS:
        PLOTS[experiment](payload)


EXPERIMENTS = {f.__name__: f for f in (ppl_vs_width, geometry_vs_width, heatmaps, arch_ablation, heads,
                                       grow_staging, quantization)}


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("experiment", choices=sorted(EXPERIMENTS))
    parser.add_argument("--quick", action="store_true", help="CPU sizes (also QUICK=1)")
    args = parser.parse_args(argv)
    quick = args.quick or os.environ.get("QUICK", "0") not in ("", "0")
    torch.manual_seed(0)
    EXPERIMENTS[args.experiment](Setting(quick))


if __name__ == "__main__":  # an interrupted run exits 130 and leaves no completion marker
    raise SystemExit(run_cli(main))
