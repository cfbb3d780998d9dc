"""
Regenerate the README's results tables from results/*/ (the JSON the scripts wrote).

    python scripts/report.py            # rewrites the blocks between <!-- BEGIN name --> and <!-- END name -->
                                        # and redraws the figures of results/*/ from their results.json
    python scripts/report.py --check    # exit 1 if the README is out of date

Only what a script measured goes into a table; an experiment without results says how to produce them.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "results")


def load(name: str) -> dict | None:
    path = os.path.join(RESULTS, name, "results.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def f4(x) -> str:
    return "—" if x is None else f"{x:.4f}"


def provenance(r: dict) -> str:
    meta = r["meta"]
    return (f"*Made by `{meta['command']}` on {meta['hardware']} in {meta['seconds'] / 60:.1f} min"
            f"{' (QUICK setting)' if meta['quick'] else ''}.*")


def missing(name: str) -> str:
    return f"*Not run yet: `QUICK=1 scripts/{name}.sh` (CPU) or `scripts/{name}.sh` (GPU) fills this table.*"


def seed_count(r: dict) -> int:
    return max(len(row["zero_shot"].get("values", [0])) for row in r["rows"])


def ppl_vs_width(r: dict) -> str:
    ratios = sorted({row["ratio"] for row in r["rows"]})
    lines = [f"Zero-shot val loss (full val split; original model: **{r['reference_val_loss']:.4f}**, d = {r['d']}); "
             f"random kinds: mean ± std over n = {seed_count(r)} map seeds.", "",
             "| kind | porting | " + " | ".join(f"m/d={x:g}" for x in ratios) + " |",
             "|---|---|" + "---|" * len(ratios)]
    for porting in ("head", "sandwich"):
        for kind in dict.fromkeys(row["kind"] for row in r["rows"]):
            cells = []
            for x in ratios:
                row = next((row for row in r["rows"] if row["kind"] == kind and row["porting"] == porting
                            and row["ratio"] == x), None)
                if row is None:
                    cells.append("n/a")
                else:
                    z = row["zero_shot"]
                    cells.append(f"{z['mean']:.3f}" + (f" ± {z['std']:.3f}" if z["std"] > 0.0005 else ""))
            lines.append(f"| {kind} | {porting} | " + " | ".join(cells) + " |")
    ft = [row for row in r["rows"] if "finetuned" in row]
    if ft:
        lines += ["", f"After {r['finetune_iters']} finetuning steps (val loss on 50 fixed val batches; steps to "
                      "recover = first eval within 1% of the original):", "",
                  "| kind | porting | " + " | ".join(f"m/d={x:g}" for x in ratios) + " |",
                  "|---|---|" + "---|" * len(ratios)]
        for key in dict.fromkeys((row["kind"], row["porting"]) for row in ft):
            cells = []
            for x in ratios:
                row = next((row for row in ft if (row["kind"], row["porting"]) == key and row["ratio"] == x), None)
                if row is None:
                    cells.append("n/a")
                else:
                    steps = row["steps_to_recover"]
                    cells.append(f"{row['finetuned']:.3f} ({'—' if steps is None else steps})")
            lines.append(f"| {key[0]} | {key[1]} | " + " | ".join(cells) + " |")
    lines += ["", "![val loss vs width](results/ppl_vs_width/ppl_vs_width.png)", "", provenance(r)]
    return "\n".join(lines)


def geometry_vs_width(r: dict) -> str:
    lines = [f"d = {r['d']}; map-level compares T·u with u, model-level the transformed model's own hidden state; "
             "ε: max |‖Tu−Tv‖²/‖u−v‖² − 1| over probe pairs vs the JL guarantee at that width (δ = 0.05).", "",
             "| kind | m | HC map | HC model | AE map (rad) | AE model (rad) | FA tokens | FA PCs | ε max | ε q99 "
             "| JL bound ε |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in r["rows"]:
        bound = row["jl_eps_bound"]
        lines.append(f"| {row['kind']} | {row['m']} | {row['hc_map']:.4f} | {row['hc_model']:.4f} | "
                     f"{row['ae_map']:.4f} | {row['ae_model']:.4f} | {row['fa_tokens']:.3f} | {row['fa_pcs']:.3f} | "
                     f"{row['jl_eps_empirical_max']:.3f} | {row['jl_eps_empirical_q99']:.3f} | "
                     f"{'none < 1' if bound is None else f'{bound:.3f}'} |")
    lines += ["", "![geometry vs width](results/geometry_vs_width/geometry_vs_width.png)", "", provenance(r)]
    return "\n".join(lines)


def heatmaps(r: dict) -> str:
    lines = ["| transform | val loss (10 val batches) | AE model (rad) | HC model |", "|---|---|---|---|"]
    for label, row in r["runs"].items():
        lines.append(f"| {label} | {row['val_loss']:.4f} | {row['ae_model']:.4f} | {row['hc_model']:.4f} |")
    lines.append("")
    for label in r["runs"]:
        lines.append(f"**{label}**  ")
        lines.append(f"![cosine]({'results/heatmaps/' + label}_cosine_heatmaps.png)")
        lines.append(f"![norms]({'results/heatmaps/' + label}_norm_heatmap.png)")
        lines.append("")
    lines.append(provenance(r))
    return "\n".join(lines)


def arch_ablation(r: dict) -> str:
    transforms = list(dict.fromkeys(row["transform"] for row in r["rows"]))
    seeds = len(r["rows"][0].get("steps_per_seed") or [0])
    lines = [f"Steps to recover (first eval, every 20 steps, within 1% of the variant's own original val loss; "
             f"— = not within {r['finetune_iters']} steps; {seeds} finetuning seed{'s' if seeds > 1 else ''}, "
             "'/'-separated), zero-shot → finetuned val loss (first seed).", "",
             "| variant | original | " + " | ".join(transforms) + " |", "|---|---|" + "---|" * len(transforms)]
    for variant in dict.fromkeys(row["variant"] for row in r["rows"]):
        cells, reference = [], None
        for t in transforms:
            row = next(row for row in r["rows"] if row["variant"] == variant and row["transform"] == t)
            reference = row["reference"]
            per_seed = row.get("steps_per_seed") or [row["steps_to_recover"]]
            steps = "/".join("—" if x is None else str(x) for x in per_seed)  # one entry per finetuning seed
            cells.append(f"**{steps}** ({row['zero_shot']:.3f} → {row['finetuned']:.3f})")
        lines.append(f"| {variant} | {reference:.3f} | " + " | ".join(cells) + " |")
    lines += ["", "![recovery curves](results/arch_ablation/recovery_curves.png)", "", provenance(r)]
    return "\n".join(lines)


def heads(r: dict) -> str:
    sims = list(r["rows"][0]["ndcg"])
    lines = [f"Val loss (full val split) and NDCG@{r['ndcg_k']} of each similarity between the final normed hidden "
             "state and the token embeddings, against the model's own next-token distribution.", "",
             "| head | norm_reg λ | val loss | μ_E | σ_E | mean ‖h‖ layers 1..L | "
             + " | ".join(f"NDCG {s}" for s in sims) + " |",
             "|---|---|---|---|---|---|" + "---|" * len(sims)]
    for row in r["rows"]:
        e = row["embedding_norms"]
        norms = ", ".join(f"{x:.2f}" for x in row.get("hidden_norm_mean", [])[1:]) or "—"
        lines.append(f"| {row['head']} | {row['norm_reg']:g} | {row['val_loss']:.4f} | {e['mean']:.2f} | "
                     f"{e['std']:.2f} | {norms} | " + " | ".join(f"{row['ndcg'][s]:.3f}" for s in sims) + " |")
    lines += ["", "Hidden-state norms, linear head without and with the regularizer:", "",
              "![norms](results/heads/head_linear_reg0.0_norms.png)",
              "![norms](results/heads/head_linear_reg0.1_norms.png)",
              "", provenance(r)]
    return "\n".join(lines)


def grow_staging(r: dict) -> str:
    fl = r["flops_per_token"]
    schedule = (f" Stage 1 stops halfway through its cosine; the grown model then runs a fresh cosine from the "
                f"switch LR {r['lr_at_switch']:.2e} (no re-warmup) down to min_lr over its own "
                f"{r['iters_per_stage']} steps — not the continuation of stage 1's schedule. Grown runs are "
                f"evaluated on 100 val batches, stage 1 and scratch on 200 (two bases)." if "lr_at_switch" in r else "")
    lines = [f"Stage 1 trains width d = 64 for {r['iters_per_stage']} iterations; it is grown to 2d = 128 "
             f"(orthogonal, head porting: exact) and trained {r['iters_per_stage']} more.{schedule} Baseline: the "
             f"same 2d architecture from scratch for {2 * r['iters_per_stage']} iterations. FLOPs/token: "
             f"d {fl['d']:.3g}, 2d {fl['2d']:.3g}.", "",
             "| run | final val loss | training FLOPs | FLOPs to reach the scratch model's final loss "
             "| residual energy in range(T) |", "|---|---|---|---|---|",
             f"| 2d from scratch | {r['scratch'][-1][1]:.4f} | {r['scratch_flops_to_target']:.3g} | "
             f"{r['scratch_flops_to_target']:.3g} | — |"]
    if "scratch_loss_at_staged_compute" in r:
        lines.append(f"| 2d from scratch, at the staged runs' compute | {r['scratch_loss_at_staged_compute']:.4f} | "
                     f"{r['staged_total_flops']:.3g} | — | — |")
    for label, c in r["grown"].items():
        hit = c["flops_to_target"]
        total = f"{r['staged_total_flops']:.3g}" if "staged_total_flops" in r else "—"
        lines.append(f"| {label} | {c['curve'][-1][1]:.4f} | {total} | {'not reached' if hit is None else f'{hit:.3g}'}"
                     f" | {c['energy_in_range_T']:.4f} |")
    lines += ["", "![grow staging](results/grow_staging/grow_staging.png)", "", provenance(r)]
    return "\n".join(lines)


def quantization(r: dict) -> str:
    lines = [f"Original model: val loss {r['original_val_loss']:.4f}, mean weight excess kurtosis "
             f"{r['original_weight_kurtosis']:.2f}. Per-channel symmetric round-to-nearest on every weight matrix.",
             "", "| rotation (same width, head porting) | fp32 | int8 | int4 | mean weight kurtosis |",
             "|---|---|---|---|---|"]
    for row in r["rows"]:
        lines.append(f"| {row['rotation']} | {row['fp32']:.4f} | {row['int8']:.4f} | {row['int4']:.4f} | "
                     f"{row['weight_kurtosis']:.2f} |")
    lines += ["", provenance(r)]
    return "\n".join(lines)


def worked_example(_: dict | None) -> str:
    base = os.path.join(RESULTS, "worked_example")
    if not os.path.exists(os.path.join(base, "transform.json")):
        return missing("worked_example")
    t = json.load(open(os.path.join(base, "transform.json")))
    ft = json.load(open(os.path.join(base, "finetune.json")))
    zs = json.load(open(os.path.join(base, "zero_shot", "metrics.json")))
    fm = json.load(open(os.path.join(base, "finetuned", "metrics.json")))
    rec = t["transform"]

    def row(name, m):
        return (f"| {name} | {m['loss']['new']['val_loss']:.4f} | {m['kl']:.4f} | {m['top1_agreement']:.3f} | "
                f"{m['angular_error']['map']:.4f} | {m['angular_error']['model']:.4f} | "
                f"{m['concordance']['map']['pearson']:.4f} | {m['concordance']['model']['pearson']:.4f} | "
                f"{m['feature_alignment']['frequent_tokens']:.3f} |")

    steps = ft["steps_to_recover"]
    return "\n".join([
        f"Transform: d = {rec['d']} → m = {rec['m']} ({rec['kind']}, {rec['porting']} porting, norms={rec['norms']}); "
        f"val loss (full val split) {rec['val_loss_before']:.4f} → {rec['val_loss_after']:.4f} zero-shot. "
        f"Finetune: reference {ft['reference_val_loss']:.4f} (50 fixed val batches), final {ft['val_loss']:.4f}, "
        f"**steps to recover (1%): {'not within 200' if steps is None else steps}**.", "",
        "| model | val loss | KL(ref‖new) | top-1 agree | AE map | AE model | HC map | HC model | FA tokens |",
        "|---|---|---|---|---|---|---|---|---|",
        f"| reference | {zs['loss']['ref']['val_loss']:.4f} | 0 | 1 | 0 | 0 | 1 | 1 | 1 |",
        row("m=64 zero-shot", zs), row("m=64 + 200 steps", fm), "",
        "![layers](results/worked_example/finetuned/layers.png)",
        "![concordance](results/worked_example/finetuned/concordance.png)",
        "![norms](results/worked_example/finetuned/norm_heatmap.png)"])


def benchmarks(_: dict | None) -> str:
    lines = []
    path = os.path.join(ROOT, "bench", "results", "train_throughput.json")
    if os.path.exists(path):
        b = json.load(open(path))
        lines += ["Training, nanoGPT's CPU recipe shape (4 × 128, context 64, batch 12), median ms/iter of our "
                  f"`train.py` loop over {b['iters']} iterations, evaluation excluded; "
                  f"peak RSS {b['peak_rss_mb']:.0f} MB:",
                  "", "| run | ms/iter | tokens/s |", "|---|---|---|"]
        for key, label in (("ours_nanogpt_shape", "ours, nanoGPT's architecture (LayerNorm, GELU, tied, no bias)"),
                           ("ours_default_variant", "ours, default variant (untied head)"),
                           ("ours_rope_swiglu_rmsnorm_peri", "ours, RoPE + SwiGLU + RMSNorm + peri-LN")):
            lines.append(f"| {label} | {b[key]['ms_per_iter']:.1f} | {b[key]['tokens_per_s']:,.0f} |")
        if "head_to_head" in b:
            h = b["head_to_head"]
            lines += ["", "Head to head in one process, alternating rounds (same step loop; each repo's own model and "
                          "`configure_optimizers`):", "", "| model | ms/iter | tokens/s |", "|---|---|---|",
                      f"| nanoGPT model.py | {h['nanogpt']['ms_per_iter']:.1f} | {h['nanogpt']['tokens_per_s']:,.0f} |",
                      f"| nanoLGPT model.py | {h['ours']['ms_per_iter']:.1f} | {h['ours']['tokens_per_s']:,.0f} |"]
    path = os.path.join(ROOT, "bench", "results", "transform_speed.json")
    if os.path.exists(path):
        t = json.load(open(path))
        lines += ["", "Porting a GPT-2-small-shaped model (fold + projection + port + building the new model; "
                      "fresh process per row; 'extra peak' = peak RSS growth during the transform / model size):", "",
                  "| kind | m | porting | seconds | extra peak / model size | model MB |", "|---|---|---|---|---|---|"]
        for c in t["cases"]:
            lines.append(f"| {c['kind']} | {c['m']} | {c['porting']} | {c['seconds']:.1f} | "
                         f"{c['extra_peak_over_model']:.2f}× | {c['model_mb']} |")
    path = os.path.join(ROOT, "bench", "results", "geometry_speed.json")
    if os.path.exists(path):
        g = json.load(open(path))
        sec = g["seconds"]
        lines += ["", f"Geometry metrics at N = {g['n_probes']} probes (`python bench/geometry_speed.py`): AE over all "
                      f"pairs {sec['angular_error']:.2f} s, HC (Pearson over all pairs + Spearman on 200k) "
                      f"{sec['hyperspherical_concordance']:.2f} s, JL distortion {sec['jl_distortion']:.2f} s; "
                      f"extra peak memory {g['extra_peak_rss_mb']} MB (chunked: O(chunk·N))."]
    if not lines:
        return "*Not run yet: python bench/train_throughput.py; python bench/transform_speed.py*"
    return "\n".join(lines)


SECTIONS = {f.__name__: f for f in (ppl_vs_width, geometry_vs_width, heatmaps, arch_ablation, heads, grow_staging,
                                    quantization)}


def render(name: str) -> str:
    if name == "worked_example":
        return worked_example(None)
    if name == "benchmarks":
        return benchmarks(None)
    r = load(name)
    return SECTIONS[name](r) if r is not None else missing(name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    path = os.path.join(ROOT, "README.md")
    text = open(path).read()
    new = text
    stale = []
    for name in list(SECTIONS) + ["worked_example", "benchmarks"]:
        pattern = re.compile(rf"(<!-- BEGIN {name} -->\n).*?(<!-- END {name} -->)", re.S)
        before = new
        new = pattern.sub(lambda m, n=name: m.group(1) + render(n) + "\n" + m.group(2), new)
        if new != before:
            stale.append(name)
    if args.check:
        if stale:
            print(f"README tables out of date with results/: {', '.join(stale)}; run python scripts/report.py",
                  file=sys.stderr)
        sys.exit(1 if stale else 0)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from experiments import PLOTS, replot  # figures too, from the same JSON
    for name in PLOTS:
        payload = load(name)
        if payload is not None:
            replot(name, payload)
    with open(path, "w") as f:
        f.write(new)
    print("README.md results regenerated")


if __name__ == "__main__":
    main()
