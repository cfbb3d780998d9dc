"""Training throughput on nanoGPT's CPU recipe shape (4 layers × 128, context 64, batch 12).

    python bench/train_throughput.py [--iters=300] [--nanogpt_dir=PATH/TO/nanoGPT]

Runs our real training loop (train.train, evaluation excluded from the timing) and reports the median
ms/iter, tokens/s and the process's peak RSS. With --nanogpt_dir (a local nanoGPT checkout) it also runs
a head-to-head: nanoGPT's model.py and ours, each with its own configure_optimizers, in one identical
step loop, alternating in rounds so that both see the same machine load.
Results go to bench/results/train_throughput.json.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch  # noqa: E402

from configurator import load_config  # noqa: E402
from dataset import BatchLoader, batch_seed  # noqa: E402
from train import TrainConfig, train  # noqa: E402

RECIPE = ["--n_layer=4", "--n_head=4", "--n_embd=128", "--block_size=64", "--batch_size=12", "--dropout=0.0",
          "--bias=False", "--learning_rate=1e-3", "--compile=False", "--device=cpu", "--progress_bar=False"]


def bench_ours(iters: int, data_dir: str, extra: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as out:
        cfg = load_config(TrainConfig, RECIPE + extra + [f"--data_dir={data_dir}", f"--out_dir={out}",
                                                         f"--max_iters={iters}", f"--eval_interval={iters + 1}",
                                                         "--eval_iters=1", f"--log_interval={iters + 1}"])
        summary = train(cfg)
    ms = summary["ms_per_iter_median"]
    return {"ms_per_iter": ms, "tokens_per_s": 12 * 64 / ms * 1000}


def load_nanogpt(nanogpt_dir: str):
    import importlib.util
    path = os.path.join(nanogpt_dir, "model.py")
    if not os.path.isfile(path):
        raise SystemExit(f"no nanoGPT model.py found in {nanogpt_dir}")
    spec = importlib.util.spec_from_file_location("nanogpt_model", path)  # 'model' is ours already
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def head_to_head(nanogpt_dir: str, iters: int, rounds: int, data_dir: str) -> dict:
    """Ours and nanoGPT's model + optimizer in one identical step loop, alternating in rounds so that
    both see the same machine load; the median over all timed steps of each."""
    from model import GPT, GPTConfig
    ng = load_nanogpt(nanogpt_dir)
    shape = dict(n_layer=4, n_head=4, n_embd=128, block_size=64, vocab_size=65, dropout=0.0, bias=False)
    torch.manual_seed(1337)
    theirs = ng.GPT(ng.GPTConfig(**shape))
    ours = GPT(GPTConfig(**shape, head="tied"))
    contenders = {name: (m, m.configure_optimizers(0.1, 1e-3, (0.9, 0.99), "cpu"))
                  for name, m in (("ours", ours), ("nanogpt", theirs))}
    loader = BatchLoader(data_dir, 64, 12)
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for r in range(rounds):
        for name, (model, opt) in contenders.items():
            for it in range(iters):
                t0 = time.perf_counter()
                x, y = loader.get_batch("train", batch_seed(r, it, 0))
                _, loss = model(x, y)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                opt.zero_grad(set_to_none=True)
                if it >= 5:
                    times[name].append(time.perf_counter() - t0)
    out = {}
    for name, ts in times.items():
        ts.sort()
        ms = 1000 * ts[len(ts) // 2]
        out[name] = {"ms_per_iter": ms, "tokens_per_s": 12 * 64 / ms * 1000}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iters", type=int, default=300)
    parser.add_argument("--data_dir", default=os.path.join(ROOT, "data", "shakespeare_char"))
    parser.add_argument("--nanogpt_dir", default=os.environ.get("NANOGPT_DIR"))
    parser.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "train_throughput.json"))
    args = parser.parse_args()
    from dataset import ensure_prepared
    ensure_prepared(args.data_dir, "shakespeare_char")
    results = {"machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
               "torch": torch.__version__, "threads": torch.get_num_threads(), "iters": args.iters}
    results["ours_nanogpt_shape"] = bench_ours(args.iters, args.data_dir, ["--head=tied"])
    results["ours_default_variant"] = bench_ours(args.iters, args.data_dir, [])
    results["ours_rope_swiglu_rmsnorm_peri"] = bench_ours(
        args.iters, args.data_dir, ["--pos=rope", "--mlp=swiglu", "--norm_type=rmsnorm", "--norm_placement=peri"])
    if args.nanogpt_dir:
        results["head_to_head"] = head_to_head(args.nanogpt_dir, args.iters // 4, 8, args.data_dir)
    results["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=2)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
