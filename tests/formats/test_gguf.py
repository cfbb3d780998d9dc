"""GGUF in and out (gguf_format.py; convert.py --from_gguf / --to_gguf), against transformers' own GGUF reader.

Every model is a small Llama / Qwen2 built here with far-from-uniform weights and a BPE tokenizer trained here:
our export must load in transformers with our log-probs and our tokenization, our import of a file must equal
transformers' import of the same file, and a round trip through f32 must give back the same weights bit for bit.
The real model (SmolLM2-135M, fetched by fetch.py) is tested in tests/formats/test_real_model.py.
"""
import importlib
import os

import numpy as np
import pytest
import torch

from conftest import spec
from hf_models import assert_logprobs_close, hf_logprobs, llama, our_logprobs, save, train_tokenizer
from lgpt.plumbing.checkpoint import load_model
from lgpt.plumbing.cli import run_cli
from lgpt.plumbing.dataset import Tokenizer

transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

from convert import ConversionError, ConvertConfig, convert  # noqa: E402
from lgpt.formats.gguf_file import interleave_rope_rows, read_gguf, uninterleave_rope_rows  # noqa: E402

VARIANTS = {
    "llama_gqa": dict(n_head=8, n_kv_head=2),
    "llama_tied_mha": dict(n_head=4, n_kv_head=4, tied=True),
    "qwen2_biases": dict(n_head=8, n_kv_head=2, qwen2=True),
    "qwen2_tied_mqa": dict(n_head=4, n_kv_head=1, qwen2=True, tied=True),
}
TEXT = "First Citizen:\nBefore we proceed any further, hear me speak. </s> All: Speak, speak!"


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer()


@pytest.fixture(scope="module")
def idx():
    return torch.randint(0, 320, (2, 64), generator=torch.Generator().manual_seed(3))


@pytest.fixture(scope="module")
def ours(tokenizer, tmp_path_factory):
    """Our checkpoint of each variant (imported from its Hugging Face directory, tokenizer kept)."""
    out = {}
    for name, kwargs in VARIANTS.items():
        base = tmp_path_factory.mktemp(name)
        src = save(llama(**kwargs), base / "hf", tokenizer)
        convert(ConvertConfig(from_hf=src, out_dir=str(base / "ours")))
        out[name] = str(base / "ours")
    return out


def transformers_gguf(path: str):
    """(model, tokenizer) as transformers reads a GGUF file (its own reader, not ours)."""
    folder, name = os.path.dirname(path), os.path.basename(path)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()
    return model, transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)


def test_rope_interleaving_is_llama_cpps_permutation_and_its_inverse():
    """llama.cpp's convert: reshape(n_head, 2, hd/2, …).swapaxes(1, 2); ours must equal it and invert exactly,
    and equal our own RoPE pair order (row 2i + a ← row a·hd/2 + i)."""
    from lgpt.formats.llama import permute_head_rows, rope_pair_order
    W = torch.randn(3 * 8, 5)
    reference = torch.from_numpy(W.numpy().reshape(3, 2, 4, 5).swapaxes(1, 2).reshape(W.shape))
    assert torch.equal(interleave_rope_rows(W, 3), reference)
    assert torch.equal(uninterleave_rope_rows(interleave_rope_rows(W, 3), 3), W)
    assert torch.equal(interleave_rope_rows(W, 3), permute_head_rows(W, 8, rope_pair_order(8)))


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_export_loads_in_transformers_with_our_logprobs_and_tokens(name, ours, idx, tmp_path):
    path = str(tmp_path / "model.gguf")
    convert(ConvertConfig(in_dir=ours[name], to_gguf=path))
    model, ckpt = load_model(ours[name])
    theirs, their_tokenizer = transformers_gguf(path)
    assert type(theirs).__name__ == ckpt["config"]["hf_architecture"]
    assert_logprobs_close(hf_logprobs(theirs, idx), our_logprobs(model, idx))
    assert their_tokenizer(TEXT, add_special_tokens=False)["input_ids"] == Tokenizer(ckpt["meta"]).encode(TEXT)


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_f32_round_trip_gives_back_every_weight_bit_for_bit(name, ours, tmp_path):
    path = str(tmp_path / "model.gguf")
    convert(ConvertConfig(in_dir=ours[name], to_gguf=path))
    convert(ConvertConfig(from_gguf=path, out_dir=str(tmp_path / "back")))
    (a, ca), (b, cb) = load_model(ours[name]), load_model(str(tmp_path / "back"))
    assert a.config.to_dict() == dict(b.config.to_dict(), block_size=a.config.block_size)
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    assert Tokenizer(cb["meta"]).encode(TEXT) == Tokenizer(ca["meta"]).encode(TEXT)
    assert cb["meta"]["special_ids"] == ca["meta"]["special_ids"]


