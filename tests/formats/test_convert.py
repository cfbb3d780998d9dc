"""Offline import/export: a tiny random GPT-2 built inside the test, and a nanoGPT-format checkpoint."""
import os
import sys

import pytest
import torch

from conftest import spec
from lgpt.plumbing.checkpoint import load_model, save_checkpoint
from lgpt.plumbing.errors import CheckpointError, DataError
from model import GPT, GPTConfig

transformers = pytest.importorskip("transformers")

from convert import ConversionError, ConvertConfig, convert, export_gguf, export_hf, gpt2_from_pretrained  # noqa: E402
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


def nanogpt_train_checkpoint(path, compiled: bool = True) -> GPT:
    """A ckpt.pt laid out exactly as karpathy/nanoGPT's train.py writes it: its raw model's state_dict (under
    torch.compile: '_orig_mod.' names), a real AdamW state, model_args, iter_num, best_val_loss as the 0-d tensor
    its estimate_loss returns, and its whole config dict; written by torch.save, not by us."""
    torch.manual_seed(0)
    source = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=16, vocab_size=65, bias=False, head="tied"))
    optimizer = torch.optim.AdamW(source.parameters(), lr=1e-3)
    source(torch.randint(0, 65, (2, 8)), torch.randint(0, 65, (2, 8)))[1].backward()
    optimizer.step()
    prefix = "_orig_mod." if compiled else ""
    config = {"out_dir": "out-shakespeare-char", "eval_interval": 250, "dataset": "shakespeare_char",
              "always_save_checkpoint": False, "learning_rate": 1e-3, "compile": compiled, "dtype": "bfloat16"}
    path.mkdir(parents=True)
    torch.save({"model": {prefix + k: v for k, v in source.state_dict().items()}, "optimizer": optimizer.state_dict(),
                "model_args": dict(n_layer=2, n_head=2, n_embd=16, block_size=16, bias=False, vocab_size=65,
                                   dropout=0.0),
                "iter_num": 600, "best_val_loss": torch.tensor(1.4697), "config": config}, path / "ckpt.pt")
    return source


def test_a_checkpoint_as_nanogpt_writes_it_imports(tmp_path, char_data_dir):
    """nanoGPT stores best_val_loss as a 0-d tensor; our checks once refused its checkpoints as 'damaged'."""
    source = nanogpt_train_checkpoint(tmp_path / "ng")
    convert(ConvertConfig(from_nanogpt=str(tmp_path / "ng"), out_dir=str(tmp_path / "ours"), data_dir=char_data_dir))
    model, ckpt = load_model(str(tmp_path / "ours"))
    idx = torch.randint(0, 65, (2, 12))
    assert torch.allclose(model(idx, all_logits=True)[0], source.eval()(idx, all_logits=True)[0], atol=1e-6)


