"""Gemma 3 text models in and out (convert_gemma3.py): small random-weight Gemma3ForCausalLM models built here
(weights far from uniform, a sliding window shorter than the inputs), imported and exported exactly against
transformers, and through the transforms."""
import os

import pytest
import torch

from hf_models import VOCAB, assert_logprobs_close, gemma3, hf_logprobs, our_logprobs, save, train_tokenizer

transformers = pytest.importorskip("transformers")

from conftest import spec  # noqa: E402
from convert import ConversionError, ConvertConfig, convert, export_hf, hf_pretrained, model_from_hf_model  # noqa: E402
from lgpt.plumbing.checkpoint import load_model  # noqa: E402

IDX = torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer()


@pytest.mark.parametrize("tied", [True, False])
def test_a_gemma3_model_imports_with_transformers_log_probs(tied):
    theirs = gemma3(tied=tied).eval()
    ours = model_from_hf_model(theirs)
    c = ours.config
    assert (c.norm_placement, c.mlp, c.qk_norm, c.attn_window, c.global_every, c.head_dim) == \
        ("peri", "geglu", True, 6, 2, 32)
    assert c.rope_local_base == 1e4 and c.rope_base == 1e6 and c.attn_scale == pytest.approx(24 ** -0.5)
    assert c.embed_scale == pytest.approx(64 ** 0.5) and c.head == ("tied" if tied else "linear")
    assert_logprobs_close(our_logprobs(ours, IDX), hf_logprobs(theirs, IDX))


def test_the_sliding_window_matters_here():
    """The check above would pass without windows if the inputs were short: these are not."""
    theirs = gemma3().eval()
    ours = model_from_hf_model(theirs)
    for block in ours.transformer.h:
        block.attn.window = 0
    assert (our_logprobs(ours, IDX) - hf_logprobs(theirs, IDX)).abs().max() > 1e-2


def test_export_round_trip_is_exact_and_keeps_the_tokenizer(tokenizer, tmp_path):
    src = save(gemma3(seed=1), tmp_path / "hf", tokenizer)
    convert(ConvertConfig(from_hf=src, out_dir=str(tmp_path / "ours")))
    ours, _ = load_model(str(tmp_path / "ours"))
    convert(ConvertConfig(in_dir=str(tmp_path / "ours"), to_hf=str(tmp_path / "back")))
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "back").eval()
    original = transformers.AutoModelForCausalLM.from_pretrained(src).eval()
    assert type(back).__name__ == "Gemma3ForCausalLM"
    for name, tensor in original.state_dict().items():
        torch.testing.assert_close(back.state_dict()[name], tensor, rtol=0, atol=1e-6)
    assert_logprobs_close(hf_logprobs(back, IDX), hf_logprobs(original, IDX))
    assert os.path.exists(tmp_path / "back" / "tokenizer.json")


def test_a_transformed_gemma3_model_exports_again(tmp_path):
    """A same-architecture transform (here growth by zero padding, kind truncate) keeps every Gemma 3 part, so the
    result exports to Gemma3ForCausalLM, and that export is the transformed model."""
    from lgpt.method.pipeline import transform_model
    ours = model_from_hf_model(gemma3(seed=2).eval())
    grown, record = transform_model(ours, spec(96, kind="truncate"))
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path / "g" if export_hf(grown, str(tmp_path / "g")) else None).eval()
    assert_logprobs_close(hf_logprobs(hf, IDX), our_logprobs(grown, IDX))


