"""Offline import/export: a tiny random GPT-2 built inside the test, and a nanoGPT-format checkpoint."""
import os

import pytest
import torch

from conftest import spec
from lgpt.plumbing.checkpoint import load_model, save_checkpoint
from lgpt.plumbing.errors import CheckpointError, DataError
from model import GPT, GPTConfig

transformers = pytest.importorskip("transformers")

from convert import ConversionError, ConvertConfig, convert, export_hf, gpt2_from_pretrained  # noqa: E402
from lgpt.method.pipeline import transform_model  # noqa: E402


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=16, vocab_size=50, n_positions=32,
                                  bos_token_id=49, eos_token_id=49)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():  # non-trivial gains and biases
        for name, p in model.named_parameters():
            if "ln_" in name or name.endswith("bias"):
                p.add_(0.2 * torch.randn_like(p))
    path = tmp_path_factory.mktemp("hf")
    model.save_pretrained(path)
    return str(path)


def hf_logits(path, idx):
    model = transformers.GPT2LMHeadModel.from_pretrained(path).eval()
    with torch.no_grad():
        return model(idx).logits


def test_import_matches_hugging_face(hf_dir):
    ours = gpt2_from_pretrained(hf_dir).eval()
    assert ours.config.mlp == "gelu_tanh" and ours.config.head == "tied"
    idx = torch.randint(0, 50, (2, 12))
    assert torch.allclose(ours(idx, all_logits=True)[0], hf_logits(hf_dir, idx), atol=1e-5)


def test_export_round_trip_and_transformed_model_stays_exact(hf_dir, tmp_path):
    convert(ConvertConfig(from_hf=hf_dir, out_dir=str(tmp_path / "ours")))
    model, ckpt = load_model(str(tmp_path / "ours"))
    assert ckpt["meta"]["tokenizer"] == "gpt2"
    idx = torch.randint(0, 50, (2, 12))
    reference = hf_logits(hf_dir, idx)
    convert(ConvertConfig(in_dir=str(tmp_path / "ours"), to_hf=str(tmp_path / "back")))
    assert torch.allclose(hf_logits(str(tmp_path / "back"), idx), reference, atol=1e-5)
    grown, record = transform_model(model, spec(24, kind="orthogonal", porting="residual", norms="fold", seed=0))
    assert record["exact"]
    assert torch.allclose(grown(idx, all_logits=True)[0], reference, atol=1e-4)
    same, _ = transform_model(model, spec(16, kind="orthogonal", porting="residual", norms="fold", seed=1))
    assert torch.allclose(same(idx, all_logits=True)[0], reference, atol=1e-4)


def test_export_names_the_field_it_cannot_express(tmp_path):
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=8, block_size=8, vocab_size=11, norm_type="rmsnorm",
                          pos="rope"))
    with pytest.raises(ConversionError, match=r"closest is GPT2LMHeadModel, which cannot hold norm_type='rmsnorm'"):
        export_hf(model, str(tmp_path / "x"))
    assert not (tmp_path / "x").exists()


def test_scalar_gain_and_biasless_models_export_exactly(tmp_path):
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=16, vocab_size=50, norm_gain="scalar",
                          bias=False, head="tied", mlp="gelu")).eval()
    with torch.no_grad():
        model.transformer.ln_f.weight.fill_(1.7)
    export_hf(model, str(tmp_path / "hf"))
    idx = torch.randint(0, 50, (2, 10))
    assert torch.allclose(hf_logits(str(tmp_path / "hf"), idx), model(idx, all_logits=True)[0], atol=1e-5)


def test_nanogpt_checkpoint_imports(tmp_path, char_data_dir):
    torch.manual_seed(0)
    source = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=16, vocab_size=50, bias=False, head="tied"))
    state = {f"_orig_mod.{k}": v for k, v in source.state_dict().items()}
    state["_orig_mod.transformer.h.0.attn.bias"] = torch.tril(torch.ones(16, 16)).view(1, 1, 16, 16)
    nanogpt = {"model": state, "optimizer": {}, "iter_num": 5, "best_val_loss": 2.0, "config": {"dataset": "x"},
               "model_args": dict(n_layer=2, n_head=2, n_embd=16, block_size=16, bias=False, vocab_size=50,
                                  dropout=0.0)}
    save_checkpoint(nanogpt, str(tmp_path / "ng"))
    # a 50-token model whose dataset 'x' has no meta.pkl here: GPT-2 BPE cannot be its tokenizer, so no silent guess
    with pytest.raises(CheckpointError, match="pass --data_dir"):
        convert(ConvertConfig(from_nanogpt=str(tmp_path / "ng"), out_dir=str(tmp_path / "ours")))
    assert not (tmp_path / "ours").exists()
    convert(ConvertConfig(from_nanogpt=str(tmp_path / "ng"), out_dir=str(tmp_path / "ours"), data_dir=char_data_dir))
    model, ckpt = load_model(str(tmp_path / "ours"))
    assert ckpt["meta"]["tokenizer"] == "char" and ckpt["config"]["data_dir"] == char_data_dir
    direct = load_model(str(tmp_path / "ng"))[0]  # nanoGPT checkpoints also load directly (mask buffers dropped)
    idx = torch.randint(0, 50, (2, 12))
    assert model.config.head == "tied"
    assert torch.allclose(model(idx, all_logits=True)[0], source.eval()(idx, all_logits=True)[0], atol=1e-6)
    assert torch.equal(direct(idx, all_logits=True)[0], model(idx, all_logits=True)[0])


