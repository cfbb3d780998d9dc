"""
Sample text from a trained checkpoint.

    python sample.py --out_dir=out-shakespeare-char --start="ROMEO:" --num_samples=2 --max_new_tokens=300
``--start=FILE:prompt.txt`` reads the prompt from a file. Works for char-level and GPT-2 BPE models.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass

import torch

from checkpoint import CheckpointError, load_model
from configurator import ConfigError, load_config
from dataset import DataError, Tokenizer


@dataclass
class SampleConfig:
    out_dir: str = "out"  # the directory holding ckpt.pt
    start: str = "\n"  # the prompt, or FILE:path
    num_samples: int = 3
    max_new_tokens: int = 300
    temperature: float = 0.8  # < 1 sharper, > 1 more random
    top_k: int | None = 200  # keep only the top_k most likely tokens (None: all)
    seed: int = 1337
    device: str = "auto"

    def validate(self) -> None:
        if self.num_samples <= 0 or self.max_new_tokens < 0:
            raise ConfigError("num_samples must be > 0 and max_new_tokens >= 0")
        if self.temperature <= 0:
            raise ConfigError(f"temperature must be > 0, got {self.temperature}")


def tokenizer_for(ckpt: dict) -> Tokenizer:
    meta = ckpt.get("meta")
    if meta is None:  # nanoGPT checkpoints without meta: GPT-2 BPE, as nanoGPT's sample.py assumes
        meta = {"tokenizer": "gpt2", "vocab_size": 50257}
    return Tokenizer(meta)


def sample(cfg: SampleConfig) -> list[str]:
    device = cfg.device if cfg.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(cfg.seed)
    model, ckpt = load_model(cfg.out_dir, device=device)
    tokenizer = tokenizer_for(ckpt)
    prompt = cfg.start
    if prompt.startswith("FILE:"):
        with open(prompt[5:], encoding="utf-8") as f:
            prompt = f.read()
    ids = tokenizer.encode(prompt)
    if not ids:
        raise DataError("the prompt encodes to no tokens; pass a non-empty --start")
    x = torch.tensor(ids, dtype=torch.long, device=device)[None, ...]
    texts = []
    for _ in range(cfg.num_samples):
        y = model.generate(x, cfg.max_new_tokens, temperature=cfg.temperature, top_k=cfg.top_k)
        texts.append(tokenizer.decode(y[0].tolist()))
    return texts


if __name__ == "__main__":
    try:
        for text in sample(load_config(SampleConfig, sys.argv[1:])):
            print(text)
            print("---------------")
    except (ConfigError, CheckpointError, DataError) as e:
        sys.exit(f"error: {e}")
