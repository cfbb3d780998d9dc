"""Pairwise geometry metrics at N = 4096 probes (d = 128 → m = 64): seconds and peak RSS.

    python bench/geometry_speed.py
AE and HC run over all N(N−1)/2 ≈ 8.4M pairs in row chunks (memory O(chunk·N)); Spearman and the JL
distortion use 200k sampled pairs. Results: bench/results/geometry_speed.json.
"""
from __future__ import annotations

import json
import os
import resource
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch  # noqa: E402

from lgpt.method import geometry as geo  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import spread, threads_note  # noqa: E402

REPEATS = 3


def main() -> None:
    g = torch.Generator().manual_seed(0)
    X = torch.randn(4096, 128, generator=g, dtype=torch.float64)
    T = torch.randn(64, 128, generator=g, dtype=torch.float64) / 8
    Y = X @ T.T
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    timings: dict[str, list[float]] = {}
    for _ in range(REPEATS):  # alternating, so that every metric sees the same machine load
        for name, fn in (("angular_error", lambda: geo.angular_error(X, Y)),
                         ("hyperspherical_concordance", lambda: geo.hyperspherical_concordance(X, Y)),
                         ("jl_distortion", lambda: geo.jl_distortion(X, T))):
            t0 = time.perf_counter()
            fn()
            timings.setdefault(name, []).append(time.perf_counter() - t0)
    result = {"n_probes": 4096, "d": 128, "m": 64, "seconds": {name: spread(v) for name, v in timings.items()},
              "extra_peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - rss0),
              "threads": threads_note(), "torch_threads": torch.get_num_threads()}
    path = os.path.join(ROOT, "bench", "results", "geometry_speed.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=2)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    if any(a in ("-h", "--help") for a in sys.argv[1:]):
        print(__doc__.strip())
        sys.exit(0)
    main()
