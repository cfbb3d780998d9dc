"""Porting speed and memory on a GPT-2-small shape (12 layers, n_embd 768, 12 heads, vocab 50257, context 1024).

    python bench/transform_speed.py [OPTIONS_SUBSTRING | plain] [--repeats=3]
Each case runs --repeats times, each in a fresh subprocess so that its peak RSS is its own; the table gives
the mean ± std over the repeats. Timed: canonicalize + projection +
port + building the new model; for the calibrated cases (pca, --refit, --learn_steps) also the calibration
forward passes, the fits and the learned map, on a few batches of random tokens (the weights are random too:
this measures cost, not quality). Results: bench/results/transform_speed.json.
"""
from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import spread, threads_note  # noqa: E402

CASES = [("orthogonal", 768, "head", ""), ("orthogonal", 1536, "head", ""), ("gaussian", 384, "head", ""),
         ("srht", 768, "head", ""), ("gaussian", 768, "sandwich", ""),
         ("pca", 384, "residual", "refit=all"), ("pca", 384, "residual", "refit=all,learn_steps=20")]
CALIBRATION = {"calib_batches": 4, "batch_size": 2}  # 4 × 2 sequences of 1024 tokens


def random_token_data(vocab: int) -> str:
    """A throwaway dataset directory of random token ids (train.bin, val.bin) for the calibrated cases."""
    import tempfile

    import numpy as np
    path = tempfile.mkdtemp(prefix="bench-calib-")
    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        rng.integers(0, vocab, 200_000, dtype=np.uint16).tofile(os.path.join(path, f"{split}.bin"))
    return path


def one_case(kind: str, width: int, porting: str, options: str = "") -> dict:
    sys.path.insert(0, ROOT)
    import torch

    from lgpt.method.pipeline import transform_model
    from lgpt.method.spec import TransformSpec
    from model import GPT, GPTConfig
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=12, n_head=12, n_embd=768, block_size=1024, vocab_size=50257, head="tied"))
    model.eval()
    size_mb = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    t0 = time.perf_counter()
    extra = {k: (v if k == "refit" else int(v)) for k, v in (o.split("=") for o in options.split(",") if o)}
    if kind == "pca" or extra:
        from lgpt.plumbing.dataset import BatchLoader
        loader = BatchLoader(random_token_data(50257), 1024, CALIBRATION["batch_size"])
        rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        t0 = time.perf_counter()
        spec = TransformSpec.from_flat(width=width, kind=kind, porting=porting, norms="fold", seed=0,
                                       calib_batches=CALIBRATION["calib_batches"], **extra)
        new, record = transform_model(model, spec, loader)
    else:
        with torch.no_grad():
            new, record = transform_model(
                model, TransformSpec.from_flat(width=width, kind=kind, porting=porting, norms="fold", seed=0))
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"kind": kind, "m": width, "porting": porting, "options": options, "seconds": round(seconds, 2),
            "model_mb": round(size_mb), "peak_rss_mb": round(peak), "rss_before_mb": round(rss_before),
            "extra_peak_over_model": round((peak - rss_before) / size_mb, 2),
            "total_peak_over_model": round(peak / size_mb, 2)}


def main() -> None:
    if len(sys.argv) == 5:
        print(json.dumps(one_case(sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4])))
        return
    repeats = next((int(a.split("=", 1)[1]) for a in sys.argv[1:] if a.startswith("--repeats=")), 3)
    rest = [a for a in sys.argv[1:] if not a.startswith("--repeats=")]
    only = rest[0] if rest else ""  # e.g. 'refit': the cases whose options mention it; 'plain': those without
    path = os.path.join(ROOT, "bench", "results", "transform_speed.json")
    results = {"threads": threads_note(), "cases": []}
    if os.path.exists(path):  # cases not run this time keep their last measurement
        with open(path) as f:
            results = json.load(f)
    exact = any(only == o for *_, o in CASES)  # an exact options string runs that case alone
    for kind, width, porting, options in CASES:
        if only == "plain":
            if options:
                continue
        elif only and (only != options if exact else only not in options):
            continue  # otherwise every case whose options mention it
        runs = []
        for _ in range(repeats):
            out = subprocess.run([sys.executable, __file__, kind, str(width), porting, options], capture_output=True,
                                 text=True, check=True).stdout
            runs.append(json.loads(out.strip().splitlines()[-1]))
        case = {key: runs[0][key] for key in ("kind", "m", "porting", "options", "model_mb")}
        for key in ("seconds", "extra_peak_over_model", "total_peak_over_model"):
            case[key] = spread([r[key] for r in runs])
        results["cases"] = [c for c in results["cases"] if (c["kind"], c["m"], c["porting"], c.get("options", ""))
                            != (kind, width, porting, options)]
        results["cases"].append(case)
        print(case)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:  # after every case: a long run stopped early keeps what it measured
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    if any(a in ("-h", "--help") for a in sys.argv[1:]):
        print(__doc__.strip())
        sys.exit(0)
    main()