def test_the_recommended_gemma3_shrink_exports_as_the_model_it_is(char_data_dir, tmp_path):
    """The dev-chosen −25% recipe (docs/real_models.md: a coordinate selection inside groups of equal output gain,
    the carried lengths fitted on calibration text, the head tied) keeps every Gemma 3 part: the shrunk model exports
    to Gemma3ForCausalLM, and transformers computes what we compute."""
    from lgpt.method.pipeline import transform_model
    from lgpt.plumbing.dataset import BatchLoader
    ours = model_from_hf_model(gemma3(seed=7, vocab=65).eval())
    ours.config.block_size = 16
    loader = BatchLoader(char_data_dir, 16, 4, "cpu")
    small, record = transform_model(ours, spec(48, kind="pca", calib_batches=2, tie_head=True, tie_keep=4,
                                              output_gains="carry", gain_groups=64, fit_lengths=2), loader)
    assert small.lm_head.weight is small.transformer.wte.weight and small.config.n_embd == 48
    x = torch.randint(0, 65, (2, 16), generator=torch.Generator().manual_seed(1))
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path / "g" if export_hf(small, str(tmp_path / "g")) else None).eval()
    assert hf.config.hidden_size == 48
    assert_logprobs_close(hf_logprobs(hf, x), our_logprobs(small, x))


def test_the_input_scale_moves_to_the_new_width_without_changing_the_model():
    """porting.rescale_tied_input: a tied model of width m with the input scale √d computes the same log-probs with
    √m once E and the final gain are rescaled (what a retied head needs before Gemma's export)."""
    import copy
    import math

    from lgpt.method.porting import rescale_tied_input
    model = model_from_hf_model(gemma3(seed=3, vocab=65).eval())
    d = 100  # as if it came from a width-100 source: its input scale √100
    model.config.embed_scale = math.sqrt(d)
    moved = copy.deepcopy(model)
    rescale_tied_input(moved, d)
    x = torch.randint(0, 65, (2, 16), generator=torch.Generator().manual_seed(2))
    assert moved.config.embed_scale == math.sqrt(model.config.n_embd) != model.config.embed_scale
    assert moved.lm_head.weight is moved.transformer.wte.weight
    assert_logprobs_close(our_logprobs(moved, x), our_logprobs(model, x))
    untouched = copy.deepcopy(moved)
    rescale_tied_input(untouched, d)  # already at √m: nothing to do
    assert torch.equal(untouched.transformer.wte.weight, moved.transformer.wte.weight)


@pytest.mark.parametrize("field, value, words", [
    ("final_logit_softcapping", 30.0, "soft-capping"),
    ("use_bidirectional_attention", True, "use_bidirectional_attention"),
    ("window", None, "names sliding-window blocks but sliding_window is None"),
])
def test_what_gemma3_import_refuses(field, value, words):
    with pytest.raises(ConversionError, match=words):
        model_from_hf_model(gemma3(**{field: value}))


def test_a_layer_pattern_of_another_shape_is_refused():
    model = gemma3()
    model.config.layer_types = ["full_attention", "sliding_attention", "sliding_attention", "full_attention"]
    with pytest.raises(ConversionError, match="not every k-th block"):
        model_from_hf_model(model)


def test_gemma3_directories_import_through_the_cli(tokenizer, tmp_path):
    src = save(gemma3(seed=3), tmp_path / "hf", tokenizer)
    ours, arch = hf_pretrained(src)
    assert arch == "Gemma3ForCausalLM"
    theirs = transformers.AutoModelForCausalLM.from_pretrained(src).eval()
    assert_logprobs_close(our_logprobs(ours, IDX), hf_logprobs(theirs, IDX))


