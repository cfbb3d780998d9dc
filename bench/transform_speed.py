"""Porting speed and memory on a GPT-2-small shape (12 layers, n_embd 768, 12 heads, vocab 50257, context 1024).

    python bench/transform_speed.py
Each (kind, width) runs in a fresh subprocess so that its peak RSS is its own. Timed: canonicalize +
projection + port + building the new model (a PCA's calibration forward passes are excluded by
construction: this benchmark uses data-free kinds). Results: bench/results/transform_speed.json.
"""
from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CASES = [("orthogonal", 768, "head"), ("orthogonal", 1536, "head"), ("gaussian", 384, "head"),
         ("srht", 768, "head"), ("gaussian", 768, "sandwich")]


def one_case(kind: str, width: int, porting: str) -> dict:
    sys.path.insert(0, ROOT)
    import torch

    from model import GPT, GPTConfig
    from transform import transform_model
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=12, n_head=12, n_embd=768, block_size=1024, vocab_size=50257, head="tied"))
    model.eval()
    size_mb = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    t0 = time.perf_counter()
    with torch.no_grad():
        new, record = transform_model(model, width, kind=kind, porting=porting, norms="fold", seed=0)
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"kind": kind, "m": width, "porting": porting, "seconds": round(seconds, 2),
            "model_mb": round(size_mb), "peak_rss_mb": round(peak), "rss_before_mb": round(rss_before),
            "extra_peak_over_model": round((peak - rss_before) / size_mb, 2),
            "total_peak_over_model": round(peak / size_mb, 2)}


def main() -> None:
    if len(sys.argv) == 4:
        print(json.dumps(one_case(sys.argv[1], int(sys.argv[2]), sys.argv[3])))
        return
    results = {"threads": os.environ.get("OMP_NUM_THREADS", "default"), "cases": []}
    for kind, width, porting in CASES:
        out = subprocess.run([sys.executable, __file__, kind, str(width), porting], capture_output=True, text=True,
                             check=True).stdout
        results["cases"].append(json.loads(out.strip().splitlines()[-1]))
        print(results["cases"][-1])
    path = os.path.join(ROOT, "bench", "results", "transform_speed.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(results, f, indent=2)


if __name__ == "__main__":
    if any(a in ("-h", "--help") for a in sys.argv[1:]):
        print(__doc__.strip())
        sys.exit(0)
    main()
