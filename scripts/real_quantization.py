"""
The paper's same-width application where it can matter (issue #43): rotate a real model's residual stream at m = d
— exactly — and quantize it, against the same model unrotated. SmolLM2-135M carries massive activations (coordinate
507, up to ~24,900: results/real_model_geometry) of the kind QuaRot and SpinQuant rotate away before 4-bit rounding.

    python scripts/real_quantization.py          (scripts/real_quantization.sh; reuses real_model.sh's cache)

Rotations, each one ``transform.py --width=576`` step on the imported model (exact in float: the transform record
says so, and the first val window's logits are compared with the unrotated model's):
- none: T = I — the same canonical form as every rotated model (norm gains folded into the readers, head untied),
  so a difference is the rotation's alone;
- hadamard: H·D/√d (maps.hadamard_matrix: Sylvester × Paley, order 576 = 16·36), seeds 0–2;
- orthogonal: Haar-random, seeds 0–2;
- pca: the stream's principal basis at m = d (calibrated as in results/real_model), deterministic;
- compressed-tensors: the random Hadamard matrix that llm-compressor's transforms apply
  (``compressed_tensors.transform.utils.hadamard.random_hadamard_matrix``, seed 0), given as ``--map_file`` —
  their matrix, our port (needs ``pip install compressed-tensors``; without it the row is left out, and says so).
Quantizations (quantize.py; symmetric round-to-nearest, the embedding and the head in float, as QuaRot's and
SpinQuant's evaluations): W4 per output channel, W4 with groups of 64 (128, the usual size, does not divide
d = 576), W4A4 (W4 per channel and 4-bit activations per token at the residual's readers, where the rotation
acts); W8A8 at every linear layer for the unrotated model and Hadamard seed 0 only (at ~4 minutes per evaluation
on one core, the 4-bit settings come first); W4A4 at every linear layer (QuaRot's setting, without its online
Hadamards) for the unrotated model and the three Hadamard seeds.
Losses: the whole val split of tinyshakespeare and of Botchan (an English novel, the general text), 256-token
windows, one thread. Writes results/real_model_quantization/results.json after every model.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

import harness  # noqa: E402
from harness import RESULTS, cached, hardware  # noqa: E402
from lgpt.method import geometry as geo  # noqa: E402
from lgpt.method.quantize import Quantization, activation_outliers, block_linears, fake_quantized  # noqa: E402
from lgpt.plumbing.checkpoint import load_model  # noqa: E402
from lgpt.plumbing.dataset import BatchLoader  # noqa: E402
from real_model import (  # noqa: E402
    BLOCK,
    EVAL_VERSION,
    EVALS,
    TEXTS,
    evaluation_losses,
    imported,
    losses,
    prepared,
    transformed,
)

D = 576
SETTINGS = (Quantization(weight_bits=4), Quantization(weight_bits=4, group=64),
            Quantization(weight_bits=4, act_bits=4))
INT8 = Quantization(weight_bits=8, act_bits=8, act_at="all")  # the bar int8 users know: unrotated and Hadamard only
INT8_ROWS = (("none", 0), ("hadamard", 0))
# 4-bit activations at every linear layer (QuaRot's setting): a residual rotation reaches only the readers' inputs,
# so this asks what the attention output and the MLP's hidden state — which QuaRot rotates online — cost unrotated
INT4_ALL = Quantization(weight_bits=4, act_bits=4, act_at="all")
INT4_ALL_ROWS = (("none", 0), ("hadamard", 0), ("hadamard", 1), ("hadamard", 2))
SEEDS = (0, 1, 2)
# (name, kind, seed): the most telling first, so that a run cut short still compares something
ROTATIONS = [("none", "truncate", 0), ("hadamard", "hadamard", 0), ("compressed-tensors", "file", 0),
             ("orthogonal", "orthogonal", 0), ("pca", "pca", 0)]
ROTATIONS += [(name, kind, s) for name, kind in (("hadamard", "hadamard"), ("orthogonal", "orthogonal"))
              for s in SEEDS[1:]]


def compressed_tensors_map() -> str | None:
    """compressed-tensors' random Hadamard R (d×d, seed 0) saved as our map T = Rᵀ/√d (they apply x·R/√d to a
    row state x: the same as T·x); None where the package is not installed."""
    try:
        from importlib.metadata import version

        from compressed_tensors.transform.utils.hadamard import random_hadamard_matrix
    except ImportError:
        return None

    def build(out: str) -> dict:
        os.makedirs(out, exist_ok=True)
        R = random_hadamard_matrix(D, torch.float64, gen=torch.Generator().manual_seed(0))
        torch.save(R.T.contiguous() / D ** 0.5, os.path.join(out, "T.pt"))
        return {"version": version("compressed-tensors")}

    out, _ = cached("map", "compressed-tensors-hadamard", {"d": D, "seed": 0, "version": version(
        "compressed-tensors")}, build)
    return os.path.join(out, "T.pt")


def quantized_losses(model_dir: str, data: dict[str, str], q: Quantization) -> dict:
    """The fake-quantized model's loss on each evaluation text's whole val split, cached per (model, setting)."""
    def build(out: str) -> dict:
        os.makedirs(out, exist_ok=True)
        return evaluation_losses(fake_quantized(load_model(model_dir)[0], q), data)

    spec = {"model": harness.relative(model_dir), "quantization": dataclasses.asdict(q), "evals": EVALS,
            "block": BLOCK, "v": EVAL_VERSION}
    label = f"{os.path.basename(model_dir)[:40]}-{q.label}"
    return cached("eval", label, spec, build)[1]


@torch.no_grad()
def model_facts(model_dir: str, reference: str, window: torch.Tensor) -> dict:
    """Exactness (largest logit difference from the unrotated model on one window) and outlier statistics."""
    model, ckpt = load_model(model_dir)
    ref, _ = load_model(reference)
    diff = (model(window, all_logits=True)[0] - ref(window, all_logits=True)[0]).abs().max().item()
    return {"exact": bool(ckpt["transform"]["exact"]), "max_logit_difference": diff,
            "readers_input": activation_outliers(model, window),
            "weight_kurtosis": statistics.fmean(geo.excess_kurtosis(m.weight) for m in block_linears(model).values())}


def summary(rows: list[dict]) -> list[dict]:
    """Per rotation and setting: mean ± std over seeds (n), and the difference from no rotation."""
    out = []
    names = list(dict.fromkeys(r["rotation"] for r in rows))
    base = next((r for r in rows if r["rotation"] == "none"), None)
    for name in names:
        group = [r for r in rows if r["rotation"] == name]
        entry = {"rotation": name, "n": len(group), "settings": {}}
        for label in group[0]["losses"]:
            cell = {}
            for text in EVALS:
                values = [r["losses"][label][text] for r in group if label in r["losses"]]
                if not values:
                    continue
                cell[text] = harness.mean_spread(values)
                if base is not None and label in base["losses"]:
                    cell[f"{text}_vs_none"] = statistics.fmean(values) - base["losses"][label][text]
            entry["settings"][label] = cell
        out.append(entry)
    return out


def start(description: str, parts: tuple[str, ...] = ()) -> tuple[argparse.Namespace, float, str, dict[str, str]]:
    """What every real-model experiment after real_model.py starts with: its --reverse flag (and --part, default
    the last of ``parts``, where it has parts), the clock, one thread per process, the imported model and its
    prepared texts (args, started, model directory, texts)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--reverse", action="store_true", help="build the models from the end of the list (a "
                        "second process on another core meets the first in the middle; results come from the cache)")
    if parts:
        parser.add_argument("--part", choices=parts, default=parts[-1])
    args = parser.parse_args()
    started = time.time()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    src, _ = imported()
    return args, started, src, {text: prepared(src, text) for text in TEXTS}


