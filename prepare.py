"""
Tokenize a text file into a dataset (train.bin / val.bin / test.bin / meta.pkl) with a given tokenizer — in
particular the tokenizer of an imported model, so that train/finetune/transform/eval_geometry read the ids it was
trained on.

    python prepare.py --tokenizer_from=out-smollm --out_dir=data/shakespeare_smollm        # tinyshakespeare
    python prepare.py --tokenizer_from=out-smollm --input=my.txt --out_dir=data/my_smollm   # any UTF-8 text file
    python prepare.py --tokenizer=char --input=my.txt --out_dir=data/my_char                # or 'gpt2'

``--tokenizer_from`` is one of our checkpoints (its recorded tokenizer) or a Hugging Face model directory / name
(its tokenizer.json). The text is split in three (docs/findings.md, "The protocol"): train (the first 80%: calibration,
finetuning), test (the next 10%: read only by the final run of a chosen recipe) and val (the last 10%, nanoGPT's
val: the dev split, where every choice is made); ``--test_fraction=0`` writes nanoGPT's two splits (90% / 10%).
No BOS/EOS is added: a dataset is one stream of text. Token ids are uint16, or uint32 above 65,536 symbols (Llama
3, Qwen2).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from lgpt.plumbing.checkpoint import hold_run_dir, load_checkpoint
from lgpt.plumbing.cli import run_cli
from lgpt.plumbing.configurator import load_config
from lgpt.plumbing.dataset import prepare_text, read_shakespeare, read_text_file
from lgpt.plumbing.errors import ConfigError, DataError


@dataclass
class PrepareConfig:
    tokenizer_from: str = ""  # our checkpoint directory, or a Hugging Face model directory / name: its tokenizer
    tokenizer: str = ""  # or a built-in tokenizer: 'char' (from the text) | 'gpt2'
    input: str = ""  # a UTF-8 text file ('' = tinyshakespeare: $TINYSHAKESPEARE_PATH, else downloaded)
    out_dir: str = ""  # where train.bin, test.bin, val.bin and meta.pkl go
    test_fraction: float = 0.1  # the test split, carved from just before val (0: nanoGPT's train 90% / val 10%)
    overwrite: bool = False  # replace a dataset already in out_dir

    def validate(self) -> None:
        if bool(self.tokenizer_from) == bool(self.tokenizer):
            raise ConfigError("give exactly one of --tokenizer_from=CKPT_OR_HF_DIR or --tokenizer=char|gpt2")
        if self.tokenizer and self.tokenizer not in ("char", "gpt2"):
            raise ConfigError(f"--tokenizer={self.tokenizer!r} is not one of ('char', 'gpt2'); for a model's own "
                              "tokenizer use --tokenizer_from=DIR")
        if not 0 <= self.test_fraction <= 0.5:
            raise ConfigError(f"--test_fraction={self.test_fraction} must lie in [0, 0.5] (0: no test split)")
        if not self.out_dir:
            raise ConfigError("--out_dir=DIR is required (where train.bin, test.bin, val.bin and meta.pkl go)")


def tokenizer_meta(source: str) -> dict:
    """The tokenizer description of our checkpoint (its meta) or of a Hugging Face model (its tokenizer files)."""
    if source.startswith(("/", ".", "~")) and not os.path.isdir(os.path.expanduser(source)):
        raise DataError(f"--tokenizer_from={source}: no such directory; give a checkpoint directory or a Hugging "
                        "Face model directory / name")
    if os.path.exists(os.path.join(source, "ckpt.pt")) or source.endswith(".pt"):
        meta = load_checkpoint(source).get("meta")
        if not meta:
            raise DataError(f"the checkpoint '{source}' records no tokenizer (meta); prepare with --tokenizer=...")
        return meta
    from convert import hf_tokenizer_files
    from lgpt.plumbing.dataset import hf_tokenizer_meta
    return hf_tokenizer_meta(hf_tokenizer_files(source))


def read_text(path: str) -> str:
    return read_text_file(path, "--input=") if path else read_shakespeare()


def prepare(cfg: PrepareConfig) -> dict:
    from lgpt.plumbing.checkpoint import check_writable_dir
    check_writable_dir(cfg.out_dir)  # a dangling link, a file, an unwritable parent: before the tokenizing
    if not cfg.overwrite and os.path.exists(os.path.join(cfg.out_dir, "train.bin")):
        raise ConfigError(f"'{cfg.out_dir}' already holds a dataset (train.bin); pass --overwrite=True to replace it "
                          "or choose another --out_dir")
    tokenizer = tokenizer_meta(cfg.tokenizer_from) if cfg.tokenizer_from else cfg.tokenizer
    return prepare_text(read_text(cfg.input), cfg.out_dir, tokenizer, test_fraction=cfg.test_fraction)


def main(argv: list[str]) -> None:
    cfg = load_config(PrepareConfig, argv, prog="prepare.py")
    with hold_run_dir(cfg.out_dir, "prepare.py"):
        meta = prepare(cfg)
    print(f"wrote {cfg.out_dir} ({meta['fingerprint']})")


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
