"""What distillation costs per finetuning step: plain LM finetuning vs --distill (the teacher's forward pass and
the chunked KL are the overhead), on the configs/shakespeare_char.py shape, alternating in rounds in one process
so that both see the same machine load (compare the ratio, not the absolute numbers).

    python bench/distill_speed.py --in_dir=TRANSFORMED_CKPT_DIR [--iters=60] [--rounds=3]

``in_dir`` is a transformed checkpoint (its record names the teacher). Results: bench/results/distill_speed.json.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from configurator import load_config  # noqa: E402
from finetune import FinetuneConfig, finetune  # noqa: E402


def one_run(in_dir: str, iters: int, distill: bool) -> float:
    with tempfile.TemporaryDirectory() as out:
        cfg = load_config(FinetuneConfig, [f"--in_dir={in_dir}", f"--out_dir={out}", f"--max_iters={iters}",
                                           f"--eval_interval={iters + 1}", "--eval_iters=1", "--progress_bar=False",
                                           f"--log_interval={iters + 1}", "--reference_val_loss=1.0",
                                           "--device=cpu", "--compile=False", f"--distill={distill}"])
        return finetune(cfg)["ms_per_iter_median"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--in_dir", required=True)
    parser.add_argument("--iters", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    times: dict[str, list[float]] = {"lm": [], "distill": []}
    for _ in range(args.rounds):
        for name in times:
            times[name].append(one_run(args.in_dir, args.iters, name == "distill"))
    result = {name: statistics.median(v) for name, v in times.items()}
    result.update(ratio=result["distill"] / result["lm"], rounds=args.rounds, iters=args.iters,
                  threads=os.environ.get("OMP_NUM_THREADS", "default"), in_dir=os.path.basename(args.in_dir))
    print(result)
    path = os.path.join(ROOT, "bench", "results", "distill_speed.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