def test_growth_by_zero_padding_or_split_is_exact_and_a_rotation_is_not():
    """Peri-LN output norms write γ ⊙ n(y) to the residual directly: carried through T exactly only where
    Tᵀ·diag(a)·T = diag(1/γ²) has a solution. kind='truncate' at m > d (zero padding) and kind='split' (rows that
    mix two coordinates) keep every Gemma 3 part exact — output gains, QK-norm (per head, untouched), the
    embedding scale; a dense orthogonal T cannot, and says so, carried or averaged."""
    from lgpt.method.pipeline import transform_model
    ours = model_from_hf_model(gemma3(seed=4).eval())
    with torch.no_grad():  # output gains far from equal, as in the real model
        for name, p in ours.named_parameters():
            if name.endswith("_out.weight"):
                p.copy_(torch.rand(p.shape, generator=torch.Generator().manual_seed(len(name))) * 4 + 0.1)
    reference = our_logprobs(ours, IDX)
    for kind in ("truncate", "split"):
        grown, record = transform_model(ours, spec(80, kind=kind))
        assert record["exact"] and not any(n.startswith("APPROX") for n in record["notes"]), kind
        assert_logprobs_close(our_logprobs(grown, IDX), reference, rel=1e-4)
        T = record["T"]
        assert torch.allclose(T.T @ T, torch.eye(64), atol=1e-6)
    assert int(((T != 0).sum(1) > 1).sum()) == 2 * 16  # split: 32 rows read two coordinates (not a coordinate map)
    for output_gains in ("carry", "average"):
        rotated, record = transform_model(ours, spec(80, kind="orthogonal", output_gains=output_gains))
        assert not record["exact"] and any(n.startswith("APPROXIMATE: peri-LN output") for n in record["notes"])


def test_the_recipes_run_on_gemma3(char_data_dir):
    """PCA shrink with the refit, per-block maps, head and MLP growth: each runs on a Gemma 3 model and keeps a
    finite model (the sandwich rules are refused: QK-norm belongs to the head size they change)."""
    from lgpt.method.pipeline import transform_model
    from lgpt.plumbing.dataset import BatchLoader
    from lgpt.plumbing.errors import TransformError
    ours = model_from_hf_model(gemma3(seed=5, vocab=65).eval())
    ours.config.block_size = 16
    loader = BatchLoader(char_data_dir, 16, 4, "cpu")
    x = torch.randint(0, 65, (2, 16))
    for options in (dict(width=48, kind="pca", refit="all"), dict(width=48, kind="pca", porting="per_block"),
                    dict(width=96, kind="orthogonal", n_head=8, mlp_hidden=256),
                    dict(width=48, kind="pca", tie_head=True)):
        new, _ = transform_model(ours, spec(calib_batches=2, **options), loader)
        assert torch.isfinite(our_logprobs(new, x)).all(), options
    mha = model_from_hf_model(gemma3(seed=5, n_kv_head=4, head_dim=16).eval())  # square attention: only QK-norm
    with pytest.raises(TransformError, match="per-head QK-norm gains belong to its head size"):
        transform_model(mha, spec(48, kind="gaussian", porting="sandwich"))


# ----------------------------------------------------------------------------------------------
# GGUF (gguf_format.py): llama.cpp's gemma3 layout, SentencePiece tokenizer

GGUF_TEXT = "ROMEO: But, soft! what light through yonder window breaks?  Two  spaces — and é."


def gguf_ready_gemma3(seed: int, **kw):
    """A Gemma 3 that llama.cpp's fixed values describe (every 6th block global, local base 10,000, attention
    scale 1/√head_dim) and transformers' GGUF reader too (it assumes query_pre_attn_scalar = 256, so head_dim is
    256 as in the 270M and 1B models), with a 640-token vocabulary for the Gemma-style tokenizer."""
    return gemma3(layers=6, global_every=6, head_dim=256, pre_attn_scalar=256, vocab=640, seed=seed, **kw)


