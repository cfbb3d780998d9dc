"""What distillation costs per finetuning step: plain LM finetuning vs --distill (the teacher's forward pass and
the chunked KL are the overhead), on the configs/shakespeare_char.py shape, alternating in rounds in one process
so that both see the same machine load (compare the ratio, not the absolute numbers).

    python bench/distill_speed.py [--in_dir=TRANSFORMED_CKPT_DIR] [--iters=60] [--rounds=3]

``in_dir`` is a transformed checkpoint (its record names the teacher); without it the benchmark makes one in a
temporary directory: the char model shape trained for 100 iterations, PCA-ported to m = 64 (the step's cost does
not depend on how well the model is trained). Results: bench/results/distill_speed.json.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from finetune import FinetuneConfig, finetune  # noqa: E402
from lgpt.plumbing.configurator import load_config  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import spread, threads_note  # noqa: E402


def one_run(in_dir: str, iters: int, distill: bool) -> float:
    with tempfile.TemporaryDirectory() as out:
        cfg = load_config(FinetuneConfig, [f"--in_dir={in_dir}", f"--out_dir={out}", f"--max_iters={iters}",
                                           f"--eval_interval={iters + 1}", "--eval_iters=1", "--progress_bar=False",
                                           f"--log_interval={iters + 1}", "--reference_val_loss=1.0",
                                           "--device=cpu", "--compile=False", f"--distill={distill}"])
        return finetune(cfg)["ms_per_iter_median"]


def make_student(work: str) -> str:
    """A transformed char-shape checkpoint (teacher trained 100 iterations, PCA to m = 64) under ``work``."""
    teacher, student = os.path.join(work, "teacher"), os.path.join(work, "student")
    for argv in (["train.py", "configs/shakespeare_char.py", f"--out_dir={teacher}", "--max_iters=100",
                  "--eval_interval=100", "--eval_iters=2", "--compile=False", "--progress_bar=False"],
                 ["transform.py", f"--in_dir={teacher}", f"--out_dir={student}", "--width=64", "--kind=pca",
                  "--porting=residual"]):
        subprocess.run([sys.executable, *argv], cwd=ROOT, check=True, capture_output=True, text=True)
    return student


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--in_dir", default=None)
    parser.add_argument("--iters", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    times: dict[str, list[float]] = {"lm": [], "distill": []}
    with tempfile.TemporaryDirectory() as work:
        in_dir = args.in_dir or make_student(work)
        for _ in range(args.rounds):  # alternating, so that both see the same machine load
            for name in times:
                times[name].append(one_run(in_dir, args.iters, name == "distill"))
    result = {name: spread(v) for name, v in times.items()}
    source = os.path.basename(args.in_dir) if args.in_dir else "made by the benchmark"
    result.update(ratio=spread([d / lm for d, lm in zip(times["distill"], times["lm"])]), rounds=args.rounds,
                  iters=args.iters, threads=threads_note(), in_dir=source)
    print(result)
    path = os.path.join(ROOT, "bench", "results", "distill_speed.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
