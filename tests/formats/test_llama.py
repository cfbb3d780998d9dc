"""The Llama family (Llama 2/3, SmolLM, TinyLlama, Qwen2/2.5) in and out, exactly, with its own tokenizer.

Every Hugging Face model here is built in the test from a config (random weights made far from uniform) and every
tokenizer is trained here on tinyshakespeare: nothing is downloaded.
"""
import json
import math
import os
import shutil

import numpy as np
import pytest
import torch

from conftest import spec
from hf_models import (
    VOCAB,
    assert_logprobs_close,
    hf_logprobs,
    llama,
    our_logprobs,
    save,
    train_tokenizer,
)
from lgpt.plumbing.checkpoint import load_model

transformers = pytest.importorskip("transformers")

from convert import (  # noqa: E402
    ConversionError,
    ConvertConfig,
    convert,
    export_hf,
    hf_pretrained,
    model_from_hf_model,
)

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
    from lgpt.formats.llama import permute_head_rows, rope_pair_order
    order = rope_pair_order(8)
    assert sorted(order.tolist()) == list(range(8)) and order.tolist() == [0, 4, 1, 5, 2, 6, 3, 7]
    W = torch.randn(16, 5)
    assert torch.equal(permute_head_rows(permute_head_rows(W, 8, order), 8, torch.argsort(order)), W)


def test_convert_cli_keeps_the_tokenizer_and_exports_it_back(tokenizer, idx, tmp_path):
    from lgpt.plumbing.dataset import Tokenizer
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


# ----------------------------------------------------------------------------------------------
# Transforms of grouped-query models


@pytest.fixture(scope="module")
def imported():
    """An imported GQA 8/2 Qwen2 (Q/K/V biases) and Llama (tied, Llama-3 RoPE scaling), with a token batch."""
    models = {}
    for name, kw in (("qwen2", dict(qwen2=True)), ("llama", dict(tied=True, rope_scaling=True))):
        hf = llama(n_head=8, n_kv_head=2, **kw)
        models[name] = model_from_hf_model(hf)
    return models


KINDS_AT_M_GE_D = [("orthogonal", 64), ("orthogonal", 96), ("truncate", 80), ("srht", 64)]  # orthonormal columns


@pytest.mark.parametrize("which", ["qwen2", "llama"])
@pytest.mark.parametrize("kind, width", KINDS_AT_M_GE_D)
def test_residual_porting_of_a_gqa_model_is_exact_at_m_ge_d(imported, which, kind, width, idx):
    from lgpt.method.pipeline import transform_model
    model = imported[which]
    new, record = transform_model(model, spec(width, kind=kind, porting="residual", norms="fold", seed=3))
    assert record["exact"] and new.config.kv_heads == 2 and new.config.n_embd == width
    assert_logprobs_close(our_logprobs(new, idx), our_logprobs(model, idx))


@pytest.mark.parametrize("refit", ["gains", "readers", "all"])
def test_refit_and_learned_map_run_on_gqa(imported, refit, idx, tmp_path):
    from hf_models import shakespeare_text
    from lgpt.method.pipeline import transform_model
    from lgpt.plumbing.dataset import BatchLoader, prepare_text
    model = imported["qwen2"]
    data = tmp_path / "data"
    prepare_text(shakespeare_text()[:20_000], str(data), "char")  # ids < 65: any ids fit the 320-token model
    loader = BatchLoader(str(data), 32, 4)
    exact, record = transform_model(model, spec(64, kind="orthogonal", refit=refit, calib_batches=2), loader)
    assert record["corrections"]["calibration_kl_after"] < 1e-4  # an exact port stays (ridge-)exact under refit
    shrunk, record = transform_model(model, spec(48, kind="pca", refit=refit, learn_steps=3, calib_batches=2), loader)
    kl = record["corrections"]
    assert shrunk.config.n_embd == 48 and kl["calibration_kl_after"] <= kl["calibration_kl_before"] + 1e-9


