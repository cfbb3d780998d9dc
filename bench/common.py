"""What every benchmark records: each repeat's value, and their summary (mean ± sample std over n)."""
from __future__ import annotations

import json
import os
import statistics


def spread(values: list[float]) -> dict:
    """The repeats of one measurement and their mean, sample std (0 for n = 1), min and max."""
    return {"values": [round(v, 4) for v in values], "n": len(values), "mean": statistics.fmean(values),
            "std": statistics.stdev(values) if len(values) > 1 else 0.0, "min": min(values), "max": max(values)}


def threads_note() -> str:
    """The thread count the benchmark ran with, as set (OMP_NUM_THREADS) or torch's default."""
    return os.environ.get("OMP_NUM_THREADS", "default")


def write_result(name: str, result: dict) -> None:
    """bench/results/NAME.json, written whole (a temporary file renamed into place), and printed."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", f"{name}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(result, f, indent=2)
    os.replace(path + ".tmp", path)
    print(json.dumps(result, indent=2))
