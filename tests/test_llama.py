"""The Llama family (Llama 2/3, SmolLM, TinyLlama, Qwen2/2.5) in and out, exactly, with its own tokenizer.

Every Hugging Face model here is built in the test from a config (random weights made far from uniform) and every
tokenizer is trained here on tinyshakespeare: nothing is downloaded.
"""
import os

import pytest
import torch

from checkpoint import load_model
from hf_models import (
    assert_logprobs_close,
    hf_logprobs,
    llama,
    our_logprobs,
    save,
    train_tokenizer,
)

transformers = pytest.importorskip("transformers")

from convert import ConversionError, ConvertConfig, convert, export_hf, hf_pretrained  # noqa: E402

VARIANTS = {  # name: llama() keyword arguments
    "gqa_8_2": dict(n_head=8, n_kv_head=2),
    "multi_query": dict(n_head=4, n_kv_head=1),
    "mha_tied": dict(n_head=4, n_kv_head=4, tied=True),
    "llama3_rope_scaling": dict(n_head=8, n_kv_head=2, rope_scaling=True, tied=True),
    "qwen2_biases": dict(n_head=8, n_kv_head=2, qwen2=True),
    "qwen2_tied_mqa": dict(n_head=4, n_kv_head=1, qwen2=True, tied=True),
}


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer()


@pytest.fixture(scope="module")
def idx():
    return torch.randint(0, 320, (2, 96), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_import_and_export_match_transformers(name, idx, tmp_path):
    """Log-probs of our import equal transformers' (≤ 1e-4 relative, float32), and so do those of our export."""
    hf = llama(**VARIANTS[name])
    arch = type(hf).__name__
    src = save(hf, tmp_path / "hf")
    ours, found = hf_pretrained(src)
    assert found == arch
    cfg, asked = ours.config, VARIANTS[name]
    assert cfg.kv_heads == asked["n_kv_head"] and cfg.head == ("tied" if asked.get("tied") else "linear")
    assert (cfg.rope_scaling is not None) == bool(asked.get("rope_scaling"))
    assert cfg.attn_bias == bool(asked.get("qwen2")) and not cfg.bias
    reference = hf_logprobs(hf, idx)
    assert_logprobs_close(our_logprobs(ours, idx), reference)
    assert export_hf(ours, str(tmp_path / "back")) == arch
    back = getattr(transformers, arch).from_pretrained(str(tmp_path / "back")).eval()
    assert_logprobs_close(hf_logprobs(back, idx), reference)


def test_rope_pair_order_is_a_bijection_that_keeps_scores():
    from convert import permute_head_rows, rope_pair_order
    order = rope_pair_order(8)
    assert sorted(order.tolist()) == list(range(8)) and order.tolist() == [0, 4, 1, 5, 2, 6, 3, 7]
    W = torch.randn(16, 5)
    assert torch.equal(permute_head_rows(permute_head_rows(W, 8, order), 8, torch.argsort(order)), W)


def test_convert_cli_keeps_the_tokenizer_and_exports_it_back(tokenizer, idx, tmp_path):
    from dataset import Tokenizer
    src = save(llama(qwen2=True), tmp_path / "hf", tokenizer)
    convert(ConvertConfig(from_hf=src, out_dir=str(tmp_path / "ours")))
    model, ckpt = load_model(str(tmp_path / "ours"))
    meta = ckpt["meta"]
    assert meta["tokenizer"] == "hf" and meta["vocab_size"] == len(tokenizer) and "tokenizer.json" in meta["files"]
    assert meta["special_ids"] == {"bos_token_id": 0, "eos_token_id": 1}
    assert ckpt["config"]["hf_architecture"] == "Qwen2ForCausalLM"
    text = "First Citizen:\nBefore we proceed any further, hear me speak."
    ours_ids = Tokenizer(meta).encode(text)
    assert ours_ids == tokenizer(text, add_special_tokens=False)["input_ids"]
    assert Tokenizer(meta).decode(ours_ids) == text
    convert(ConvertConfig(in_dir=str(tmp_path / "ours"), to_hf=str(tmp_path / "back")))
    back_tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "back"))
    assert back_tok(text, add_special_tokens=False)["input_ids"] == ours_ids
    back = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "back")).eval()
    assert type(back).__name__ == "Qwen2ForCausalLM" and back.config.eos_token_id == 1
    assert_logprobs_close(hf_logprobs(back, idx), our_logprobs(model, idx))


