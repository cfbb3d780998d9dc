"""
eval_geometry.py on a real model (issue #43): SmolLM2-135M alone, and against what the maps of
results/real_model and results/real_model_quantization made of it — the figures a reader looks at, and the numbers.

    python scripts/real_geometry.py          (scripts/real_geometry.sh; after real_model.sh and real_quantization.sh)

Each comparison is one ``eval_geometry.py`` command as a user types it (1,024 probes from one val batch of 16
tinyshakespeare windows of 256 tokens, loss / KL / agreement on 2 val batches: a sample, not the full split —
the full-split losses are results/real_model's), run in its own process on one thread:
- ``alone``: the imported model (norm heatmap, per-layer norms, intrinsic dimension, kurtosis, NDCG, logit lens);
- ``pca_m432``: one global PCA map at m/d = 0.75 (the shrink of the README);
- ``hadamard_m576``: the Hadamard rotation at m = d (the quantization study's; exact, so AE ≈ 0 and the
  weights' kurtosis is what changes).
Its metrics.json and PNG figures are copied to results/real_model_geometry/eval_geometry/NAME/, and
results/real_model_geometry/eval_geometry.json gathers the numbers its table shows.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from harness import RESULTS, cached, hardware, relative, repo_relative  # noqa: E402
from real_model import BLOCK, TEXTS, imported, prepared, run_step, transformed  # noqa: E402

PROBES = ["--n_probes=1024", "--probe_batches=1", "--batch_size=16", "--eval_iters=2", "--heatmap_probes=48",
          f"--block_size={BLOCK}", "--wandb_log=False", "--seed=0"]


def report(name: str, ref: str, data_dir: str, new: str | None = None, family: str = "smollm2",
           probes: list[str] | None = None) -> dict:
    """One eval_geometry.py run (cached by its arguments): its metrics and where its figures are."""
    args = ["eval_geometry.py", f"--ref_dir={ref}", f"--data_dir={data_dir}", *(probes or PROBES)] + (
        [f"--in_dir={new}"] if new else [])
    spec = {"args": [a.split("=")[0] + "=" + relative(a.split("=", 1)[1]) if a.startswith(
        ("--ref_dir", "--in_dir", "--data_dir")) else a for a in args], "v": 1}

    def build(out: str) -> dict:
        step = run_step([*args, f"--out_dir={out}/report", "--overwrite=True"])
        return {"step": {k: v for k, v in step.items() if k != "log"}}

    out, result = cached("geometry", f"{family}-{name}", spec, build)
    with open(os.path.join(out, "report", "metrics.json")) as f:
        return dict(result, metrics=json.load(f), report_dir=os.path.join(out, "report"))


def summary(metrics: dict) -> dict:
    """The numbers results/real_model_geometry/table.md shows from one metrics.json."""
    ref = metrics["models"]["ref"]
    out = {"loss": {k: v["val_loss"] for k, v in metrics["loss"].items()}, "loss_basis": metrics["loss_basis"],
           "ref_intrinsic_dimension": ref["intrinsic_dimension"], "ref_twonn": ref["twonn_dimension"],
           "ref_activation_kurtosis": ref["activation_kurtosis"], "ref_hidden_norm_mean": ref["hidden_norm_mean"],
           "figures": metrics["figures"]}
    if "new" in metrics["models"]:
        new = metrics["models"]["new"]
        out.update({"kl": metrics.get("kl"), "top1_agreement": metrics.get("top1_agreement"),
                    "angular_error": {k: v for k, v in metrics["angular_error"].items() if "per_group" not in k},
                    "concordance": {k: v["pearson"] for k, v in metrics["concordance"].items()
                                    if isinstance(v, dict)},
                    "new_intrinsic_dimension": new["intrinsic_dimension"],
                    "new_activation_kurtosis": new["activation_kurtosis"],
                    "weight_kurtosis_mean": {
                        which: sum(m["weight_kurtosis"].values()) / len(m["weight_kurtosis"])
                        for which, m in (("ref", ref), ("new", new))},
                    "feature_alignment": metrics.get("feature_alignment")})
    return out


def main() -> None:
    started = time.time()
    src, _ = imported()
    data = {text: prepared(src, text) for text in TEXTS}
    pca, _ = transformed(src, data, 432, "pca")
    hadamard, _ = transformed(src, data, 576, "hadamard")
    target = os.path.join(RESULTS, "real_model_geometry", "eval_geometry")
    rows = {}
    for name, new in (("alone", None), ("pca_m432", pca), ("hadamard_m576", hadamard)):
        r = report(name, src, data["shakespeare"], new)
        into = os.path.join(target, name)
        os.makedirs(into, exist_ok=True)
        for file in r["metrics"]["figures"].values():
            shutil.copy(os.path.join(r["report_dir"], file), os.path.join(into, file))
        with open(os.path.join(into, "metrics.json"), "w") as f:  # the report's, its paths made repo-relative
            json.dump(repo_relative(r["metrics"]), f, indent=2)
        rows[name] = dict(summary(r["metrics"]), seconds=r["step"]["seconds"], peak_mb=r["step"]["peak_mb"],
                          figures_dir=os.path.relpath(into, RESULTS))
        payload = {"model": "SmolLM2-135M-Instruct", "probes": PROBES, "rows": rows,
                   "meta": {"seconds": round(time.time() - started), "hardware": hardware(),
                            "command": "scripts/real_geometry.sh"}}
        with open(os.path.join(RESULTS, "real_model_geometry", "eval_geometry.json.tmp"), "w") as f:
            json.dump(repo_relative(payload), f, indent=2)
        os.replace(os.path.join(RESULTS, "real_model_geometry", "eval_geometry.json.tmp"),
                   os.path.join(RESULTS, "real_model_geometry", "eval_geometry.json"))
        print(f"{name}: {rows[name]['loss']} in {rows[name]['seconds']:.0f} s", flush=True)


if __name__ == "__main__":
    main()