def main() -> None:
    args, started, src, data = start(__doc__.split("\n\n")[0])
    window = next(iter(BatchLoader(data["shakespeare"], BLOCK, 1, "cpu").full_split("val")))[0]
    ct_map = compressed_tensors_map()
    reference, _ = transformed(src, data, D, "truncate")  # T = I: the canonical form (real_model's control)
    rows, notes = [], []
    if ct_map is None:
        notes.append("compressed-tensors is not installed (pip install compressed-tensors): its row is left out")
    if args.reverse:  # build only: the forward run writes the results in the table's order
        for _name, kind, seed in reversed(ROTATIONS):
            if kind != "file" or ct_map is not None:
                out, _ = transformed(src, data, D, "orthogonal" if kind == "file" else kind, seed=seed,
                                     extra=(f"--map_file={ct_map}",) if kind == "file" else ())
                for q in reversed(SETTINGS):
                    quantized_losses(out, data, q)
        return
    for name, kind, seed in ROTATIONS:
        if kind == "file" and ct_map is None:
            continue
        extra = (f"--map_file={ct_map}",) if kind == "file" else ()
        out, record = transformed(src, data, D, "orthogonal" if kind == "file" else kind, extra=extra, seed=seed)
        row = {"rotation": name, "kind": kind, "seed": seed, "out_dir": out, **model_facts(out, reference, window),
               "float": losses(out, data) if name == "none" else None, "losses": {}}
        rows.append(row)
        for q in SETTINGS + ((INT8,) if (name, seed) in INT8_ROWS else ()) + (
                (INT4_ALL,) if (name, seed) in INT4_ALL_ROWS else ()):
            row["losses"][q.label] = quantized_losses(out, data, q)
            print(f"{name} seed {seed} {q.label}: val {row['losses'][q.label]['val']:.4f}, "
                  f"general {row['losses'][q.label]['general']:.4f}", flush=True)
            save({"model": "SmolLM2-135M-Instruct (GGUF Q4_1, dequantized to float32)", "d": D, "block": BLOCK,
                  "settings": [dict(dataclasses.asdict(q), label=q.label) for q in (*SETTINGS, INT8, INT4_ALL)],
                  "rows": rows,
                  "summary": summary(rows), "notes": notes}, started)


def saved(experiment: str, command: str) -> dict:
    """results/<experiment>/results.json as an earlier run of ``command`` wrote it (what a part that adds to it
    starts from); stops with one line naming the fix where there is none."""
    path = os.path.join(RESULTS, experiment, "results.json")
    if not os.path.exists(path):
        sys.exit(f"{path} is missing: run {command} (every part) first")
    with open(path) as f:
        return json.load(f)


def save(payload: dict, started: float, experiment: str = "real_model_quantization",
         command: str = "scripts/real_quantization.sh", merge: bool = False) -> None:
    """results/<experiment>/results.json with the run's seconds, hardware and command, written atomically.
    ``merge``: the keys the file holds and ``payload`` lacks are kept — a part that adds to saved results began
    from the file as it was then, and another part running beside it may have saved its own key since."""
    out = os.path.join(RESULTS, experiment)
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "results.json")
    if merge and os.path.exists(path):
        with open(path) as f:
            payload = {**json.load(f), **payload}
    payload = dict(payload, meta={"seconds": round(time.time() - started), "hardware": hardware(),
                                  "command": command})
    tmp = os.path.join(out, f"results.json.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        json.dump(harness.repo_relative(payload), f, indent=2, default=str)
    os.replace(tmp, path)


if __name__ == "__main__":
    main()