@pytest.mark.parametrize("dtype", ["f16", "q8_0"])
def test_quantized_exports_read_the_same_by_us_and_by_transformers(dtype, ours, idx, tmp_path):
    """Our dequantization of a file equals transformers' (both read the same file), and the file is close to the
    float model: f16 to 1e-3, Q8_0 to 1% of each weight's norm."""
    path = str(tmp_path / f"model-{dtype}.gguf")
    convert(ConvertConfig(in_dir=ours["llama_gqa"], to_gguf=path, gguf_type=dtype))
    convert(ConvertConfig(from_gguf=path, out_dir=str(tmp_path / "back")))
    back, _ = load_model(str(tmp_path / "back"))
    theirs, _ = transformers_gguf(path)
    assert_logprobs_close(hf_logprobs(theirs, idx), our_logprobs(back, idx))
    original = load_model(ours["llama_gqa"])[0].state_dict()
    tolerance = 1e-3 if dtype == "f16" else 1e-2
    for k, W in back.state_dict().items():
        assert (W - original[k]).norm() <= tolerance * original[k].norm(), k
    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(path).tensors}
    assert types["blk.0.ffn_up.weight"] == dtype.upper() and types["blk.0.attn_norm.weight"] == "F32"


def test_a_shrunk_model_exports_and_transformers_reads_its_head_size(ours, idx, tmp_path):
    """A PCA shrink keeps head_dim while d changes (head_dim ≠ m / n_head): the GGUF says so and transformers
    loads it with our log-probs."""
    from lgpt.method.pipeline import transform_model
    model, ckpt = load_model(ours["llama_gqa"])
    data = tmp_path / "data"
    from hf_models import shakespeare_text
    from lgpt.plumbing.dataset import BatchLoader, prepare_text
    prepare_text(shakespeare_text()[:50_000], str(data), ckpt["meta"])
    small, _ = transform_model(model, spec(48, kind="pca", calib_batches=2), BatchLoader(str(data), 32, 4, "cpu"))
    assert small.config.head_dim * small.config.n_head != small.config.n_embd
    from lgpt.plumbing.checkpoint import save_checkpoint
    save_checkpoint({"model": small.state_dict(), "model_args": small.config.to_dict(), "config": {}, "iter_num": 0,
                     "best_val_loss": float("inf"), "optimizer": None, "meta": ckpt["meta"]}, str(tmp_path / "small"))
    path = str(tmp_path / "small.gguf")
    convert(ConvertConfig(in_dir=str(tmp_path / "small"), to_gguf=path))
    theirs, _ = transformers_gguf(path)
    assert theirs.config.hidden_size == 48 and theirs.config.head_dim == small.config.head_dim
    assert_logprobs_close(hf_logprobs(theirs, idx), our_logprobs(small, idx))


# ----------------------------------------------------------------------------------------------
# Bad GGUF input: one clear line, a non-zero exit, nothing written