class _RunsCode:
    """A pickle that opens (creates) a file when it is loaded: what a hostile ckpt.pt or meta.pkl can do."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_a_checkpoint_that_runs_code_is_refused_before_it_runs(tmp_path):
    marker = tmp_path / "ran"
    nanogpt_train_checkpoint(tmp_path / "ng")
    ckpt = torch.load(tmp_path / "ng" / "ckpt.pt", weights_only=False)
    ckpt["config"]["hook"] = _RunsCode(str(marker))
    torch.save(ckpt, tmp_path / "ng" / "ckpt.pt")
    with pytest.raises(CheckpointError, match="nothing was run"):
        convert(ConvertConfig(from_nanogpt=str(tmp_path / "ng"), out_dir=str(tmp_path / "ours")))
    assert not marker.exists() and not (tmp_path / "ours").exists()


def test_a_nanolgpt_checkpoint_handed_to_from_nanogpt_is_named_not_misread(tmp_path, trained_dir):
    """--from_nanogpt on one of our own checkpoints (a grown one once ended in a traceback; a plain one would drop
    every setting nanoGPT does not have) is one clear error: it needs no import."""
    with pytest.raises(CheckpointError, match="nanoLGPT checkpoint, not nanoGPT's.*--in_dir=DIR"):
        convert(ConvertConfig(from_nanogpt=trained_dir, out_dir=str(tmp_path / "ours")))
    assert not (tmp_path / "ours").exists()


def test_a_nanogpt_checkpoint_whose_weights_contradict_its_model_args_is_named(tmp_path, char_data_dir):
    nanogpt_train_checkpoint(tmp_path / "ng", compiled=False)
    ckpt = torch.load(tmp_path / "ng" / "ckpt.pt", weights_only=True)
    ckpt["model"]["transformer.h.1.mlp.c_fc.weight"] = torch.zeros(96, 16)
    torch.save(ckpt, tmp_path / "ng" / "ckpt.pt")
    with pytest.raises(CheckpointError, match=r"'transformer.h.1.mlp.c_fc.weight' has shape \(96, 16\)"):
        convert(ConvertConfig(from_nanogpt=str(tmp_path / "ng"), out_dir=str(tmp_path / "ours"),
                              data_dir=char_data_dir))


def test_an_export_never_writes_over_what_it_did_not_make(tmp_path, trained_dir):
    """A folder of the user's files is no export target (with or without --overwrite); the input checkpoint's own
    folder and file are never an output, whatever the flags; nothing is written in any of these cases."""
    user = tmp_path / "user"
    user.mkdir()
    (user / "notes.txt").write_text("precious")
    hf = tmp_path / "someone_elses_hf_model"  # a config.json alone does not make a folder an export of ours
    hf.mkdir()
    for name in ("config.json", "pytorch_model.bin", "README.md"):
        (hf / name).write_text(name)
    for overwrite in (False, True):
        with pytest.raises(ConversionError, match="holds files an export of ours never writes \\(notes.txt\\)"):
            convert(ConvertConfig(in_dir=trained_dir, to_hf=str(user), overwrite=overwrite))
        assert os.listdir(user) == ["notes.txt"]
        with pytest.raises(ConversionError, match="never writes \\(pytorch_model.bin\\) beside a config.json"):
            convert(ConvertConfig(in_dir=trained_dir, to_hf=str(hf), overwrite=overwrite))
        assert sorted(os.listdir(hf)) == ["README.md", "config.json", "pytorch_model.bin"]
    before = sorted(os.listdir(trained_dir))
    with pytest.raises(ConversionError, match="never writes over its input"):
        convert(ConvertConfig(in_dir=trained_dir, to_hf=trained_dir, overwrite=True))
    with pytest.raises(ConversionError, match="never writes over its input"):
        convert(ConvertConfig(in_dir=trained_dir, to_hf=os.path.dirname(trained_dir), overwrite=True))
    with pytest.raises(ConversionError, match="is the input checkpoint"):
        convert(ConvertConfig(in_dir=trained_dir, to_gguf=os.path.join(trained_dir, "ckpt.pt"), overwrite=True))
    assert sorted(os.listdir(trained_dir)) == before


def test_a_failed_gguf_export_removes_only_the_folders_it_made(tmp_path, monkeypatch):
    """os.removedirs once climbed past the folders the export made and removed an empty folder that was there."""
    from lgpt.formats import gguf_file
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=64, bias=False, norm_type="rmsnorm",
                          pos="rope", mlp="swiglu", head="tied"))
    (tmp_path / "existing").mkdir()

    def fail(path, *args, **kwargs):
        open(path, "wb").write(b"half")
        raise OSError("disk full")
    monkeypatch.setattr(gguf_file, "write_gguf", fail)
    monkeypatch.setattr(sys.modules["convert"], "tokenizer_files", lambda meta: {})
    with pytest.raises(OSError, match="disk full"):
        export_gguf(model, None, str(tmp_path / "existing" / "a" / "b" / "m.gguf"))
    assert os.listdir(tmp_path) == ["existing"] and os.listdir(tmp_path / "existing") == []


def test_a_staged_export_stages_inside_its_target(tmp_path):
    """The staging folder lies inside the target, so its files move in without crossing a filesystem (a target
    that is a mount point once ended in a cross-device traceback); a failure removes a target it created."""
    from lgpt.plumbing.checkpoint import staged_dir
    with staged_dir(str(tmp_path / "t"), "config.json") as staging:
        assert os.path.dirname(staging) == str(tmp_path / "t")
        open(os.path.join(staging, "config.json"), "w").write("{}")
    assert os.listdir(tmp_path / "t") == ["config.json"]
    with pytest.raises(RuntimeError), staged_dir(str(tmp_path / "new" / "u"), "config.json"):
        raise RuntimeError("stopped")
    assert os.listdir(tmp_path) == ["t"]


def test_an_overwritten_export_keeps_nothing_of_the_old_one(tmp_path, trained_dir, char_data_dir):
    """--to_hf --overwrite once left the old export's lm_eval/ task beside the new model (lm_eval would score the
    new model on the old data); the new export's own files only, and the user's other files stay."""
    out = tmp_path / "hf"
    convert(ConvertConfig(in_dir=trained_dir, to_hf=str(out), lm_eval_task=True, data_dir=char_data_dir))
    assert (out / "lm_eval").is_dir()
    (out / "README.md").write_text("my notes")  # the user's own file beside the export
    convert(ConvertConfig(in_dir=trained_dir, to_hf=str(out), overwrite=True))
    assert not (out / "lm_eval").exists() and (out / "config.json").exists()
    assert (out / "README.md").read_text() == "my notes"


def test_an_hf_export_that_transformers_reads_as_another_model_is_not_written(tmp_path, trained_dir, monkeypatch):
    """Every export is read back by transformers before it is called done (a writer that changed a weight is
    simulated); one ConversionError and no folder."""
    import convert as convert_module
    real = convert_module.export_hf

    def changed(model, out_dir, special_ids=None):
        arch = real(model, out_dir, special_ids)
        from safetensors.torch import load_file, save_file
        state = load_file(os.path.join(out_dir, "model.safetensors"))
        name = next(k for k in state if k.endswith("mlp.c_fc.weight") or k.endswith("up_proj.weight"))
        state[name] = state[name] + 1.0
        save_file(state, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
        return arch
    monkeypatch.setattr(convert_module, "export_hf", changed)
    with pytest.raises(ConversionError, match="reads back in transformers as another model"):
        convert(ConvertConfig(in_dir=trained_dir, to_hf=str(tmp_path / "hf")))
    assert not (tmp_path / "hf").exists()
