"""Tinyshakespeare with GPT-2's BPE (tiktoken): ``python data/shakespeare/prepare.py [--input PATH]``.

Offline, set TIKTOKEN_CACHE_DIR to a directory holding tiktoken's cached GPT-2 files.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from lgpt.plumbing.cli import run_cli  # noqa: E402
from lgpt.plumbing.dataset import prepare_main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(run_cli(lambda argv: prepare_main("gpt2", os.path.dirname(os.path.abspath(__file__)), argv)))
