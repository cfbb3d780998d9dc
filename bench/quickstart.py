"""The README's quick start, timed as a newcomer runs it: `python train.py configs/shakespeare_char.py` in a fresh
output directory with no thread setting, on an idle machine and with one core kept busy by another process. For
contrast, torch's old default under the same load (every core's thread, OMP_NUM_THREADS = cores) for a short run.

    python bench/quickstart.py [--contrast_iters=200]

Records wall time (start-up and data preparation included), the first line (the thread note) and the final val
loss line of each run in bench/results/quickstart.json; the README quotes them (scripts/report.py).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMAND = ["train.py", "configs/shakespeare_char.py"]


def busy_core() -> subprocess.Popen:
    """Another process that keeps one core busy (what 'other work running' means here)."""
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def run(extra: list[str], env: dict[str, str]) -> dict:
    with tempfile.TemporaryDirectory() as out:
        t0 = time.perf_counter()
        done = subprocess.run([sys.executable, *COMMAND, f"--out_dir={out}", *extra], cwd=ROOT, env=env,
                              capture_output=True, text=True, check=True)
        seconds = time.perf_counter() - t0
    lines = done.stdout.splitlines()
    final = next((line for line in reversed(lines) if line.startswith("done:")), "")
    step = [float(m) for m in re.findall(r"(\d+\.\d+) ms", done.stdout)]
    return {"seconds": round(seconds, 1), "first_line": lines[0] if lines else "", "final": final,
            "logged_ms_per_iter": step[1:]}  # iter 0 includes warm-up


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--contrast_iters", type=int, default=200)
    args = parser.parse_args()
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}  # as a newcomer's shell: no setting
    results = {"cores": os.cpu_count(), "command": "python " + " ".join(COMMAND)}
    results["idle"] = run([], env)
    spinner = busy_core()
    try:
        time.sleep(1.0)
        results["one_core_busy"] = run([], env)
        short = [f"--max_iters={args.contrast_iters}", f"--lr_decay_iters={args.contrast_iters}",
                 f"--eval_interval={args.contrast_iters}", "--eval_iters=20", "--log_interval=10"]
        results["one_core_busy_short"] = run(short, env)
        results["one_core_busy_short_all_threads"] = run(short, dict(env, OMP_NUM_THREADS=str(os.cpu_count())))
    finally:
        spinner.kill()
    path = os.path.join(ROOT, "bench", "results", "quickstart.json")
    with open(path, "w") as f:
        json.dump(results, f, indent=2)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
