"""
Sample text from a trained checkpoint.

    python sample.py --out_dir=out-shakespeare-char --start="ROMEO:" --num_samples=2 --max_new_tokens=300
``--start=FILE:prompt.txt`` reads the prompt from a file. Works for char-level and GPT-2 BPE models.

``--save_to=FILE`` writes the samples to a text file instead (one after another, each followed by a blank line),
generated ``--batch_size`` at a time with a progress line: a text drawn from the model itself, e.g. to calibrate a
shrink without data (``prepare.py --input=FILE``, then ``transform.py --data_dir=...``):

    python sample.py --out_dir=out-smollm2 --save_to=samples.txt --num_samples=192 --batch_size=64 \
        --max_new_tokens=256 --temperature=1 --top_k=None

``--continue_data=DIR --data_out=OUT`` writes a prepared dataset instead: OUT's train split is DIR's followed by
``num_samples`` texts of the model's own, each a random ``--prompt_tokens`` window of DIR's train split and the
model's continuation of it; its val split and tokenizer are DIR's. More distinct text in the train split's style for
distillation from this model (sequence-level knowledge distillation, Kim & Rush 2016), when the split alone is
passed over many times:

    python sample.py --out_dir=out-smollm2 --continue_data=data/shakespeare --data_out=data/shakespeare-teacher \
        --num_samples=8192 --batch_size=512 --prompt_tokens=32 --max_new_tokens=96 --device=cuda --dtype=bfloat16

At temperature 1 over the whole vocabulary SmolLM2-135M's continuations of Shakespeare drift out of it within a
hundred tokens or so (seen on an H100); the defaults (0.8, top 200) and short continuations stay nearer the text.
"""
from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np
import torch

from lgpt.plumbing.checkpoint import load_checkpoint, model_from_checkpoint
from lgpt.plumbing.cli import run_cli
from lgpt.plumbing.configurator import load_config
from lgpt.plumbing.dataset import (
    GPT2_META,
    Tokenizer,
    atomic_write,
    load_meta,
    read_text_file,
    token_dtype,
    tokenizer_fingerprint,
    write_meta,
    write_split,
)
from lgpt.plumbing.devices import announce_threads, resolve_device
from lgpt.plumbing.errors import ConfigError, DataError
from lgpt.plumbing.logger import progress
from model import GPT

AUTOCAST = {"float32": None, "bfloat16": torch.bfloat16, "float16": torch.float16}  # --dtype: autocast's type


def autocast(device: str, dtype: str):
    """The context generation runs in: none for float32, else autocast to ``dtype`` on ``device``'s type."""
    if AUTOCAST[dtype] is None:
        return nullcontext()
    return torch.amp.autocast(device_type=device.split(":")[0], dtype=AUTOCAST[dtype])


def autocast_each(tokens: Iterator[torch.Tensor], device: str, dtype: str) -> Iterator[torch.Tensor]:
    """A lazy token stream with each step under ``autocast``: a generator runs its body at each next(), outside a
    with-block around its creation, so the context is entered around every step instead."""
    while True:
        with autocast(device, dtype):
            token = next(tokens, None)
        if token is None:
            return
        yield token


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
    dtype: str = "float32"  # 'float32' | 'bfloat16' | 'float16': the forward under autocast (faster on a GPU; the
    # samples then differ from float32's)
    # to a file
    save_to: str = ""  # write the samples to this UTF-8 text file (each followed by a blank line), not to stdout
    batch_size: int = 1  # samples generated at once (with --save_to; printed samples stream one at a time)
    overwrite: bool = False  # replace an existing --save_to file (or --data_out folder)
    # to a dataset: the model's continuations of windows of a prepared train split, after that split
    continue_data: str = ""  # a prepared dataset whose train windows are the prompts (then --data_out is needed)
    data_out: str = ""  # the dataset written: continue_data's splits, its train split followed by the samples
    prompt_tokens: int = 32  # tokens of each prompt window (with --continue_data)

    def validate(self) -> None:
        if self.dtype not in AUTOCAST:
            raise ConfigError(f"dtype must be one of {', '.join(AUTOCAST)}, got {self.dtype!r}")
        if self.num_samples <= 0 or self.max_new_tokens < 0:
            raise ConfigError("num_samples must be > 0 and max_new_tokens >= 0")
        if self.batch_size <= 0:
            raise ConfigError(f"batch_size must be > 0, got {self.batch_size}")
        if bool(self.continue_data) != bool(self.data_out):
            raise ConfigError("--continue_data=DIR and --data_out=OUT go together: the prompts come from DIR's train "
                              "split and the dataset is written to OUT")
        if self.continue_data:
            self.validate_data_out()
        elif self.batch_size > 1 and not self.save_to:
            raise ConfigError("--batch_size > 1 needs --save_to=FILE or --data_out=DIR (printed samples stream one "
                              "at a time)")
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

    def validate_data_out(self) -> None:
        if self.save_to:
            raise ConfigError("--save_to and --data_out are two outputs; pass one")
        if self.prompt_tokens <= 0 or self.max_new_tokens <= 0:
            raise ConfigError(f"--prompt_tokens ({self.prompt_tokens}) and --max_new_tokens ({self.max_new_tokens}) "
                              "must be > 0 with --data_out")
        if os.path.abspath(self.data_out) == os.path.abspath(self.continue_data):
            raise ConfigError("--data_out must be another folder than --continue_data (it is read while written)")
        if os.path.exists(self.data_out) and not self.overwrite:
            raise ConfigError(f"--data_out={self.data_out} exists; pass --overwrite=True to replace it")


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
        for piece in text_pieces((int(t) for t in autocast_each(tokens, str(x.device), cfg.dtype)), tokenizer):
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
        with autocast(str(x.device), cfg.dtype):
            for token in model.generate_tokens(x.expand(size, -1), cfg.max_new_tokens, temperature=cfg.temperature,
                                               top_k=cfg.top_k, vocab_limit=tokenizer.vocab_size):
                for row, t in zip(rows, token[:, 0].tolist()):
                    row.append(t)
                bar.update(size)
        texts += [prompt + tokenizer.decode(row) for row in rows]
    bar.close()
    atomic_write(cfg.save_to, lambda f: f.write("".join(text + "\n\n" for text in texts).encode("utf-8")))
    return cfg.num_samples * cfg.max_new_tokens