@pytest.mark.parametrize("grow_mode", ["zero", "clone"])
@pytest.mark.parametrize("n_head, n_kv_head, expect_kv", [(16, 0, 4), (8, 8, 8), (8, 4, 4), (16, 8, 8)])
def test_head_growth_of_gqa_keeps_the_function(imported, grow_mode, n_head, n_kv_head, expect_kv, idx):
    from lgpt.method.pipeline import transform_model
    model = imported["qwen2"]
    if grow_mode == "clone" and n_head % model.config.n_head:
        pytest.skip("clone needs a multiple")
    new, record = transform_model(model, spec(96, kind="orthogonal", n_head=n_head, n_kv_head=n_kv_head,
                                              grow_mode=grow_mode, clone_noise=0.01, seed=1))
    assert (new.config.n_head, new.config.kv_heads) == (n_head, expect_kv)
    assert_logprobs_close(our_logprobs(new, idx), our_logprobs(model, idx))


def test_gqa_bad_requests_name_the_reason(imported):
    from lgpt.method.pipeline import transform_model
    from lgpt.plumbing.errors import TransformError
    model = imported["qwen2"]
    with pytest.raises(TransformError, match="porting='sandwich' maps Q, K and V as square"):
        transform_model(model, spec(64, kind="orthogonal", porting="sandwich"))
    with pytest.raises(TransformError, match="published code maps Q .* on both axes but K and V"):
        transform_model(model, spec(64, kind="orthogonal", porting="paper_code"))
    with pytest.raises(TransformError, match="n_head=10 keeps the model.s 4 query heads"):
        transform_model(model, spec(64, kind="orthogonal", n_head=10))
    with pytest.raises(TransformError, match="must divide the model's 4"):
        transform_model(model, spec(64, kind="orthogonal", n_head=24, n_kv_head=8))  # groups of 3
    with pytest.raises(TransformError, match="must be >= the model's 2"):
        transform_model(model, spec(64, kind="orthogonal", n_kv_head=1))