def test_llama_import_without_a_tokenizer_is_refused_and_writes_nothing(tmp_path):
    src = save(llama(), tmp_path / "hf")
    with pytest.raises(ConversionError, match="has no tokenizer.json"):
        convert(ConvertConfig(from_hf=src, out_dir=str(tmp_path / "ours")))
    assert not os.path.exists(tmp_path / "ours" / "ckpt.pt")


@pytest.mark.parametrize("make, pattern", [
    (lambda: transformers.MistralForCausalLM(transformers.MistralConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=64, sliding_window=16)), "MistralForCausalLM model; convert.py imports exactly"),
    (lambda: transformers.GPTNeoXForCausalLM(transformers.GPTNeoXConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4, vocab_size=64)),
     "GPTNeoXForCausalLM model"),
    (lambda: transformers.Gemma2ForCausalLM(transformers.Gemma2Config(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
        head_dim=8, vocab_size=64)), "Gemma2ForCausalLM model"),
    (lambda: llama(attention_bias=True), "attention_bias=True"),
    (lambda: llama(mlp_bias=True), "mlp_bias=True"),
    (lambda: llama(hidden_act="gelu"), "hidden_act='gelu'"),
    (lambda: llama(qwen2=True, use_sliding_window=True, sliding_window=16), "use_sliding_window=True"),
])
def test_unsupported_architectures_and_fields_are_refused_by_name(make, pattern, tmp_path):
    src = save(make(), tmp_path / "hf")
    with pytest.raises(ConversionError, match=pattern) as e:
        convert(ConvertConfig(from_hf=src, out_dir=str(tmp_path / "ours")))
    message = str(e.value)
    assert "GPT2LMHeadModel, LlamaForCausalLM, Qwen2ForCausalLM" in message or "cannot be represented" in message
    assert not os.path.exists(tmp_path / "ours")


def test_unknown_rope_scaling_type_is_refused_by_name(tmp_path):
    hf = llama()
    hf.config.rope_parameters = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                "original_max_position_embeddings": 64}
    src = save(hf, tmp_path / "hf")
    with pytest.raises(ConversionError, match="rope_scaling type 'yarn'"):
        hf_pretrained(src)


def test_a_checkpoint_that_leaves_tensors_random_is_refused(tmp_path):
    """A config saying LlamaForCausalLM over weights of another shape: never a model with random tensors."""
    import json
    src = save(llama(), tmp_path / "hf")
    with open(os.path.join(src, "config.json")) as f:
        config = json.load(f)
    config["num_hidden_layers"] = 3  # layer 2 has no weights in the checkpoint
    with open(os.path.join(src, "config.json"), "w") as f:
        json.dump(config, f)
    with pytest.raises(ConversionError, match="missing keys .*layers.2"):
        hf_pretrained(src)


def test_export_names_the_first_field_no_class_holds():
    from model import GPT, GPTConfig
    peri = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=32, norm_type="rmsnorm",
                         pos="rope", mlp="swiglu", bias=False, norm_placement="peri"))
    with pytest.raises(ConversionError, match="closest is LlamaForCausalLM, which cannot hold norm_placement='peri'"):
        export_hf(peri, "unused")
    biased = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=32, norm_type="rmsnorm",
                           pos="rope", mlp="swiglu", bias=True))
    with pytest.raises(ConversionError, match="bias=True"):
        export_hf(biased, "unused")
