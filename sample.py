"""
Sample text from a trained checkpoint.

    python sample.py --out_dir=out-shakespeare-char --start="ROMEO:" --num_samples=2 --max_new_tokens=300
``--start=FILE:prompt.txt`` reads the prompt from a file. Works for char-level and GPT-2 BPE models.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from checkpoint import load_checkpoint, model_from_checkpoint
from cli import run_cli
from configurator import load_config
from dataset import GPT2_META, Tokenizer, read_text_file
from devices import resolve_device
from errors import ConfigError, DataError


@dataclass
class SampleConfig:
    # sampling
    out_dir: str = "out"  # the directory holding ckpt.pt
    start: str = "\n"  # the prompt, or FILE:path
    num_samples: int = 3  # how many independent samples
    max_new_tokens: int = 300  # tokens generated after the prompt
    temperature: float = 0.8  # < 1 sharper, > 1 more random
    top_k: int | None = 200  # keep only the top_k most likely tokens (None: all)
    seed: int = 1337  # sampling seed
    device: str = "auto"  # 'auto' (cuda if available, else cpu) | 'cpu' | 'cuda' | 'cuda:N' | 'mps'

    def validate(self) -> None:
        if self.num_samples <= 0 or self.max_new_tokens < 0:
            raise ConfigError("num_samples must be > 0 and max_new_tokens >= 0")
        if self.temperature <= 0:
            raise ConfigError(f"temperature must be > 0, got {self.temperature}")
        if self.top_k is not None and self.top_k <= 0:
            raise ConfigError(f"top_k must be a positive integer or None (all tokens), got {self.top_k}")


def tokenizer_for(ckpt: dict) -> Tokenizer:
    """The checkpoint's tokenizer; nanoGPT checkpoints without one get GPT-2 BPE, as nanoGPT's sample.py assumes,
    which must cover the model's vocabulary."""
    meta = ckpt.get("meta") or GPT2_META
    vocab = ckpt["model_args"]["vocab_size"]
    if meta["vocab_size"] > vocab:
        raise DataError(f"the checkpoint records no tokenizer that fits its {vocab}-token vocabulary (GPT-2 BPE has "
                        f"{meta['vocab_size']}); import a nanoGPT char checkpoint with its dataset's meta.pkl: "
                        "python convert.py --from_nanogpt=CKPT --out_dir=DIR --data_dir=data/<dataset>")
    return Tokenizer(meta)


def read_prompt(start: str) -> str:
    """The prompt: the text itself, or the contents of a UTF-8 text file given as FILE:path."""
    if not start.startswith("FILE:"):
        return start
    return read_text_file(start[5:], "--start=FILE:")


def sample(cfg: SampleConfig) -> list[str]:
    device = resolve_device(cfg.device)
    prompt = read_prompt(cfg.start)
    ckpt = load_checkpoint(cfg.out_dir)
    tokenizer = tokenizer_for(ckpt)
    model = model_from_checkpoint(ckpt).to(device).eval()
    ids = tokenizer.encode_prompt(prompt)
    if not ids:
        raise DataError("the prompt encodes to no tokens; pass a non-empty --start")
    torch.manual_seed(cfg.seed)
    x = torch.tensor(ids, dtype=torch.long, device=device)[None, ...]
    texts = []
    for _ in range(cfg.num_samples):
        y = model.generate(x, cfg.max_new_tokens, temperature=cfg.temperature, top_k=cfg.top_k,
                           vocab_limit=tokenizer.vocab_size)
        texts.append(prompt + tokenizer.decode(y[0, len(ids):].tolist()))
    return texts


def main(argv: list[str]) -> None:
    for text in sample(load_config(SampleConfig, argv, prog="sample.py")):
        print(text)
        print("---------------")


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