def continuation_prompts(train: np.ndarray, count: int, length: int, seed: int) -> np.ndarray:
    """``count`` windows of ``length`` tokens from ``train`` at random starts (a generator seeded by ``seed``)."""
    if len(train) <= length:
        raise DataError(f"the train split holds {len(train)} tokens, not more than --prompt_tokens={length}; "
                        "lower --prompt_tokens")
    starts = np.random.default_rng(seed).integers(0, len(train) - length, size=count)
    return np.stack([np.asarray(train[s:s + length], dtype=np.int64) for s in starts])


def save_continuations(cfg: SampleConfig) -> int:
    """The model's continuations of random windows of ``continue_data``'s train split, ``batch_size`` at a time (a
    progress line with an ETA on stderr), written with that dataset's splits as the dataset ``data_out``: its train
    split followed by each window and its continuation; its val split and meta.pkl as they are, no test split. The
    tokenizers must be the same (the ids are copied, never re-encoded). Written into a temporary folder and moved into
    place once complete. Returns the number of generated tokens."""
    if not os.path.exists(os.path.join(cfg.continue_data, "train.bin")):
        raise DataError(f"--continue_data={cfg.continue_data} holds no train.bin; prepare it first "
                        "(prepare.py --out_dir=...)")
    meta, ckpt = load_meta(cfg.continue_data), load_checkpoint(cfg.out_dir)
    if tokenizer_fingerprint(meta) != tokenizer_fingerprint(ckpt.get("meta")):
        raise DataError(f"--continue_data={cfg.continue_data} is tokenized with {tokenizer_fingerprint(meta)}, the "
                        f"model in {cfg.out_dir} with {tokenizer_fingerprint(ckpt.get('meta'))}: prepare the data "
                        "with the model's tokenizer (prepare.py --tokenizer_from=...)")
    device = resolve_device(cfg.device)
    model = model_from_checkpoint(ckpt).to(device).eval()
    dtype = token_dtype(meta)
    train = np.memmap(os.path.join(cfg.continue_data, "train.bin"), dtype=dtype, mode="r")
    prompts = continuation_prompts(train, cfg.num_samples, cfg.prompt_tokens, cfg.seed)
    announce_threads(device, file=sys.stderr)
    torch.manual_seed(cfg.seed)
    rows = []
    bar = progress(None, "continue", total=cfg.num_samples * cfg.max_new_tokens, unit="token")
    for first in range(0, cfg.num_samples, cfg.batch_size):
        x = torch.from_numpy(prompts[first:first + cfg.batch_size]).to(device)
        out = [x]
        with autocast(device, cfg.dtype):
            for token in model.generate_tokens(x, cfg.max_new_tokens, temperature=cfg.temperature,
                                               top_k=cfg.top_k, vocab_limit=meta["vocab_size"] if meta else None):
                out.append(token)
                bar.update(x.size(0))
        rows.append(torch.cat(out, dim=1).cpu().numpy())
    bar.close()
    tmp = f"{cfg.data_out.rstrip(os.sep)}.tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        # no test split: the continued dataset is a training text; test is read on continue_data itself, whose
        # test_reads.json counts every read (a copy would read it uncounted)
        shutil.copytree(cfg.continue_data, tmp, ignore=shutil.ignore_patterns("train.bin", "meta.pkl", "test.bin",
                                                                              "test_reads.json"))
        ids = np.concatenate([np.asarray(train, dtype=np.int64), *(r.reshape(-1) for r in rows)])
        write_split(ids, os.path.join(tmp, "train.bin"), dtype)
        if meta is not None:  # its manifest counts the longer train split
            write_meta(tmp, {k: v for k, v in meta.items() if k != "tokens"},
                       {**{k: v for k, v in (meta.get("tokens") or {}).items() if k != "test"}, "train": len(ids)})
        if os.path.exists(cfg.data_out):
            shutil.rmtree(cfg.data_out)
        os.replace(tmp, cfg.data_out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return cfg.num_samples * cfg.max_new_tokens


def main(argv: list[str]) -> None:
    cfg = load_config(SampleConfig, argv, prog="sample.py")
    if cfg.continue_data:
        tokens = save_continuations(cfg)
        print(f"wrote {cfg.data_out}: {cfg.continue_data}'s train split and {cfg.num_samples} continuations "
              f"({tokens:,} generated tokens, {cfg.prompt_tokens} prompt tokens each)")
        return
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