def write_file(path: str, arch: str = "llama", drop: str = "", tensors: dict | None = None,
               claims: dict | None = None, key_length: int = 0) -> str:
    """A minimal GGUF (one block, d = 8) written with the gguf package; ``drop`` leaves one tensor out; ``claims``
    writes other values for header fields (a uint64 for an int, a string for a str)."""
    writer = gguf.GGUFWriter(path, arch)
    for key, value in (("context_length", 16), ("embedding_length", 8), ("block_count", 1),
                       ("feed_forward_length", 16), ("head_count", 2), ("head_count_kv", 2)):
        if claims and key in claims:
            field = f"{arch}.{'attention.' if key.startswith('head_count') else ''}{key}"
            value = claims[key]
            writer.add_string(field, value) if isinstance(value, str) else writer.add_uint64(field, value)
        else:
            getattr(writer, f"add_{key}")(value)
    writer.add_layer_norm_rms_eps(1e-5)
    if key_length:  # each value in bounds, their product (the RoPE tables) not
        writer.add_key_length(key_length)
        writer.add_value_length(key_length)
        writer.add_rope_dimension_count(key_length)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list([chr(97 + i) for i in range(12)])
    names = tensors or {"token_embd.weight": (12, 8), "output_norm.weight": (8,), "blk.0.attn_norm.weight": (8,),
                        "blk.0.ffn_norm.weight": (8,), "blk.0.attn_q.weight": (8, 8), "blk.0.attn_k.weight": (8, 8),
                        "blk.0.attn_v.weight": (8, 8), "blk.0.attn_output.weight": (8, 8),
                        "blk.0.ffn_gate.weight": (16, 8), "blk.0.ffn_up.weight": (16, 8),
                        "blk.0.ffn_down.weight": (8, 16)}
    for name, shape in names.items():
        if name != drop:
            writer.add_tensor(name, np.ones(shape, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def truncated(path: str) -> str:
    with open(path, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(data[: len(data) // 2])
    return path


BAD_IMPORTS = {  # name: (make the file in tmp_path, words the error must hold)
    "truncated": (lambda p: truncated(write_file(str(p / "m.gguf"))), ["not a readable GGUF", "truncated"]),
    "not_gguf": (lambda p: (p / "m.gguf").write_text("hello") and str(p / "m.gguf"), ["not a readable GGUF"]),
    "unknown_architecture": (lambda p: write_file(str(p / "m.gguf"), arch="falcon"),
                             ["architecture 'falcon'", "llama, qwen2"]),
    "tensor_missing": (lambda p: write_file(str(p / "m.gguf"), drop="blk.0.ffn_up.weight"),
                       ["lacks the tensor blk.0.ffn_up.weight"]),
    "foreign_tensor": (lambda p: write_file(str(p / "m.gguf"), tensors={"blk.0.ssm_a": (8,)}),
                       ["tensors a LlamaForCausalLM does not have", "blk.0.ssm_a"]),
    "no_such_file": (lambda p: str(p / "absent.gguf"), ["no such file"]),
    # a header's claims are bounded before anything is allocated from them (a 175 KB file once grew past 14 GB)
    "huge_context": (lambda p: write_file(str(p / "m.gguf"), claims={"context_length": 2 ** 40}),
                     ["llama.context_length = '1099511627776'", "is not an integer in [1, 1.04858e+06]"]),
    "zero_heads": (lambda p: write_file(str(p / "m.gguf"), claims={"head_count": 0}),
                   ["llama.attention.head_count = '0'", "not an integer"]),
    "text_for_a_number": (lambda p: write_file(str(p / "m.gguf"), claims={"embedding_length": "eight"}),
                          ["llama.embedding_length = 'eight'"]),
    "huge_rope_tables": (lambda p: write_file(str(p / "m.gguf"), claims={"context_length": 2 ** 20},
                                              key_length=65536),
                         ["context_length × key_length (the RoPE tables)", "more than"]),
}


@pytest.mark.parametrize("case", sorted(BAD_IMPORTS))
def test_bad_gguf_files_are_refused_in_one_line_and_nothing_is_written(case, tmp_path, capsys):
    make, words = BAD_IMPORTS[case]
    path = make(tmp_path)
    before = open(path, "rb").read() if os.path.exists(path) else None
    out = tmp_path / "out"
    rc = run_cli(importlib.import_module("convert").main, [f"--from_gguf={path}", f"--out_dir={out}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc != 0 and not out.exists()
    assert len(err) == 1 and err[0].startswith("error:") and all(w in err[0] for w in words), err
    assert (open(path, "rb").read() if os.path.exists(path) else None) == before


def test_exports_gguf_cannot_hold_are_refused_before_anything_is_written(ours, tmp_path, capsys):
    existing = tmp_path / "exists.gguf"
    existing.write_bytes(b"keep me")
    cases = [([f"--in_dir={ours['llama_gqa']}", f"--to_gguf={existing}"], ["already exists", "--overwrite=True"]),
             ([f"--in_dir={ours['llama_gqa']}", f"--to_gguf={tmp_path}"], ["is a directory"]),
             ([f"--in_dir={ours['llama_gqa']}", f"--to_gguf={tmp_path / 'new.gguf'}/"], ["is a directory path"]),
             ([f"--in_dir={ours['llama_gqa']}", f"--to_gguf={tmp_path / 'x.gguf'}", "--gguf_type=q4_0"],
              ["--gguf_type='q4_0'"])]
    for argv, words in cases:
        rc = run_cli(importlib.import_module("convert").main, argv)
        err = capsys.readouterr().err.strip().splitlines()
        assert rc != 0 and len(err) == 1 and all(w in err[0] for w in words), err
    assert existing.read_bytes() == b"keep me" and sorted(os.listdir(tmp_path)) == ["exists.gguf"]


def test_a_character_model_is_refused_with_the_reason(trained_dir, tmp_path, capsys):
    path = tmp_path / "sub" / "char.gguf"
    rc = run_cli(importlib.import_module("convert").main, [f"--in_dir={trained_dir}", f"--to_gguf={path}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc != 0 and len(err) == 1 and "character-level" in err[0] and "--to_hf" in err[0], err
    assert not (tmp_path / "sub").exists()


def test_read_gguf_names_a_shape_that_contradicts_the_metadata(tmp_path):
    shapes = {"token_embd.weight": (12, 8), "output_norm.weight": (8,), "blk.0.attn_norm.weight": (8,),
              "blk.0.ffn_norm.weight": (8,), "blk.0.attn_q.weight": (8, 8), "blk.0.attn_k.weight": (8, 8),
              "blk.0.attn_v.weight": (8, 8), "blk.0.attn_output.weight": (8, 8), "blk.0.ffn_gate.weight": (16, 8),
              "blk.0.ffn_up.weight": (12, 8), "blk.0.ffn_down.weight": (8, 16)}
    with pytest.raises(ConversionError, match="blk.0.ffn_up.weight has shape"):
        read_gguf(write_file(str(tmp_path / "m.gguf"), tensors=shapes))


def test_a_weight_float16_cannot_hold_is_refused_not_written_as_inf(ours, tmp_path, capsys):
    """--gguf_type=f16 once wrote inf for a finite weight beyond 65504; f32 holds it and reads back finite."""
    from lgpt.plumbing.checkpoint import load_checkpoint, save_checkpoint
    ckpt = load_checkpoint(ours["llama_gqa"])
    ckpt["model"]["transformer.h.0.mlp.c_proj.weight"][0, 0] = 1e5
    save_checkpoint(ckpt, str(tmp_path / "big"))
    rc = run_cli(importlib.import_module("convert").main,
                 [f"--in_dir={tmp_path / 'big'}", f"--to_gguf={tmp_path / 'big.gguf'}", "--gguf_type=f16"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc != 0 and len(err) == 1 and "magnitude 1e+05" in err[0] and "--gguf_type=f32" in err[0], err
    assert not (tmp_path / "big.gguf").exists()
    convert(ConvertConfig(in_dir=str(tmp_path / "big"), to_gguf=str(tmp_path / "big32.gguf")))
    state = read_gguf(str(tmp_path / "big32.gguf")).hf_state
    assert all(torch.isfinite(w).all() for w in state.values())
    assert state["model.layers.0.mlp.down_proj.weight"].abs().max() == 1e5


def test_a_tokenizer_whose_merges_hold_a_space_is_refused():
    """GGUF writes a merge as 'left right'; a token with a space inside once exported with exit 0 into a file no
    reader could split back."""
    import json

    from lgpt.formats.gguf_file import tokenizer_fields
    spec = {"model": {"type": "BPE", "vocab": {"a": 0, "b c": 1, "ab c": 2}, "merges": [["a", "b c"]]}}
    with pytest.raises(ConversionError, match=r"merge 0 .* holding a space"):
        tokenizer_fields({"tokenizer.json": json.dumps(spec)}, {}, 3)
    spec["model"]["vocab"] = {"a": 0, "b": 1, "ab": 2}
    spec["model"]["merges"] = [["a", "b"]]
    assert tokenizer_fields({"tokenizer.json": json.dumps(spec)}, {}, 3)["merges"] == ["a b"]


def test_an_import_reads_only_the_gguf_file_it_was_given(ours, tmp_path):
    """A tokenizer_config.json lying beside the file once leaked into the imported tokenizer (transformers reads
    the whole folder); the import is the same whatever else is in that folder."""
    from lgpt.plumbing.checkpoint import load_checkpoint
    (tmp_path / "f").mkdir()
    path = tmp_path / "f" / "m.gguf"
    convert(ConvertConfig(in_dir=ours["llama_gqa"], to_gguf=str(path)))
    convert(ConvertConfig(from_gguf=str(path), out_dir=str(tmp_path / "clean")))
    (tmp_path / "f" / "tokenizer_config.json").write_text('{"chat_template": "LEAKED", "bos_token": "a"}')
    convert(ConvertConfig(from_gguf=str(path), out_dir=str(tmp_path / "beside")))
    clean, beside = load_checkpoint(str(tmp_path / "clean"))["meta"], load_checkpoint(str(tmp_path / "beside"))["meta"]
    assert "LEAKED" not in str(beside) and beside == clean


def test_an_export_that_does_not_read_back_is_refused_and_not_written(ours, tmp_path, monkeypatch):
    """Every export is read back before it is called done: a writer that stored one tensor wrong (simulated) ends
    in one ConversionError naming it, and no file."""
    from lgpt.formats import gguf_file
    real = gguf_file.storage

    def wrong(W, dtype, name="a tensor"):
        data, qtype = real(W, dtype, name)
        return (data * 0 + 1 if name == "blk.0.ffn_up.weight" else data), qtype
    monkeypatch.setattr(gguf_file, "storage", wrong)
    with pytest.raises(ConversionError, match="reads back model.layers.0.mlp.up_proj.weight changed"):
        convert(ConvertConfig(in_dir=ours["llama_gqa"], to_gguf=str(tmp_path / "m.gguf")))
    assert os.listdir(tmp_path) == []


def test_the_reader_is_reused_for_the_same_file_and_never_for_a_changed_one(tmp_path):
    """open_reader parses a file once (a big vocabulary costs ~30 s a parse) but reads a file written again."""
    from lgpt.formats.gguf_file import open_reader
    path = write_file(str(tmp_path / "a.gguf"))
    first = open_reader(path)
    assert open_reader(path) is first
    os.replace(write_file(str(tmp_path / "b.gguf"), claims={"block_count": 3}), path)  # another file, same name
    again = open_reader(path)
    assert again is not first and again.fields["llama.block_count"].contents() == 3
    assert open_reader(write_file(str(tmp_path / "c.gguf"))) is not again
