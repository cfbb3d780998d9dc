"""
Sample text from a trained checkpoint.

    python sample.py --out_dir=out-shakespeare-char --start="ROMEO:" --num_samples=2 --max_new_tokens=300
``--start=FILE:prompt.txt`` reads the prompt from a file. Works for char-level and GPT-2 BPE models.

``--save_to=FILE`` writes the samples to a text file instead (one after another, each followed by a blank line),
generated ``--batch_size`` at a time with a progress line: a text drawn from the model itself, e.g. to calibrate a
shrink without data (``prepare.py --input=FILE``, then ``transform.py --data_dir=...``):

    python sample.py --out_dir=out-smollm2 --save_to=samples.txt --num_samples=192 --batch_size=64 \
        --max_new_tokens=256 --temperature=1 --top_k=None
"""
from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from checkpoint import load_checkpoint, model_from_checkpoint
from cli import run_cli
from configurator import load_config
from dataset import GPT2_META, Tokenizer, atomic_write, read_text_file
from devices import announce_threads, resolve_device
from errors import ConfigError, DataError
from logger import progress
from model import GPT


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
    # to a file
    save_to: str = ""  # write the samples to this UTF-8 text file (each followed by a blank line), not to stdout
    batch_size: int = 1  # samples generated at once (with --save_to; printed samples stream one at a time)
    overwrite: bool = False  # replace an existing --save_to file

    def validate(self) -> None:
        if self.num_samples <= 0 or self.max_new_tokens < 0:
            raise ConfigError("num_samples must be > 0 and max_new_tokens >= 0")
        if self.batch_size <= 0:
            raise ConfigError(f"batch_size must be > 0, got {self.batch_size}")
        if self.batch_size > 1 and not self.save_to:
            raise ConfigError("--batch_size > 1 needs --save_to=FILE (printed samples stream one at a time)")
        if self.save_to:
            if os.path.isdir(self.save_to):
                raise ConfigError(f"--save_to={self.save_to} is a directory; give a file path")
            folder = os.path.dirname(os.path.abspath(self.save_to))
            if not os.path.isdir(folder):
                raise ConfigError(f"--save_to={self.save_to}: the directory {folder} does not exist; create it first")
            if os.path.exists(self.save_to) and not self.overwrite:
                raise ConfigError(f"--save_to={self.save_to} exists; pass --overwrite=True to replace it")
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


def prepared(cfg: SampleConfig) -> tuple[GPT, Tokenizer, str, torch.Tensor]:
    """(model, tokenizer, prompt, prompt ids (1, T) on the run's device), the sampling seed set."""
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
    return model, tokenizer, prompt, torch.tensor(ids, dtype=torch.long, device=device)[None, ...]


def stream_samples(cfg: SampleConfig) -> Iterator[tuple[int, str]]:
    """(sample index, text) as it is generated: the prompt first, then the continuation piece by piece."""
    model, tokenizer, prompt, x = prepared(cfg)
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


def save_samples(cfg: SampleConfig) -> int:
    """Generate the samples ``batch_size`` at a time (a progress line with an ETA on stderr) and write them to
    ``save_to``, each (prompt + continuation) followed by a blank line, only once all are done. Returns the number
    of generated tokens."""
    model, tokenizer, prompt, x = prepared(cfg)
    texts = []
    bar = progress(None, "sample", total=cfg.num_samples * cfg.max_new_tokens, unit="token")
    for first in range(0, cfg.num_samples, cfg.batch_size):
        size = min(cfg.batch_size, cfg.num_samples - first)
        rows: list[list[int]] = [[] for _ in range(size)]
        for token in model.generate_tokens(x.expand(size, -1), cfg.max_new_tokens, temperature=cfg.temperature,
                                           top_k=cfg.top_k, vocab_limit=tokenizer.vocab_size):
            for row, t in zip(rows, token[:, 0].tolist()):
                row.append(t)
            bar.update(size)
        texts += [prompt + tokenizer.decode(row) for row in rows]
    bar.close()
    atomic_write(cfg.save_to, lambda f: f.write("".join(text + "\n\n" for text in texts).encode("utf-8")))
    return cfg.num_samples * cfg.max_new_tokens


def main(argv: list[str]) -> None:
    cfg = load_config(SampleConfig, argv, prog="sample.py")
    if cfg.save_to:
        tokens = save_samples(cfg)
        print(f"wrote {cfg.num_samples} samples ({tokens:,} generated tokens) to {cfg.save_to}")
        return
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
