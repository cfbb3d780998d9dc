"""Training throughput on nanoGPT's CPU recipe shape (4 layers × 128, context 64, batch 12).

    python bench/train_throughput.py [--iters=300] [--rounds=3] [--nanogpt_dir=PATH/TO/nanoGPT]

Runs our real training loop (train.train, evaluation excluded from the timing) for each variant, alternating
in --rounds rounds so that all see the same machine load, and records each round's median ms/iter (the
spread is over rounds), tokens/s, the achieved model GFLOP/s and the process's peak RSS. Also measured, in
rounds: AdamW's step fused vs foreach, and torch.compile (inductor) on the CPU against eager (compile time
and step time). With --nanogpt_dir (a local nanoGPT checkout) a head-to-head: nanoGPT's model.py and ours,
each with its own configure_optimizers, in one identical step loop.
Results go to bench/results/train_throughput.json.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import resource
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch  # noqa: E402

from lgpt.plumbing.configurator import load_config  # noqa: E402
from lgpt.plumbing.dataset import BatchLoader, batch_seed  # noqa: E402
from train import TrainConfig, train  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import spread, threads_note  # noqa: E402

RECIPE = ["--n_layer=4", "--n_head=4", "--n_embd=128", "--block_size=64", "--batch_size=12", "--dropout=0.0",
          "--bias=False", "--learning_rate=1e-3", "--compile=False", "--device=cpu", "--progress_bar=False"]
SHAPE = dict(n_layer=4, n_head=4, n_embd=128, block_size=64, vocab_size=65, dropout=0.0, bias=False)
TOKENS_PER_ITER = 12 * 64
PARTS = ("variants", "optimizer", "compile", "head_to_head")
OPTIMIZER_STEPS = 200  # AdamW steps per round of the optimizer part
VARIANTS = {"ours_nanogpt_shape": ["--head=tied"], "ours_default_variant": [],
            "ours_rope_swiglu_rmsnorm_peri": ["--pos=rope", "--mlp=swiglu", "--norm_type=rmsnorm",
                                              "--norm_placement=peri"]}


def bench_ours(iters: int, data_dir: str, extra: list[str]) -> float:
    """One run of our real training loop; its median ms/iter (evaluation excluded)."""
    with tempfile.TemporaryDirectory() as out:
        cfg = load_config(TrainConfig, RECIPE + extra + [f"--data_dir={data_dir}", f"--out_dir={out}",
                                                         f"--max_iters={iters}", f"--eval_interval={iters + 1}",
                                                         "--eval_iters=1", f"--log_interval={iters + 1}"])
        return train(cfg)["ms_per_iter_median"]


def with_tokens(ms: dict) -> dict:
    """A spread of ms/iter, with the tokens/s of its mean."""
    return {"ms_per_iter": ms, "tokens_per_s": TOKENS_PER_ITER / ms["mean"] * 1000}


def load_nanogpt(nanogpt_dir: str):
    import importlib.util
    path = os.path.join(nanogpt_dir, "model.py")
    if not os.path.isfile(path):
        raise SystemExit(f"no nanoGPT model.py found in {nanogpt_dir}")
    spec = importlib.util.spec_from_file_location("nanogpt_model", path)  # 'model' is ours already
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, hashlib.sha256(open(path, "rb").read()).hexdigest()


def step_loop(contenders: dict, iters: int, rounds: int, data_dir: str) -> dict:
    """Each contender (model, optimizer) runs ``iters`` identical steps per round, alternating in rounds so that
    all see the same machine load; per contender, the spread over rounds of each round's median ms/step."""
    loader = BatchLoader(data_dir, 64, 12)
    per_round: dict[str, list[float]] = {name: [] for name in contenders}
    for r in range(rounds):
        for name, (model, opt) in contenders.items():
            times = []
            for it in range(iters):
                t0 = time.perf_counter()
                x, y = loader.get_batch("train", batch_seed(r, it, 0))
                _, loss = model(x, y)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                opt.zero_grad(set_to_none=True)
                if it >= 5:  # the first steps of a round warm caches
                    times.append(time.perf_counter() - t0)
            per_round[name].append(1000 * statistics.median(times))
    return {name: with_tokens(spread(v)) for name, v in per_round.items()}


def head_to_head(nanogpt_dir: str, iters: int, rounds: int, data_dir: str) -> dict:
    """Ours and nanoGPT's model + optimizer (each repo's own configure_optimizers) in one identical step loop."""
    from model import GPT, GPTConfig
    ng, sha = load_nanogpt(nanogpt_dir)
    torch.manual_seed(1337)
    theirs = ng.GPT(ng.GPTConfig(**SHAPE))
    ours = GPT(GPTConfig(**SHAPE, head="tied"))
    contenders = {name: (m, m.configure_optimizers(0.1, 1e-3, (0.9, 0.99), "cpu"))
                  for name, m in (("ours", ours), ("nanogpt", theirs))}
    return {**step_loop(contenders, iters, rounds, data_dir), "nanogpt_model_sha256": sha}