def test_gqa_circuits_pair_each_query_head_with_its_key_value_head(imported):
    """eval_geometry's per-head circuits on a GQA model equal a naive MHA expansion's (K, V repeated per group)."""
    from lgpt.method import geometry
    from model import GPT, GPTConfig
    model = imported["qwen2"]
    cfg = model.config
    expanded_cfg = GPTConfig(**dict(cfg.to_dict(), n_kv_head=None))
    state = {k: v.clone() for k, v in model.state_dict().items()}
    hd, H, K = cfg.head_dim, cfg.n_head, cfg.kv_heads
    for i in range(cfg.n_layer):
        for leaf in ("weight", "bias"):
            name = f"transformer.h.{i}.attn.c_attn.{leaf}"
            q, k, v = state[name].split((H * hd, K * hd, K * hd))
            state[name] = torch.cat([q] + [t.reshape(K, hd, *t.shape[1:]).repeat_interleave(H // K, 0).flatten(0, 1)
                                           for t in (k, v)])
    mha = GPT.from_state_dict(expanded_cfg, state).eval()
    idx = torch.randint(0, 320, (1, 24))
    assert_logprobs_close(our_logprobs(mha, idx), our_logprobs(model, idx))
    block, block_mha = model.transformer.h[0], mha.transformer.h[0]
    gqa = geometry.head_circuits(block.attn.c_attn.weight, block.attn.c_proj.weight, block.ln_1.weight, H, hd, K)
    ref = geometry.head_circuits(block_mha.attn.c_attn.weight, block_mha.attn.c_proj.weight, block_mha.ln_1.weight,
                                 H, hd)
    for (qk, ov), (qk_ref, ov_ref) in zip(gqa, ref):
        assert torch.allclose(qk, qk_ref) and torch.allclose(ov, ov_ref)


# ----------------------------------------------------------------------------------------------
# An imported Llama through every script, with its own tokenizer, and out to the ecosystem


@pytest.fixture(scope="module")
def pipeline(tokenizer, tmp_path_factory):
    """import → prepare tinyshakespeare with the model's tokenizer → PCA shrink → distillation finetune → export."""
    from finetune import FinetuneConfig, finetune
    from lgpt.plumbing.configurator import load_config
    from prepare import PrepareConfig, prepare
    from transform import TransformConfig, transform_checkpoint
    root = tmp_path_factory.mktemp("llama_pipeline")
    src = save(llama(n_head=8, n_kv_head=2, tied=True, rope_scaling=True), root / "hf", tokenizer)
    convert(ConvertConfig(from_hf=src, out_dir=str(root / "ours")))
    prepare(PrepareConfig(tokenizer_from=str(root / "ours"), out_dir=str(root / "data")))
    transform_checkpoint(TransformConfig(in_dir=str(root / "ours"), out_dir=str(root / "m48"), width=48, kind="pca",
                                         data_dir=str(root / "data"), eval_iters=2, calib_batches=2, block_size=32,
                                         allow_broken=True))  # random weights: their shrink is no better than chance
    finetune(load_config(FinetuneConfig, [
        f"--in_dir={root / 'm48'}", f"--out_dir={root / 'ft'}", f"--data_dir={root / 'data'}", "--distill=True",
        "--max_iters=4", "--eval_interval=2", "--eval_iters=2", "--batch_size=2", "--block_size=32",
        "--progress_bar=False", "--compile=False", "--wandb_log=False"]))
    convert(ConvertConfig(in_dir=str(root / "ours"), to_hf=str(root / "back"), lm_eval_task=True,
                          data_dir=str(root / "data")))
    convert(ConvertConfig(in_dir=str(root / "ft"), to_hf=str(root / "back_ft")))
    return root


def test_every_script_runs_on_an_imported_llama_with_its_own_tokenizer(pipeline, tokenizer):
    from eval_geometry import GeometryConfig, evaluate_geometry
    from lgpt.plumbing.dataset import load_meta
    from sample import SampleConfig, sample
    root = pipeline
    _, ckpt = load_model(str(root / "ours"))
    assert load_meta(str(root / "data"))["fingerprint"] == ckpt["meta"]["fingerprint"]
    ft, ft_ckpt = load_model(str(root / "ft"))
    assert ft.config.n_embd == 48 and ft.config.kv_heads == 2 and ft_ckpt["iter_num"] == 4
    metrics = evaluate_geometry(GeometryConfig(ref_dir=str(root / "ours"), in_dir=str(root / "m48"),
                                               out_dir=str(root / "geom"), data_dir=str(root / "data"), n_probes=256,
                                               probe_batches=1, batch_size=2, eval_iters=2, wandb_log=False,
                                               block_size=32))
    assert metrics and os.path.exists(root / "geom" / "metrics.json")
    back = transformers.AutoModelForCausalLM.from_pretrained(str(root / "back_ft")).eval()  # the shrunk, finetuned
    assert type(back).__name__ == "LlamaForCausalLM" and back.config.hidden_size == 48
    x = torch.randint(0, 288, (1, 32))
    assert torch.allclose(hf_logprobs(back, x), our_logprobs(ft, x), atol=1e-4)
    texts = sample(SampleConfig(out_dir=str(root / "ft"), start="ROMEO:", num_samples=1, max_new_tokens=8))
    assert texts[0].startswith("ROMEO:") and len(texts[0]) > len("ROMEO:")


def test_the_model_tokenizer_is_refused_with_other_data(pipeline, char_data_dir, tmp_path):
    from lgpt.plumbing.dataset import check_tokenizer
    from lgpt.plumbing.errors import DataError
    _, ckpt = load_model(str(pipeline / "ours"))
    with pytest.raises(DataError, match=r"Hugging Face tokenizer, \d+ symbols .* differs from the data's"):
        check_tokenizer(ckpt, char_data_dir)


def test_prepare_refuses_to_overwrite_and_checks_its_input(pipeline, tmp_path):
    from lgpt.plumbing.errors import ConfigError, DataError
    from prepare import PrepareConfig, prepare
    with pytest.raises(ConfigError, match="already holds a dataset"):
        prepare(PrepareConfig(tokenizer_from=str(pipeline / "ours"), out_dir=str(pipeline / "data")))
    with pytest.raises(DataError, match="no such file"):
        prepare(PrepareConfig(tokenizer_from=str(pipeline / "ours"), input=str(tmp_path / "nope.txt"),
                              out_dir=str(tmp_path / "d")))
    assert not os.path.exists(tmp_path / "d")


def test_large_vocabularies_are_stored_as_uint32(tmp_path):
    """Llama 3 / Qwen2 ids exceed uint16: the dataset records uint32 and the loader reads it back."""
    from hf_models import shakespeare_text
    from lgpt.plumbing.dataset import BatchLoader, load_meta, prepare_text
    tok = train_tokenizer(vocab_size=300)
    big = tok.backend_tokenizer
    big.add_tokens([f"<extra_{i}>" for i in range(70_000)])  # ids up to ~70,300
    files = {"tokenizer.json": big.to_str()}
    from lgpt.plumbing.dataset import hf_tokenizer_meta
    text = shakespeare_text()[:5000] + " <extra_69999> " * 50
    meta = prepare_text(text, str(tmp_path), hf_tokenizer_meta(files))
    assert meta["dtype"] == "uint32" and load_meta(str(tmp_path))["vocab_size"] > 2**16
    ids = np.fromfile(tmp_path / "val.bin", dtype=np.uint32)
    assert ids.max() >= 2**16
    x, y = next(BatchLoader(str(tmp_path), 8, 64).full_split("val"))
    assert int(torch.cat([x.flatten(), y.flatten()]).max()) == int(ids.max())


@pytest.mark.slow
def test_transformer_lens_reproduces_an_exported_llama(pipeline):
    bridge_module = pytest.importorskip("transformer_lens.model_bridge")
    ours, _ = load_model(str(pipeline / "ours"))
    bridge = bridge_module.TransformerBridge.boot_transformers(str(pipeline / "back"), device="cpu")
    x = torch.randint(0, ours.config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits, _, hidden = ours(x, all_logits=True, return_hidden=True)
        tl_logits, cache = bridge.run_with_cache(x)
    assert_logprobs_close(tl_logits.log_softmax(-1), logits.log_softmax(-1))
    for layer in range(ours.config.n_layer):
        torch.testing.assert_close(cache[f"blocks.{layer}.hook_resid_post"], hidden[layer + 1], atol=1e-4, rtol=1e-4)


@pytest.mark.slow
def test_lm_eval_on_an_exported_llama_agrees_with_our_loss(pipeline):
    """lm-eval's rolling log-likelihood of the val text equals ours on the same windows (its first token predicted
    from the model's BOS, as lm-eval does for Llama)."""
    lm_eval = pytest.importorskip("lm_eval")
    import json

    from lm_eval.tasks import TaskManager
    from test_ecosystem import rolling_loss
    ours, ckpt = load_model(str(pipeline / "ours"))
    ours.config.block_size = 128
    hf_dir = str(pipeline / "back")
    bos = ckpt["meta"]["special_ids"]["bos_token_id"]
    results = lm_eval.simple_evaluate(model="hf", model_args=f"pretrained={hf_dir},dtype=float32,prefix_token_id={bos}"
                                      ",max_length=128", tasks=["nanolgpt_val"],
                                      task_manager=TaskManager(include_path=os.path.join(hf_dir, "lm_eval")),
                                      device="cpu", batch_size=8)
    metrics = results["results"]["nanolgpt_val"]
    bits_per_byte = next(v for k, v in metrics.items() if k.startswith("bits_per_byte") and "stderr" not in k)
    text = json.loads(open(os.path.join(hf_dir, "lm_eval", "val.jsonl")).readline())["text"]
    from lgpt.plumbing.dataset import Tokenizer
    tokens = np.array(Tokenizer(ckpt["meta"]).encode(text))
    nll_per_token = rolling_loss(ours, tokens, prefix=bos)
    ours_bits_per_byte = nll_per_token * len(tokens) / len(text.encode()) / math.log(2)
    assert abs(ours_bits_per_byte / bits_per_byte - 1) < 1e-4


def test_convert_cli_refuses_another_architecture_with_one_line(tmp_path):
    import subprocess
    import sys

    from conftest import ROOT
    mistral = transformers.MistralForCausalLM(transformers.MistralConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=64, sliding_window=16))
    src = save(mistral, tmp_path / "mistral")
    result = subprocess.run([sys.executable, os.path.join(ROOT, "convert.py"), f"--from_hf={src}",
                             f"--out_dir={tmp_path / 'out'}"], capture_output=True, text=True, timeout=120,
                            env=dict(os.environ, HF_HUB_OFFLINE="1"))
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == 1 and "Traceback" not in result.stderr and len(lines) == 1
    assert "MistralForCausalLM" in lines[0] and "LlamaForCausalLM, Qwen2ForCausalLM" in lines[0]
    assert not os.path.exists(tmp_path / "out")


def test_carry_refuses_a_regrouping_and_follows_a_kept_ratio(tmp_path, char_data_dir):
    from conftest import ROOT, TINY_MODEL
    from lgpt.plumbing.configurator import load_config
    from lgpt.plumbing.errors import TransformError
    from train import TrainConfig, train
    from transform import TransformConfig, transform_checkpoint
    tiny = [a for a in TINY_MODEL if not a.startswith("--n_head")]
    train(load_config(TrainConfig, [os.path.join(ROOT, "configs", "variants", "llama.py"), *tiny, "--max_iters=4",
                                    f"--data_dir={char_data_dir}", f"--out_dir={tmp_path / 'gqa'}"]))
    grown = transform_checkpoint(TransformConfig(in_dir=str(tmp_path / "gqa"), out_dir=str(tmp_path / "g"), width=48,
                                                 kind="orthogonal", n_head=8, carry_optimizer=True, eval_iters=0))
    assert grown["optimizer"]["carried"]
    model, _ = load_model(str(tmp_path / "g"))
    assert (model.config.n_head, model.config.kv_heads) == (8, 4)
    with pytest.raises(TransformError, match="cannot follow a change of the query heads per key/value head"):
        transform_checkpoint(TransformConfig(in_dir=str(tmp_path / "gqa"), out_dir=str(tmp_path / "r"), width=48,
                                             kind="orthogonal", n_kv_head=4, carry_optimizer=True, eval_iters=0))
    assert not os.path.exists(tmp_path / "r")


def test_a_tied_config_over_a_file_with_its_own_head_imports_that_head(idx, tmp_path):
    """The config says tie_word_embeddings, the file holds a trained lm_head of its own: transformers keeps both
    (and warns); importing tied once dropped the head (log-probs off by up to 0.63)."""
    from safetensors.torch import load_file, save_file
    src = save(llama(n_head=4, n_kv_head=4, tied=True), tmp_path / "hf")
    weights = load_file(os.path.join(src, "model.safetensors"))
    weights["lm_head.weight"] = 0.25 * torch.randn_like(weights["model.embed_tokens.weight"])
    save_file(weights, os.path.join(src, "model.safetensors"), metadata={"format": "pt"})
    theirs = transformers.AutoModelForCausalLM.from_pretrained(src).eval()
    ours, _ = hf_pretrained(src)
    assert ours.config.head == "linear" and torch.equal(ours.lm_head.weight, weights["lm_head.weight"])
    assert_logprobs_close(our_logprobs(ours, idx), hf_logprobs(theirs, idx))


def _edit_config(change):
    def edit(directory):
        path = os.path.join(directory, "config.json")
        with open(path) as f:
            config = json.load(f)
        change(config)
        with open(path, "w") as f:
            json.dump(config, f)
    return edit


def _cut_weights(directory):
    path = os.path.join(directory, "model.safetensors")
    data = open(path, "rb").read()
    with open(path, "wb") as f:
        f.write(data[: len(data) // 2])


def _drop_a_shard(directory):
    model = transformers.AutoModelForCausalLM.from_pretrained(directory)
    os.remove(os.path.join(directory, "model.safetensors"))
    model.save_pretrained(directory, max_shard_size="100KB")
    os.remove(os.path.join(directory, "model-00002-of-00006.safetensors"))


DAMAGED_HF = {  # what is wrong with the directory: (how to make it, words the one line must hold)
    "a missing shard": (_drop_a_shard, ["model-00002-of-00006.safetensors", "incomplete"]),
    "a config key missing": (_edit_config(lambda c: c.pop("hidden_size")), ["shape differs from what config.json"]),
    "an impossible head count": (_edit_config(lambda c: c.update(num_attention_heads=7)), ["not a multiple"]),
    "incomplete rope scaling": (_edit_config(lambda c: c.update(rope_parameters={"rope_type": "llama3",
                                                                                 "factor": 8.0})),
                                ["low_freq_factor"]),
    "a tensor of the wrong shape": (_edit_config(lambda c: c.update(intermediate_size=100)),
                                    ["shape differs from what config.json"]),
    "truncated weights": (_cut_weights, ["cannot be loaded", "SafetensorError"]),
    "a corrupt tokenizer.json": (lambda d: open(os.path.join(d, "tokenizer.json"), "w").write('{"model": '),
                                 ["tokenizer.json cannot be read"]),
}


@pytest.mark.parametrize("case", sorted(DAMAGED_HF))
def test_damaged_hugging_face_directories_are_one_line_and_write_nothing(case, tokenizer, tmp_path, capsys):
    import importlib

    from lgpt.plumbing.cli import run_cli
    src = save(llama(n_head=4, n_kv_head=2), tmp_path / "hf", tokenizer)
    make, words = DAMAGED_HF[case]
    make(src)
    capsys.readouterr()  # what saving the model printed
    rc = run_cli(importlib.import_module("convert").main, [f"--from_hf={src}", f"--out_dir={tmp_path / 'out'}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and len(err) == 1 and err[0].startswith("error:") and all(w in err[0] for w in words), err
    assert not (tmp_path / "out").exists()


def test_an_export_is_staged_and_an_interrupted_run_exports_only_when_asked(tokenizer, tmp_path, monkeypatch,
                                                                            capsys):
    """An export cut short (here: the tokenizer fails after the weights were written) leaves no directory that
    looks like an export; a checkpoint marked incomplete is refused unless --allow_incomplete=True."""
    import importlib

    import convert as convert_module
    from lgpt.plumbing.cli import run_cli
    src = save(llama(n_head=4, n_kv_head=2), tmp_path / "hf", tokenizer)
    convert(ConvertConfig(from_hf=src, out_dir=str(tmp_path / "ours")))

    def failing(meta, out_dir):
        raise ConversionError("the tokenizer could not be written")
    monkeypatch.setattr(convert_module, "export_tokenizer", failing)
    rc = run_cli(importlib.import_module("convert").main, [f"--in_dir={tmp_path / 'ours'}",
                                                          f"--to_hf={tmp_path / 'export'}"])
    assert rc == 1 and not (tmp_path / "export").exists()
    assert not [p for p in os.listdir(tmp_path) if ".tmp-" in p]  # the staging directory is gone too
    monkeypatch.undo()
    ckpt = torch.load(tmp_path / "ours" / "ckpt.pt", weights_only=False)
    ckpt["complete"] = False
    os.makedirs(tmp_path / "cut")
    torch.save(ckpt, tmp_path / "cut" / "ckpt.pt")
    capsys.readouterr()
    for flag, path in (("--to_hf", tmp_path / "cut-hf"), ("--to_gguf", tmp_path / "cut.gguf")):
        rc = run_cli(importlib.import_module("convert").main, [f"--in_dir={tmp_path / 'cut'}", f"{flag}={path}"])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 1 and len(err) == 1 and "interrupted run" in err[0] and "--allow_incomplete" in err[0], err
        assert not path.exists()
    assert run_cli(importlib.import_module("convert").main, [f"--in_dir={tmp_path / 'cut'}",
                                                            f"--to_hf={tmp_path / 'cut-hf'}",
                                                            "--allow_incomplete=True"]) == 0
    assert (tmp_path / "cut-hf" / "config.json").exists() and (tmp_path / "cut-hf" / "tokenizer.json").exists()


@pytest.mark.parametrize("script", ["transform", "finetune", "convert", "prepare"])
def test_a_dangling_symlink_as_out_dir_is_refused_before_any_work(script, trained_dir, tmp_path, capsys):
    import importlib

    from lgpt.plumbing.cli import run_cli
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "nowhere" / "deeper")
    argv = {"transform": [f"--in_dir={trained_dir}", f"--out_dir={link}", "--width=40", "--eval_iters=0"],
            "finetune": [f"--in_dir={trained_dir}", f"--out_dir={link}", "--max_iters=2"],
            "convert": [f"--from_nanogpt={trained_dir}", f"--out_dir={link}"],
            "prepare": ["--tokenizer=char", f"--out_dir={link}"]}[script]
    rc = run_cli(importlib.import_module(script).main, argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and len(err) == 1 and "is a symbolic link" in err[0] and "does not exist" in err[0], err
    assert not (tmp_path / "nowhere").exists() and link.is_symlink()


def _mutations(value):
    """Each way a config.json value can be wrong: gone, of the wrong type, or out of range."""
    yield "deleted", KeyError
    if isinstance(value, bool):
        yield "a string", "yes"
    elif isinstance(value, int):
        yield "negative", -3
        yield "a string", "x"
    elif isinstance(value, float):
        yield "negative", -1.0
        yield "NaN", float("nan")
    elif isinstance(value, str):
        yield "unknown", "zzz"
        yield "a number", 7
    else:
        yield "a string", "x"


@pytest.mark.slow
def test_every_config_key_mutated_gives_a_clear_line_or_the_model_transformers_loads(tokenizer, tmp_path, capsys):
    """The fuzz pass over config.json: each key deleted, given the wrong type, or put out of range, in turn. convert.py
    either imports exactly what transformers loads from the same directory (log-probs equal) or refuses with one
    'error:' line and writes nothing — never a traceback."""
    import importlib

    from lgpt.plumbing.cli import run_cli
    src = save(llama(n_head=4, n_kv_head=2), tmp_path / "hf", tokenizer)
    with open(os.path.join(src, "config.json")) as f:
        config = json.load(f)
    idx = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(0))
    convert_main = importlib.import_module("convert").main
    outcomes = {"imported": 0, "refused": 0}
    for key, value in sorted(config.items()):
        for what, new in _mutations(value):
            case = tmp_path / f"{key}-{what.replace(' ', '_')}"
            shutil.copytree(src, case)
            changed = {k: v for k, v in config.items() if k != key or new is not KeyError}
            if new is not KeyError:
                changed[key] = new
            with open(case / "config.json", "w") as f:
                json.dump(changed, f)
            capsys.readouterr()
            rc = run_cli(convert_main, [f"--from_hf={case}", f"--out_dir={case}-out"])
            err = capsys.readouterr().err.strip().splitlines()
            if rc == 0:
                outcomes["imported"] += 1
                theirs = transformers.AutoModelForCausalLM.from_pretrained(case, dtype=torch.float32).eval()
                ours = load_model(str(case) + "-out")[0]
                assert_logprobs_close(our_logprobs(ours, idx), hf_logprobs(theirs, idx))
            else:
                outcomes["refused"] += 1
                assert rc == 1 and len(err) == 1 and err[0].startswith("error:"), (key, what, err)
                assert not os.path.exists(f"{case}-out"), (key, what)
    assert outcomes["imported"] and outcomes["refused"] > 20  # both paths were exercised


def test_a_shrink_that_keeps_the_head_tied_exports_as_a_tied_llama(char_data_dir, idx, tmp_path):
    """--tie_head with --tie_keep shrinks a tied Llama (one outlying final gain, as SmolLM2's) to a model that
    transformers loads as a tied LlamaForCausalLM of the new width, with the same log-probs."""
    from lgpt.method.pipeline import transform_model
    from lgpt.plumbing.dataset import BatchLoader
    hf = llama(n_head=4, n_kv_head=2, tied=True)
    with torch.no_grad():
        hf.model.norm.weight[5] = -2.0
    ours = model_from_hf_model(hf.eval())
    ours.config.block_size = 32
    shrunk, record = transform_model(ours, spec(48, kind="pca", tie_head=True, tie_keep=1,
                                                calib_batches=2), BatchLoader(char_data_dir, 32, 4, "cpu"))
    assert record["pca_keep"] == [5] and shrunk.config.head == "tied"
    assert export_hf(shrunk, str(tmp_path / "back")) == "LlamaForCausalLM"
    back = transformers.LlamaForCausalLM.from_pretrained(str(tmp_path / "back")).eval()
    assert back.config.tie_word_embeddings and back.config.hidden_size == 48
    assert back.lm_head.weight.data_ptr() == back.model.embed_tokens.weight.data_ptr()
    assert_logprobs_close(hf_logprobs(back, idx[:, :32]), our_logprobs(shrunk, idx[:, :32]))
