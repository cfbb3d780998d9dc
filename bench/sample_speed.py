"""What the KV cache buys in generation: tokens per second of ``GPT.generate_tokens`` (a KVCache, each step reads
only the new token) against the naive loop nanoGPT runs (the whole context read again at every step), alternating in
rounds in one process so that both see the same machine load (compare the ratio, not the absolute numbers). Both
sample from the same distribution; the cached one is checked to pick the same tokens greedily first.

    python bench/sample_speed.py [--in_dir=CKPT_DIR] [--batch=8] [--tokens=128] [--rounds=3]

``in_dir``: a checkpoint (e.g. the imported SmolLM2: python fetch.py --what=smollm2 --out_dir=out-smollm2); without
it, the GPT-2-small shape (12 × 768, random weights: speed does not depend on them). Results:
bench/results/sample_speed.json.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from lgpt.plumbing.checkpoint import load_model  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import spread, threads_note, write_result  # noqa: E402


@torch.no_grad()
def naive(model: GPT, idx: torch.Tensor, steps: int, greedy: bool = False) -> torch.Tensor:
    """nanoGPT's loop: the last block_size tokens read whole at every step."""
    for _ in range(steps):
        logits, _ = model(idx[:, -model.config.block_size:])
        probs = logits[:, -1].softmax(-1)
        token = probs.argmax(-1, keepdim=True) if greedy else torch.multinomial(probs, 1)
        idx = torch.cat((idx, token), dim=1)
    return idx


def tokens_per_second(run, batch: int, tokens: int) -> float:
    started = time.perf_counter()
    run()
    return batch * tokens / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--in_dir", default=None)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    torch.manual_seed(0)
    if args.in_dir:
        model = load_model(args.in_dir)[0].eval()
    else:
        model = GPT(GPTConfig(n_layer=12, n_head=12, n_embd=768, block_size=1024, vocab_size=50304)).eval()
    prompt = torch.randint(0, model.config.vocab_size, (args.batch, 4))
    check = min(args.tokens, 16)  # the cache is exact: greedy picks agree (else the speed means nothing)
    if not torch.equal(model.generate(prompt, check, top_k=1), naive(model, prompt, check, greedy=True)):
        raise SystemExit("cached and naive greedy generation disagree: the KV cache is wrong")
    speeds: dict[str, list[float]] = {"cached": [], "naive": []}
    for _ in range(args.rounds):  # alternating, so that both see the same machine load
        speeds["cached"].append(tokens_per_second(lambda: model.generate(prompt, args.tokens), args.batch, args.tokens))
        speeds["naive"].append(tokens_per_second(lambda: naive(model, prompt, args.tokens), args.batch, args.tokens))
    result = {f"{name}_tokens_per_s": spread(v) for name, v in speeds.items()}
    result.update(speedup=spread([c / n for c, n in zip(speeds["cached"], speeds["naive"])]), batch=args.batch,
                  tokens=args.tokens, prompt=4, rounds=args.rounds, threads=threads_note(),
                  model=os.path.basename(os.path.normpath(args.in_dir)) if args.in_dir else "GPT-2-small shape",
                  layers=model.config.n_layer, width=model.config.n_embd)
    write_result("sample_speed", result)


if __name__ == "__main__":
    main()
