"""What every benchmark records: each repeat's value, and their summary (mean ± sample std over n)."""
from __future__ import annotations

import os
import statistics


def spread(values: list[float]) -> dict:
    """The repeats of one measurement and their mean, sample std (0 for n = 1), min and max."""
    return {"values": [round(v, 4) for v in values], "n": len(values), "mean": statistics.fmean(values),
            "std": statistics.stdev(values) if len(values) > 1 else 0.0, "min": min(values), "max": max(values)}


def threads_note() -> str:
    """The thread count the benchmark ran with, as set (OMP_NUM_THREADS) or torch's default."""
    return os.environ.get("OMP_NUM_THREADS", "default")