def optimizer_step(iters: int, rounds: int) -> dict:
    """AdamW's step alone on our nanoGPT-shaped model: fused (what configure_optimizers picks on CPU) against
    torch's default (foreach) implementation, alternating in rounds; gradients are fixed random tensors."""
    from model import GPT, GPTConfig
    torch.manual_seed(0)
    model = GPT(GPTConfig(**SHAPE, head="tied"))
    for p in model.parameters():
        p.grad = torch.randn_like(p) * 1e-3
    groups = [{"params": [p for p in model.parameters() if p.dim() >= 2], "weight_decay": 0.1},
              {"params": [p for p in model.parameters() if p.dim() < 2], "weight_decay": 0.0}]
    optimizers = {"fused": torch.optim.AdamW(groups, lr=1e-3, fused=True),
                  "foreach": torch.optim.AdamW(groups, lr=1e-3, foreach=True)}
    per_round: dict[str, list[float]] = {name: [] for name in optimizers}
    for _ in range(rounds):
        for name, opt in optimizers.items():
            times = []
            for it in range(iters):
                t0 = time.perf_counter()
                opt.step()
                if it >= 5:
                    times.append(time.perf_counter() - t0)
            per_round[name].append(1000 * statistics.median(times))
    out = {name: spread(v) for name, v in per_round.items()}
    out["saved_ms"] = spread([a - b for a, b in zip(per_round["foreach"], per_round["fused"])])
    out["steps_per_round"] = iters
    return out


def compile_cpu(iters: int, rounds: int, data_dir: str) -> dict:
    """torch.compile (inductor) on the CPU: the seconds of the first compiled step (compilation) and the step time
    of the compiled model against the eager one, alternating in rounds."""
    from model import GPT, GPTConfig
    # a cold compile: inductor's on-disk cache would otherwise hold an earlier run's kernels
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="bench-inductor-")
    torch._dynamo.reset()
    torch.manual_seed(0)
    eager = GPT(GPTConfig(**SHAPE, head="tied"))
    compiled_model = GPT(GPTConfig(**SHAPE, head="tied"))
    compiled_model.load_state_dict(eager.state_dict())
    compiled = torch.compile(compiled_model)
    contenders = {name: (m, owner.configure_optimizers(0.1, 1e-3, (0.9, 0.99), "cpu"))
                  for name, m, owner in (("eager", eager, eager), ("compiled", compiled, compiled_model))}
    loader = BatchLoader(data_dir, 64, 12)
    x, y = loader.get_batch("train", batch_seed(0, 0, 0))
    t0 = time.perf_counter()
    _, loss = compiled(x, y)
    loss.backward()
    first_step = time.perf_counter() - t0
    out = step_loop(contenders, iters, rounds, data_dir)
    ratios = [c / e for c, e in zip(out["compiled"]["ms_per_iter"]["values"], out["eager"]["ms_per_iter"]["values"])]
    return {**out, "compile_seconds": first_step, "compiled_over_eager": spread(ratios)}


def achieved_gflops(ms_per_iter: float) -> float:
    """Model FLOP/s of one training step, nanoGPT's estimate: 6N + 12·L·H·Q·T per token (PaLM, App. B)."""
    from model import GPT, GPTConfig
    model = GPT(GPTConfig(**SHAPE, head="tied"))
    n_params = sum(p.numel() for p in model.parameters()) - model.transformer.wpe.weight.numel()
    L, H, T = SHAPE["n_layer"], SHAPE["n_head"], SHAPE["block_size"]
    per_token = 6 * n_params + 12 * L * H * (SHAPE["n_embd"] // H) * T
    return per_token * TOKENS_PER_ITER / (ms_per_iter / 1000) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iters", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--data_dir", default=os.path.join(ROOT, "data", "shakespeare_char"))
    parser.add_argument("--nanogpt_dir", default=os.environ.get("NANOGPT_DIR"))
    parser.add_argument("--parts", default="variants,optimizer,compile,head_to_head",
                        help="what to measure (comma-separated); parts not measured keep the record's last values")
    parser.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "train_throughput.json"))
    args = parser.parse_args()
    from lgpt.plumbing.dataset import ensure_prepared
    ensure_prepared(args.data_dir, "shakespeare_char")
    parts = set(args.parts.split(","))
    results = json.load(open(args.out)) if os.path.exists(args.out) and parts != set(PARTS) else {}
    results.update({"machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
                    "torch": torch.__version__, "threads": threads_note(), "torch_threads": torch.get_num_threads(),
                    "iters": args.iters, "rounds": args.rounds})
    if "variants" in parts:
        per_round: dict[str, list[float]] = {name: [] for name in VARIANTS}
        for _ in range(args.rounds):  # alternating, so that every variant sees the same machine load
            for name, extra in VARIANTS.items():
                per_round[name].append(bench_ours(args.iters, args.data_dir, extra))
        for name, values in per_round.items():
            results[name] = with_tokens(spread(values))
        results["achieved_gflops"] = achieved_gflops(results["ours_nanogpt_shape"]["ms_per_iter"]["mean"])
        results["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # before the other parts
    if "optimizer" in parts:
        results["optimizer_step"] = optimizer_step(OPTIMIZER_STEPS, args.rounds)
    if "compile" in parts:
        results["compile"] = compile_cpu(args.iters // 4, args.rounds, args.data_dir)
    if "head_to_head" in parts and args.nanogpt_dir:
        results["head_to_head"] = head_to_head(args.nanogpt_dir, args.iters // 4, 2 * args.rounds, args.data_dir)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=2)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