def test_offline_hub_name_gets_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    with pytest.raises(ConversionError, match="HF_HUB_OFFLINE"):
        gpt2_from_pretrained("gpt2")


def test_grown_gpt2_keeps_layernorm_and_exports_exactly(hf_dir, tmp_path):
    model = gpt2_from_pretrained(hf_dir).eval()
    idx = torch.randint(0, 50, (2, 12))
    reference = hf_logits(hf_dir, idx)
    grown, record = transform_model(model, spec(24, kind="orthogonal", porting="residual", norms="fold", seed=0,
                                                keep_layernorm=True))
    assert grown.config.norm_type == "layernorm" and record["exact"]
    assert torch.allclose(grown(idx, all_logits=True)[0], reference, atol=1e-4)
    export_hf(grown, str(tmp_path / "hf24"))
    assert torch.allclose(hf_logits(str(tmp_path / "hf24"), idx), reference, atol=1e-4)


@pytest.mark.skipif(not os.environ.get("TIKTOKEN_CACHE_DIR"), reason="needs TIKTOKEN_CACHE_DIR offline (GPT-2 BPE)")
def test_init_from_gpt2_in_train_and_finetune(char_data_dir, tmp_path, tmp_path_factory, monkeypatch):
    """The hub is offline here: a tiny random GPT-2 with GPT-2's vocabulary stands in for 'gpt2' to test the
    wiring, on BPE-tokenized text (the tokenizer check refuses char data for a GPT-2 model)."""
    import convert
    from finetune import FinetuneConfig, finetune
    from lgpt.plumbing.configurator import load_config
    from lgpt.plumbing.dataset import prepare_text
    from train import TrainConfig, train
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_head=2, n_embd=16, n_positions=32))
    monkeypatch.setattr(convert, "gpt2_from_pretrained", lambda name, **kw: convert.model_from_hf_model(hf, **kw))
    bpe_dir = str(tmp_path / "bpe")
    prepare_text("The king shall not love thee, my lord. " * 400, bpe_dir, "gpt2")
    common = ["--max_iters=4", "--eval_interval=2", "--eval_iters=2", "--batch_size=2", "--block_size=16",
              "--progress_bar=False"]
    with pytest.raises(DataError, match="differs from the data's"):
        train(load_config(TrainConfig, common + [f"--data_dir={char_data_dir}", "--init_from=gpt2",
                                                  f"--out_dir={tmp_path / 'wrong'}"]))
    summary = train(load_config(TrainConfig, common + [f"--data_dir={bpe_dir}", "--init_from=gpt2",
                                                        f"--out_dir={tmp_path / 't'}", "--dropout=0.1"]))
    assert summary["iter_num"] == 4
    model, ckpt = load_model(str(tmp_path / "t"))
    assert model.config.n_embd == 16 and model.config.mlp == "gelu_tanh" and model.config.dropout == 0.1
    assert model.config.block_size == 16 and ckpt["meta"]["tokenizer"] == "gpt2"  # cropped from 32, as nanoGPT
    summary = finetune(load_config(FinetuneConfig, common + [f"--data_dir={bpe_dir}", "--init_from=gpt2",
                                                              f"--out_dir={tmp_path / 'f'}"]))
    assert summary["iter_num"] == 4


def test_hf_export_with_char_tokenizer_loads_offline_and_matches(trained_dir, tmp_path):
    """`convert.py --to_hf` writes model + tokenizer: AutoModelForCausalLM and AutoTokenizer load the directory with
    no network, the tokenizer gives our ids and text back, and the logits are ours."""
    from lgpt.plumbing.dataset import Tokenizer
    out = str(tmp_path / "hf")
    convert(ConvertConfig(in_dir=trained_dir, to_hf=out))
    ours, ckpt = load_model(trained_dir)
    tok = transformers.AutoTokenizer.from_pretrained(out)
    hf = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    text = "The king shall not love thee.\nMy lord"
    ids = Tokenizer(ckpt["meta"]).encode(text)
    assert tok(text)["input_ids"] == ids and tok.decode(ids) == text
    x = torch.tensor([ids[:16]])
    with torch.no_grad():
        torch.testing.assert_close(hf(x).logits, ours(x, all_logits=True)[0], atol=1e-4, rtol=1e-4)


def test_gpt2_bpe_tokenizer_is_built_offline_and_equals_tiktoken(tmp_path):
    import tiktoken

    from convert import export_tokenizer
    from lgpt.plumbing.dataset import GPT2_META
    export_tokenizer(GPT2_META, str(tmp_path))
    tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    enc = tiktoken.get_encoding("gpt2")
    text = "First Citizen:\nBefore we proceed any further, hear me speak.  héllo 🎉 <|endoftext|> 1234567"
    ids = enc.encode(text, allowed_special={"<|endoftext|>"})
    assert tok(text)["input_ids"] == ids
    assert tok.decode(ids, skip_special_tokens=False) == text
    assert tok.eos_token_id == 50256 and len(tok) == 50257


def test_export_refuses_a_checkpoint_without_a_tokenizer_and_writes_nothing(trained_dir, tmp_path):
    import shutil
    src = tmp_path / "src"
    shutil.copytree(trained_dir, src)
    ckpt = torch.load(src / "ckpt.pt", weights_only=False)
    ckpt["meta"] = None
    torch.save(ckpt, src / "ckpt.pt")
    with pytest.raises(ConversionError, match="records no tokenizer"):
        convert(ConvertConfig(in_dir=str(src), to_hf=str(tmp_path / "hf")))
    assert not (tmp_path / "hf").exists()
