"""Small Hugging Face Llama / Qwen2 models and a tokenizer, built offline for the tests (nothing is downloaded).

Random init gives nearly uniform log-probs, which agree with anything: ``far_from_uniform`` redraws every weight
large enough that the next-token distributions are peaked, so agreement of log-probs means something.
"""
from __future__ import annotations

import functools
import os

import torch

from conftest import synthetic_text

VOCAB = 320


def shakespeare_text() -> str:
    path = os.environ.get("TINYSHAKESPEARE_PATH")
    if path and os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            return f.read()
    return synthetic_text(200_000)


def train_tokenizer(vocab_size: int = VOCAB - 32, text: str | None = None):
    """A byte-level BPE tokenizer (a ``PreTrainedTokenizerFast``) trained on tinyshakespeare, with <s> and </s>."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator([(text or shakespeare_text())[:300_000]], trainer=trainer)
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>",
                                                clean_up_tokenization_spaces=False)


@functools.lru_cache(maxsize=2)  # trained once per test process: the tests only read it
def train_gemma_tokenizer(vocab_size: int = 640):
    """A Gemma-style tokenizer (transformers' GemmaTokenizer: SentencePiece's BPE with byte fallback, spaces as ▁):
    <pad> <eos> <bos> <unk> <mask>, the 256 byte tokens <0x00>…<0xFF>, then pieces trained on tinyshakespeare."""
    import json

    import transformers
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.Replace(" ", "\u2581")
    tokenizer.pre_tokenizer = pre_tokenizers.Split("\u2581", behavior="merged_with_next")
    specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"] + [f"<0x{b:02X}>" for b in range(256)]
    tokenizer.train_from_iterator([shakespeare_text()[:300_000]], trainers.BpeTrainer(
        vocab_size=vocab_size - len(specials), show_progress=False))
    trained = json.loads(tokenizer.to_str())["model"]
    vocab = {token: i for i, token in enumerate(specials)}
    for token in sorted(trained["vocab"], key=trained["vocab"].get):
        vocab.setdefault(token, len(vocab))
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in trained["merges"]]
    return transformers.GemmaTokenizer(vocab=vocab, merges=merges)


def far_from_uniform(model: torch.nn.Module, seed: int = 0, std: float = 0.25) -> torch.nn.Module:
    """Redraw every parameter: matrices and biases N(0, std²), norm gains uniform in [0.5, 1.5]."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(0.5 + torch.rand(p.shape, generator=g))
            else:
                p.copy_(std * torch.randn(p.shape, generator=g))
    return model.eval()


def llama(n_head: int = 8, n_kv_head: int = 2, tied: bool = False, rope_scaling: bool = False, qwen2: bool = False,
          hidden: int = 64, layers: int = 2, vocab: int = VOCAB, seed: int = 0, **extra):
    """A LlamaForCausalLM (or Qwen2ForCausalLM) with far-from-uniform weights."""
    import transformers
    rope = {"rope_type": "default", "rope_theta": 500000.0}
    if rope_scaling:  # Llama 3.1's, with a short original context so all three frequency bands occur
        rope.update(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                    original_max_position_embeddings=64)
    kwargs = dict(hidden_size=hidden, intermediate_size=2 * hidden + 16, num_hidden_layers=layers,
                  num_attention_heads=n_head, num_key_value_heads=n_kv_head, vocab_size=vocab,
                  max_position_embeddings=128, rms_norm_eps=1e-5, tie_word_embeddings=tied, rope_parameters=rope,
                  bos_token_id=0, eos_token_id=1, **extra)
    torch.manual_seed(seed)
    if qwen2:
        model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**kwargs))
    else:
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**kwargs))
    return far_from_uniform(model, seed)


def save(model, directory, tokenizer=None) -> str:
    model.save_pretrained(str(directory))
    if tokenizer is not None:
        tokenizer.save_pretrained(str(directory))
    return str(directory)


@torch.no_grad()
def hf_logprobs(model, idx: torch.Tensor) -> torch.Tensor:
    return model(idx).logits.float().log_softmax(-1)


@torch.no_grad()
def our_logprobs(model, idx: torch.Tensor) -> torch.Tensor:
    return model(idx, all_logits=True)[0].float().log_softmax(-1)


def assert_logprobs_close(ours: torch.Tensor, theirs: torch.Tensor, rel: float = 1e-4) -> None:
    """≤ ``rel`` relative agreement (in norm and per element), on distributions that are far from uniform."""
    assert theirs.std() > 1.0, "the reference's log-probs are nearly uniform: the comparison would prove nothing"
    assert (ours - theirs).norm() <= rel * theirs.norm(), (ours - theirs).abs().max()
    assert torch.allclose(ours, theirs, rtol=rel, atol=rel), (ours - theirs).abs().max()


def gemma3(layers: int = 4, hidden: int = 64, n_head: int = 4, n_kv_head: int = 1, head_dim: int = 32,
           window: int = 6, tied: bool = True, vocab: int = VOCAB, seed: int = 0, global_every: int = 2,
           pre_attn_scalar: int = 24, **extra):
    """A Gemma3ForCausalLM (text) with far-from-uniform weights: a head size independent of d, local blocks with a
    short sliding window (so 16-token inputs exercise it) and a full-attention block every ``global_every``-th
    block, two RoPE bases, a query_pre_attn_scalar other than head_dim (by default)."""
    import transformers
    types = ["sliding_attention" if (i + 1) % global_every else "full_attention" for i in range(layers)]
    config = transformers.Gemma3TextConfig(
        hidden_size=hidden, intermediate_size=2 * hidden + 32, num_hidden_layers=layers, num_attention_heads=n_head,
        num_key_value_heads=n_kv_head, head_dim=head_dim, vocab_size=vocab, max_position_embeddings=128,
        rms_norm_eps=1e-6, tie_word_embeddings=tied, sliding_window=window, layer_types=types,
        query_pre_attn_scalar=pre_attn_scalar, bos_token_id=0, eos_token_id=1, pad_token_id=2,
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}, **extra)
    torch.manual_seed(seed)
    model = transformers.Gemma3ForCausalLM(config)
    return far_from_uniform(model, seed, std=0.15)


def fetched(name: str, what: str) -> str:
    """The cached path of a real model fetch.py gets (``--what=WHAT``): skipped when it is not there, an error under
    CI=true (.ci/run fetches it first: CI must always run the real-model tests)."""
    import pytest

    from fetch import cache_path
    path = cache_path(name)
    if not os.path.isfile(path):
        if os.environ.get("CI"):
            raise RuntimeError(f"{path} is missing: CI runs `python fetch.py --what={what}` before the tests")
        pytest.skip(f"the real model is not fetched ({path}); run `python fetch.py --what={what}`",
                    allow_module_level=True)
    return path
