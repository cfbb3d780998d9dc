"""scripts/real_gemma3.py: the BOS control reads the same targets with and without BOS; exactness, every position."""
import os
import sys

import numpy as np
import pytest
import torch

from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "scripts"))
import real_gemma3  # noqa: E402


class Bigram(torch.nn.Module):
    """Logits from the current token alone: a window's loss at a target does not depend on anything before the token
    that precedes it, so BOS in front changes nothing about the targets both reads share."""

    def __init__(self, vocab_size: int):
        super().__init__()
        self.config = type("Config", (), {"vocab_size": vocab_size})()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(vocab_size, 8)
        self.lm_head = torch.nn.Linear(8, vocab_size)

    def forward(self, x, features=False):
        return self.embed(x), None


def test_bos_losses_read_the_same_targets_with_and_without_bos(char_data_dir, monkeypatch):
    import pickle
    with open(os.path.join(char_data_dir, "meta.pkl"), "rb") as f:
        vocab = pickle.load(f)["vocab_size"]
    monkeypatch.setattr(real_gemma3, "BLOCK", 16)
    monkeypatch.setattr(real_gemma3, "DEV_WINDOWS", 5)
    with torch.no_grad():
        result = real_gemma3.bos_losses(Bigram(vocab + 1), char_data_dir, bos=vocab)  # BOS: an id of its own
    assert len(result["plain_windows"]) == 5
    # a bigram model scores each target from the token before it: the same targets give the same losses
    np.testing.assert_allclose(result["bos_windows"], result["plain_windows"], rtol=0, atol=2e-6)
    assert result["bos"] == pytest.approx(result["plain"], abs=2e-6)


def test_a_bos_test_read_covers_the_whole_split_and_is_recorded(char_data_dir, tmp_path, monkeypatch):
    import pickle
    import shutil

    from lgpt.plumbing.dataset import reads_of_test
    data = str(tmp_path / "data")
    shutil.copytree(char_data_dir, data)
    with open(os.path.join(data, "meta.pkl"), "rb") as f:
        vocab = pickle.load(f)["vocab_size"]
    monkeypatch.setattr(real_gemma3, "BLOCK", 16)
    with torch.no_grad():
        result = real_gemma3.bos_losses(Bigram(vocab + 1), data, bos=vocab, split="test", test_for="gemma3-bos-x")
    with open(os.path.join(data, "meta.pkl"), "rb") as f:
        tokens = pickle.load(f)["tokens"]["test"]
    assert result["windows"] == len(range(0, tokens - 16 - 1, 16))  # every window of the split (full_split_starts)
    np.testing.assert_allclose(result["bos_windows"], result["plain_windows"], rtol=0, atol=2e-6)
    assert [r["recipe"] for r in reads_of_test(data)] == ["gemma3-bos-x"]
    with torch.no_grad():  # the general texts' read: the first windows of the split, the split's size kept
        first = real_gemma3.bos_losses(Bigram(vocab + 1), data, bos=vocab, split="test", test_for="gemma3-y",
                                       windows=3)
    assert first["windows"] == 3 and first["split_windows"] == result["windows"]
    assert first["plain_windows"] == result["plain_windows"][:3]
    assert [r["recipe"] for r in reads_of_test(data)] == ["gemma3-bos-x", "gemma3-y"]


def test_exactness_reads_every_position_of_every_window(char_data_dir, monkeypatch):
    import pickle
    with open(os.path.join(char_data_dir, "meta.pkl"), "rb") as f:
        vocab = pickle.load(f)["vocab_size"]
    from model import GPT, GPTConfig
    monkeypatch.setattr(real_gemma3, "BLOCK", 16)
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=16, vocab_size=vocab)).eval()
    lp = real_gemma3.logprobs(model, char_data_dir)
    assert lp.shape == (real_gemma3.EXACT_WINDOWS, 16, vocab)  # not each window's last position alone
    torch.testing.assert_close(lp.exp().sum(-1), torch.ones(real_gemma3.EXACT_WINDOWS, 16, dtype=lp.dtype))