@pytest.mark.parametrize("tied", [True, False])
def test_gemma3_gguf_is_read_by_transformers_and_by_us_as_the_same_model_and_tokenizer(tied, tmp_path):
    pytest.importorskip("gguf")
    from hf_models import train_gemma_tokenizer
    from lgpt.plumbing.dataset import Tokenizer
    tokenizer = train_gemma_tokenizer()
    original = gguf_ready_gemma3(seed=4, tied=tied)
    src = save(original, tmp_path / "hf", tokenizer)
    convert(ConvertConfig(from_hf=src, out_dir=str(tmp_path / "ours")))
    path = tmp_path / "gguf" / "model.gguf"
    convert(ConvertConfig(in_dir=str(tmp_path / "ours"), to_gguf=str(path)))
    idx = torch.randint(0, 640, (2, 16), generator=torch.Generator().manual_seed(1))
    theirs = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name).eval()
    assert type(theirs).__name__ == "Gemma3ForCausalLM"
    assert_logprobs_close(hf_logprobs(theirs, idx), hf_logprobs(original.eval(), idx))
    convert(ConvertConfig(from_gguf=str(path), out_dir=str(tmp_path / "back")))
    back, ckpt = load_model(str(tmp_path / "back"))
    assert back.config.global_every == 6 and back.config.qk_norm and back.config.head == ("tied" if tied else "linear")
    assert_logprobs_close(our_logprobs(back, idx), hf_logprobs(original.eval(), idx))
    ids = tokenizer.encode(GGUF_TEXT, add_special_tokens=False)
    assert Tokenizer(ckpt["meta"]).encode(GGUF_TEXT) == ids and Tokenizer(ckpt["meta"]).decode(ids) == GGUF_TEXT
    reread = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    assert reread.encode(GGUF_TEXT, add_special_tokens=False) == ids
    from lgpt.formats.gguf_file import _field, open_reader
    reader = open_reader(str(path))  # llama.cpp would otherwise put a space before the text (SentencePiece's default)
    assert _field(reader, "tokenizer.ggml.model") == "llama"
    assert _field(reader, "tokenizer.ggml.add_space_prefix") is False
    assert _field(reader, "tokenizer.ggml.token_type")[5] == 6  # <0x00>: a byte token


def test_a_gemma3_gguf_keeps_another_layer_pattern_for_readers_that_read_it(tmp_path, capsys):
    """Every 2nd block global and our own local base: written to gemma3.attention.sliding_window_pattern and
    gemma3.rope.freq_base_swa (our reader gets the model back exactly), with a warning that llama.cpp's fixed
    values are what readers ignoring those keys assume."""
    pytest.importorskip("gguf")
    from hf_models import train_gemma_tokenizer
    original = gemma3(layers=4, pre_attn_scalar=32, vocab=640, seed=5)  # global_every = 2
    src = save(original, tmp_path / "hf", train_gemma_tokenizer())
    convert(ConvertConfig(from_hf=src, out_dir=str(tmp_path / "ours")))
    capsys.readouterr()
    convert(ConvertConfig(in_dir=str(tmp_path / "ours"), to_gguf=str(tmp_path / "m.gguf")))
    assert "sliding_window_pattern" in capsys.readouterr().err
    convert(ConvertConfig(from_gguf=str(tmp_path / "m.gguf"), out_dir=str(tmp_path / "back")))
    back, _ = load_model(str(tmp_path / "back"))
    idx = torch.randint(0, 640, (2, 16), generator=torch.Generator().manual_seed(2))
    assert back.config.global_every == 2
    assert_logprobs_close(our_logprobs(back, idx), hf_logprobs(original.eval(), idx))


def test_a_gemma3_attention_scale_a_gguf_cannot_say_is_refused_before_writing(tmp_path, capsys):
    pytest.importorskip("gguf")
    import importlib

    from hf_models import train_gemma_tokenizer
    from lgpt.plumbing.cli import run_cli
    src = save(gemma3(vocab=640, seed=6), tmp_path / "hf", train_gemma_tokenizer())  # query_pre_attn_scalar 24
    convert(ConvertConfig(from_hf=src, out_dir=str(tmp_path / "ours")))
    capsys.readouterr()
    rc = run_cli(importlib.import_module("convert").main, [f"--in_dir={tmp_path / 'ours'}",
                                                          f"--to_gguf={tmp_path / 'm.gguf'}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and len(err) == 1 and "1/√head_dim" in err[0] and "--to_hf" in err[0], err
    assert not (tmp_path / "m.gguf").exists()
