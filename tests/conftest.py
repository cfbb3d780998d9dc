"""Shared fixtures: a tiny synthetic character dataset and tiny model settings, offline-safe environment."""
import os
import random
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.join(ROOT, "tests")
sys.path.insert(0, ROOT)
# tests by room (method, formats, commands, lab); a test may import helpers from another room's test file
sys.path[1:1] = [TESTS] + [os.path.join(TESTS, room) for room in ("method", "formats", "commands", "lab")]

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("MPLBACKEND", "Agg")
# one thread per test process, whatever the shell says: torch's threads wait for each other at every op, and a
# second thread on a busy 2-core machine makes the suite up to 25× slower (commands started by tests inherit it)
os.environ["OMP_NUM_THREADS"] = "1"
torch.set_num_threads(1)

TINY_MODEL = ["--n_layer=2", "--n_head=2", "--n_embd=32", "--block_size=16", "--batch_size=4",
              "--eval_iters=2", "--log_interval=1", "--warmup_iters=2", "--progress_bar=False", "--compile=False"]


def synthetic_text(n_chars: int = 40_000, seed: int = 0) -> str:
    """Pseudo-English with learnable structure (a small vocabulary of words in random order)."""
    rng = random.Random(seed)
    words = ["the", "king", "queen", "shall", "not", "love", "thee", "my", "lord", "and", "to", "be", "or"]
    out, n = [], 0
    while n < n_chars:
        sentence = " ".join(rng.choice(words) for _ in range(rng.randint(3, 9))).capitalize() + ".\n"
        out.append(sentence)
        n += len(sentence)
    return "".join(out)[:n_chars]


@pytest.fixture(scope="session")
def char_data_dir(tmp_path_factory):
    from lgpt.plumbing.dataset import prepare_text
    out = tmp_path_factory.mktemp("char_data")
    prepare_text(synthetic_text(), str(out), "char")
    return str(out)


@pytest.fixture(scope="session")
def trained_dir(tmp_path_factory, char_data_dir):
    """A tiny char model trained for 60 iterations (shared by sample/transform/eval tests)."""
    from lgpt.plumbing.configurator import load_config
    from train import TrainConfig, train
    out = tmp_path_factory.mktemp("trained")
    cfg = load_config(TrainConfig, TINY_MODEL + [f"--data_dir={char_data_dir}", f"--out_dir={out}",
                                                 "--max_iters=60", "--eval_interval=30", "--learning_rate=3e-3"])
    train(cfg)
    return str(out)


def spec(width: int, **options):
    """A TransformSpec from flat option names (``spec(48, kind='pca', refit='readers')``), each sent to its group,
    for ``transform_model(model, spec(...), loader)``."""
    from lgpt.method.spec import TransformSpec
    return TransformSpec.from_flat(width=width, **options)
