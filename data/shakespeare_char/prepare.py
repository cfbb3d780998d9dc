"""Tinyshakespeare at the character level: ``python data/shakespeare_char/prepare.py [--input PATH]``."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from lgpt.plumbing.cli import run_cli  # noqa: E402
from lgpt.plumbing.dataset import prepare_main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(run_cli(lambda argv: prepare_main("char", os.path.dirname(os.path.abspath(__file__)), argv)))
