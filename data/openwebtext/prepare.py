"""OpenWebText (or any Hugging Face / local text dataset) tokenized with GPT-2's BPE into train.bin / val.bin.

    python data/openwebtext/prepare.py                          # the hub's openwebtext (~54 GB of disk)
    python data/openwebtext/prepare.py --text_files a.txt b.txt # local text files, one document per line
The tokenizer and file layout are nanoGPT's: documents end with <|endoftext|>, ids are uint16.
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from lgpt.plumbing.cli import run_cli  # noqa: E402
from lgpt.plumbing.dataset import (  # noqa: E402
    GPT2_META,
    gpt2_encoding,
    tokenizer_fingerprint,
    write_meta,
    writing_dataset,
)
from lgpt.plumbing.errors import DataError  # noqa: E402


def tokenize_dataset(dataset, num_proc: int):
    enc = gpt2_encoding()

    def process(example):
        ids = enc.encode_ordinary(example["text"])
        ids.append(enc.eot_token)
        return {"ids": ids, "len": len(ids)}

    return dataset.map(process, remove_columns=["text"], desc="tokenizing", num_proc=num_proc)


def write_bin(split, path: str, shards: int = 64) -> int:
    """Concatenate a tokenized split into one uint16 memmap, shard by shard, then rename into place."""
    total = int(np.sum(split["len"], dtype=np.uint64))
    tmp = f"{path}.tmp"
    arr = np.memmap(tmp, dtype=np.uint16, mode="w+", shape=(total,))
    shards = max(1, min(shards, len(split)))
    idx = 0
    for k in range(shards):
        batch = split.shard(num_shards=shards, index=k, contiguous=True).with_format("numpy")
        chunk = np.concatenate(batch["ids"]) if len(batch) else np.zeros(0, dtype=np.uint16)
        arr[idx:idx + len(chunk)] = chunk
        idx += len(chunk)
    arr.flush()
    del arr
    os.replace(tmp, path)
    return total


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="openwebtext", help="a Hugging Face dataset name")
    parser.add_argument("--text_files", nargs="*", help="local text files instead of --dataset")
    parser.add_argument("--out_dir", default=os.path.dirname(os.path.abspath(__file__)))
    parser.add_argument("--val_fraction", type=float, default=0.0005)
    parser.add_argument("--num_proc", type=int, default=max(1, (os.cpu_count() or 2) // 2))
    parser.add_argument("--seed", type=int, default=2357)
    args = parser.parse_args(argv)
    missing = [p for p in args.text_files or [] if not os.path.isfile(p)]
    if missing:
        raise DataError(f"--text_files: no such file {missing[0]!r}; give existing UTF-8 text files")
    try:
        from datasets import load_dataset
    except ImportError as e:
        raise DataError("this needs the optional dependency datasets: pip install -r requirements-extras.txt") from e
    if args.text_files:
        dataset = load_dataset("text", data_files=args.text_files, split="train")
    else:
        dataset = load_dataset(args.dataset, split="train", num_proc=args.num_proc)
    dataset = dataset.filter(lambda ex: len(ex["text"]) > 0)
    splits = dataset.train_test_split(test_size=args.val_fraction, seed=args.seed, shuffle=True)
    splits["val"] = splits.pop("test")
    tokenized = {name: tokenize_dataset(split, args.num_proc) for name, split in splits.items()}
    with writing_dataset(args.out_dir) as tokens:
        for name, split in tokenized.items():
            tokens[name] = write_bin(split, os.path.join(args.out_dir, f"{name}.bin"))
            print(f"{name}: {tokens[name]:,} tokens")
        write_meta(args.out_dir, dict(GPT2_META, fingerprint=tokenizer_fingerprint(GPT2_META)), tokens)


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
