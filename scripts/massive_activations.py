"""
A real model's massive activations and attention sinks (SmolLM2-135M, issue #43), and what a width map keeps of
them — measured, so that the tables can name them instead of describing them.

    python scripts/massive_activations.py            (after scripts/real_model.sh has built its models)

On the first val windows of tinyshakespeare (SmolLM2's tokens, 256-token windows, one CPU thread):
- per layer (the residual stream entering each block, and the final one): the largest |coordinate| and where it
  is (coordinate, position, token), the median state norm, and the ratio of the two (Sun et al., 2024, call
  activations ~10³–10⁴ × the median "massive");
- the coordinates that carry them (those reaching 100 × the median |coordinate| anywhere), with the layers and
  positions where they do;
- attention sinks: per layer, the mean attention weight every query puts on position 0, averaged over heads, and
  the share of heads that put more than half their weight there;
- what each shrink keeps of the massive coordinates: the energy of e_k inside range(Tᵀ), ‖T·e_k‖², for the maps of
  results/real_model (PCA weighted by direction or by size, one global map or site 0 of the per-block maps).
Writes results/real_model_geometry/results.json.
"""
from __future__ import annotations

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from harness import RESULTS, hardware, repo_relative  # noqa: E402
from lgpt.plumbing.checkpoint import load_model  # noqa: E402
from lgpt.plumbing.dataset import BatchLoader, Tokenizer  # noqa: E402
from real_model import imported, prepared  # noqa: E402  (cached: found, not rebuilt)

WINDOWS, BLOCK = 4, 256
MASSIVE = 100.0  # × the median |coordinate|: a coordinate this large somewhere counts as a massive activation


@torch.no_grad()
def stream_report(model, x: torch.Tensor, decode) -> dict:
    """Per layer: the largest |coordinate| and where, the median state norm; the massive coordinates; sinks."""
    cache = model.run_with_cache(x)[1]
    L = model.config.n_layer
    states = [cache[f"blocks.{l}.hook_resid_pre"] for l in range(L)] + [cache[f"blocks.{L - 1}.hook_resid_post"]]
    layers, massive = [], {}
    for l, h in enumerate(states):
        a = h.abs()
        flat = int(a.argmax())
        b, t, k = (int(i) for i in torch.unravel_index(torch.tensor(flat), a.shape))
        median_norm = h.norm(dim=-1).median().item()
        median_coordinate = a.median().item()
        layers.append({"layer": l, "max_abs": a.max().item(), "coordinate": k, "position": t,
                       "token": decode([int(x[b, t])]), "median_norm": median_norm,
                       "max_over_median_norm": a.max().item() / median_norm})
        for k in (a > MASSIVE * median_coordinate).nonzero()[:, 2].unique().tolist():
            hits = (a[..., k] > MASSIVE * median_coordinate)
            entry = massive.setdefault(k, {"coordinate": k, "layers": [], "positions": set(), "max_abs": 0.0})
            entry["layers"].append(l)
            entry["positions"].update(hits.nonzero()[:, 1].tolist())
            entry["max_abs"] = max(entry["max_abs"], a[..., k].max().item())
    sinks = []
    for l in range(L):
        p = cache[f"blocks.{l}.attn.hook_pattern"]  # (B, H, T, T)
        first = p[..., 1:, 0]  # every query after position 0, its weight on position 0
        per_head = first.mean(dim=(0, 2))
        sinks.append({"layer": l, "mean_weight_on_position_0": per_head.mean().item(),
                      "heads_over_half": int((per_head > 0.5).sum()), "heads": len(per_head)})
    for entry in massive.values():
        entry["positions"] = sorted(entry["positions"])[:20]
    return {"layers": layers, "massive": sorted(massive.values(), key=lambda e: -e["max_abs"]), "sinks": sinks}


def kept_energy(T: torch.Tensor, coordinates: list[int]) -> dict[str, float]:
    """‖T·e_k‖² for each coordinate k: the share of a stream along e_k that survives the map (1: all of it)."""
    return {str(k): float((T[:, k].double() ** 2).sum()) for k in coordinates}


def main() -> None:
    started = time.time()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    with open(os.path.join(RESULTS, "real_model", "results.json")) as f:
        grid = json.load(f)
    src, _ = imported()
    model, ckpt = load_model(src)
    tokenizer = Tokenizer(ckpt["meta"])
    loader = BatchLoader(prepared(src, "shakespeare"), BLOCK, WINDOWS, "cpu")
    x, _ = next(iter(loader.full_split("val")))
    report = stream_report(model, x, tokenizer.decode)
    coordinates = [e["coordinate"] for e in report["massive"]]
    maps = []
    for row in grid["rows"]:
        if row["kind"] != "pca" or row["m"] != 432 or row.get("source") != "imported":
            continue
        record = load_model(row["out_dir"])[1]["transform"]
        maps.append({"porting": row["porting"], "options": row.get("options", []), "calibration": row["calibration"],
                     "kept": kept_energy(record["T"], coordinates), "val": row["losses"]["val"]})
    payload = {"model": grid["model"], "windows": WINDOWS, "block": BLOCK, "massive_threshold": MASSIVE, **report,
               "maps": maps, "meta": {"seconds": round(time.time() - started), "hardware": hardware(),
                                      "command": "python scripts/massive_activations.py"}}
    out = os.path.join(RESULTS, "real_model_geometry")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "results.json.tmp"), "w") as f:
        json.dump(repo_relative(payload), f, indent=2)
    os.replace(os.path.join(out, "results.json.tmp"), os.path.join(out, "results.json"))
    print(json.dumps({k: payload[k] for k in ("massive", "sinks")}, indent=1)[:3000])


if __name__ == "__main__":
    main()
