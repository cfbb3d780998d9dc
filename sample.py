"""
Sample text from a trained checkpoint.

    python sample.py --out_dir=out-shakespeare-char --start="ROMEO:" --num_samples=2 --max_new_tokens=300
``--start=FILE:prompt.txt`` reads the prompt from a file. Works for char-level and GPT-2 BPE models.
"""
from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from checkpoint import load_checkpoint, model_from_checkpoint
from cli import run_cli
from configurator import load_config
from dataset import GPT2_META, Tokenizer, read_text_file
from devices import announce_threads, resolve_device
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


STREAM_NOTE_TOKENS = 10_000  # a run asked for more tokens than this is told how to stop it


def text_pieces(tokens: Iterator[int], tokenizer: Tokenizer, hold: int = 8) -> Iterator[str]:
    """The decoded text of a token stream, piece by piece as tokens come. A byte-level BPE token can end inside a
    multi-byte character; such a piece (decoding to U+FFFD) waits for up to ``hold`` more tokens to complete it."""
    pending: list[int] = []
    for token in tokens:
        pending.append(token)
        text = tokenizer.decode(pending)
        if text.endswith("\ufffd") and len(pending) < hold:
            continue
        yield text
        pending = []
    if pending:
        yield tokenizer.decode(pending)


def stream_samples(cfg: SampleConfig) -> Iterator[tuple[int, str]]:
    """(sample index, text) as it is generated: the prompt first, then the continuation piece by piece."""
    device = resolve_device(cfg.device)
    prompt = read_prompt(cfg.start)
    ckpt = load_checkpoint(cfg.out_dir)
    tokenizer = tokenizer_for(ckpt)
    model = model_from_checkpoint(ckpt).to(device).eval()
    ids = tokenizer.encode_prompt(prompt)
    if not ids:
        raise DataError("the prompt encodes to no tokens; pass a non-empty --start")
    announce_threads(device, file=sys.stderr)  # stdout is the samples
    torch.manual_seed(cfg.seed)
    x = torch.tensor(ids, dtype=torch.long, device=device)[None, ...]
    for k in range(cfg.num_samples):
        yield k, prompt
        tokens = model.generate_tokens(x, cfg.max_new_tokens, temperature=cfg.temperature, top_k=cfg.top_k,
                                       vocab_limit=tokenizer.vocab_size)
        for piece in text_pieces((int(t) for t in tokens), tokenizer):
            yield k, piece


def sample(cfg: SampleConfig) -> list[str]:
    """The samples as whole texts (prompt + continuation)."""
    texts = [""] * cfg.num_samples
    for k, piece in stream_samples(cfg):
        texts[k] += piece
    return texts


def main(argv: list[str]) -> None:
    cfg = load_config(SampleConfig, argv, prog="sample.py")
    if cfg.max_new_tokens > STREAM_NOTE_TOKENS:
        print(f"note: {cfg.max_new_tokens:,} tokens per sample are printed as they come; Ctrl-C stops (what was "
              "printed stays)", file=sys.stderr)
    current = 0
    for k, piece in stream_samples(cfg):
        if k != current:
            print("\n---------------", flush=True)
            current = k
        print(piece, end="", flush=True)
    print("\n---------------", flush=True)


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
