"""llama.cpp where users serve a model (lgpt/formats/llama_cpp.py; convert.py --to_gguf --gguf_type=Q4_K_M …).

Without llama-cpp-python: the loss arithmetic against a naive version (a stand-in that returns our model's logits),
the row-length rule, and the one-line refusals, nothing written. With it (pip install llama-cpp-python): a model of
width 40 padded to 64 runs in llama.cpp with our log-probs, and its quantized files hold what the types say.
"""
import importlib
import os
import sys

import numpy as np
import pytest
import torch

from hf_models import llama, save, train_tokenizer
from lgpt.formats import llama_cpp as lcpp
from lgpt.plumbing.cli import run_cli
from lgpt.plumbing.errors import ConversionError
from model import GPTConfig

transformers = pytest.importorskip("transformers")
pytest.importorskip("gguf")

from convert import ConvertConfig, convert  # noqa: E402


class OurModelAsLlama:
    """llama-cpp-python's Llama surface that window_losses uses (reset, eval, scores), over our own model."""

    def __init__(self, model):
        self.model, self.scores = model, None

    def reset(self):
        self.scores = None

    def eval(self, tokens):
        with torch.no_grad():
            self.scores = self.model(torch.tensor(np.array([tokens])), all_logits=True)[0][0].numpy()


def test_window_losses_is_the_mean_next_token_cross_entropy_of_each_window():
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "method"))
    from test_transform import random_model
    model = random_model(3)
    rng = np.random.default_rng(0)
    stream = rng.integers(0, 11, 4 * 8 + 1)
    windows = [(stream[i:i + 8], stream[i + 1:i + 9]) for i in range(0, 32, 8)]
    got = lcpp.window_losses(OurModelAsLlama(model), windows)
    with torch.no_grad():
        naive = [torch.nn.functional.cross_entropy(model(torch.tensor(np.array([x])), all_logits=True)[0][0],
                                                   torch.tensor(y)).item() for x, y in windows]
    np.testing.assert_allclose(got, naive, rtol=0, atol=1e-6)


def test_log_softmax_is_torchs():
    x = np.random.default_rng(1).normal(size=(3, 50)).astype(np.float32) * 30
    np.testing.assert_allclose(lcpp.log_softmax(x), torch.tensor(x).double().log_softmax(-1).numpy(), atol=1e-12)


def config(**kw) -> GPTConfig:
    return GPTConfig(**dict(dict(n_layer=1, n_head=4, head_dim=8, n_embd=64, mlp_hidden=96, vocab_size=10), **kw))


@pytest.mark.parametrize("kw,kind,words", [
    (dict(n_embd=432), "Q8_0", ["residual width is 432", "--pad_width=32", "448"]),
    (dict(n_embd=432), "Q4_0", ["--pad_width=32"]),
    (dict(head_dim=10), "Q8_0", ["inner width", "40", "K-quant"]),
    (dict(mlp_hidden=112), "IQ4_NL", ["hidden width is 112"])])
def test_a_32_block_type_refuses_rows_it_cannot_block_and_names_the_fix(kw, kind, words):
    with pytest.raises(ConversionError) as e:
        lcpp.check_quantizable(config(**kw), kind)
    assert all(w in str(e.value) for w in words), str(e.value)


@pytest.mark.parametrize("kind", ["Q4_K_M", "Q2_K", "F16"])
def test_k_quants_and_f16_take_any_width_since_llama_cpp_falls_back(kind):
    lcpp.check_quantizable(config(n_embd=432, mlp_hidden=112), kind)


def test_padded_width_is_the_next_multiple_of_32():
    assert [lcpp.padded_width(w) for w in (32, 33, 432, 448, 288)] == [32, 64, 448, 448, 288]


@pytest.fixture(scope="module")
def narrow(tmp_path_factory):
    """Our checkpoint of a Llama of width 40 (not a multiple of 32), attention 4 × 8 and MLP 96 wide."""
    base = tmp_path_factory.mktemp("narrow")
    src = save(llama(hidden=40, n_head=4, n_kv_head=2, head_dim=8), base / "hf", train_tokenizer())
    convert(ConvertConfig(from_hf=src, out_dir=str(base / "ours")))
    return str(base / "ours")


def test_quantized_exports_are_refused_in_one_line_and_nothing_is_written(narrow, tmp_path, capsys, monkeypatch):
    main = importlib.import_module("convert").main
    cases = [([f"--to_gguf={tmp_path / 'a.gguf'}", "--gguf_type=Q8_0"], ["--pad_width=32"]),
             ([f"--to_gguf={tmp_path / 'b.gguf'}", "--gguf_type=q4_k_m"], ["llama.cpp's", "Q4_K_M"]),
             ([f"--to_hf={tmp_path / 'c'}", "--pad_width=32"], ["with --to_gguf"])]
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # as without llama-cpp-python: its import fails
    cases.append(([f"--to_gguf={tmp_path / 'd.gguf'}", "--gguf_type=Q4_K_M", "--pad_width=32"],
                  ["pip install llama-cpp-python"]))
    for argv, words in cases:
        rc = run_cli(main, [f"--in_dir={narrow}", *argv])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc != 0 and len(err) == 1 and all(w in err[0] for w in words), err
    assert os.listdir(tmp_path) == []


def our_window_losses(model_dir: str, windows) -> np.ndarray:
    from lgpt.plumbing.checkpoint import load_model
    return lcpp.window_losses(OurModelAsLlama(load_model(model_dir)[0].eval()), windows)


@pytest.fixture(scope="module")
def windows():
    stream = np.random.default_rng(2).integers(2, 320, 4 * 32 + 1)
    return [(stream[i:i + 32], stream[i + 1:i + 33]) for i in range(0, 128, 32)]


def test_llama_cpp_reads_a_padded_export_as_our_model(narrow, tmp_path, windows):
    pytest.importorskip("llama_cpp")
    path = str(tmp_path / "f32.gguf")
    convert(ConvertConfig(in_dir=narrow, to_gguf=path, gguf_type="f32", pad_width=32))
    theirs = lcpp.window_losses(lcpp.load(path, 32, threads=1, logits_all=True, f32_cache=True), windows)
    np.testing.assert_allclose(theirs, our_window_losses(narrow, windows), rtol=0, atol=2e-4)
    mix = lcpp.tensor_mix(path)
    assert set(mix["types"]) == {"F32"} and mix["bytes"] == os.path.getsize(path)


@pytest.mark.parametrize("kind,held,within", [("Q8_0", "Q8_0", 0.05), ("Q4_0", "Q4_0", 0.3),
                                              ("Q4_K_M", "Q5_0", 0.3)])
def test_llama_cpps_quantizer_writes_the_type_and_the_loss_moves_as_much_as_its_bits(narrow, tmp_path, windows,
                                                                                      kind, held, within):
    """Q8_0 (and the F16 KV cache) stays within 0.05 nats of the float model, 4-bit types within 0.3; at width 64
    the K-quant falls back to Q5_0 on rows of 64 (llama.cpp's rule), so the file holds mostly Q5_0."""
    pytest.importorskip("llama_cpp")
    path = str(tmp_path / f"{kind}.gguf")
    convert(ConvertConfig(in_dir=narrow, to_gguf=path, gguf_type=kind, pad_width=32))
    mix = lcpp.tensor_mix(path)
    assert held in mix["types"], mix
    theirs = lcpp.window_losses(lcpp.load(path, 32, threads=1, logits_all=True), windows)
    gap = float(np.abs(theirs - our_window_losses(narrow, windows)).max())
    assert 0 < gap < within, gap
    assert not any(name.endswith(".partial") or ".f32-" in name for name in os.listdir(tmp_path))


def test_a_padded_width_the_heads_do_not_divide_exports_and_reads_back_as_the_same_model(tmp_path):
    """Width 36 with 3 heads of 12, padded to 64: transformers refuses such a config (64 is not a multiple of 3), GGUF
    and llama.cpp do not; the export checks its tokenizer on a stand-in, and our import gives back our log-probs."""
    from lgpt.plumbing.checkpoint import load_model
    src = save(llama(hidden=36, n_head=3, n_kv_head=1, head_dim=12), tmp_path / "hf", train_tokenizer())
    convert(ConvertConfig(from_hf=src, out_dir=str(tmp_path / "ours")))
    path = str(tmp_path / "padded.gguf")
    convert(ConvertConfig(in_dir=str(tmp_path / "ours"), to_gguf=path, pad_width=32))
    convert(ConvertConfig(from_gguf=path, out_dir=str(tmp_path / "back")))
    ours, back = load_model(str(tmp_path / "ours"))[0].eval(), load_model(str(tmp_path / "back"))[0].eval()
    assert (back.config.n_embd, back.config.n_head, back.config.head_dim) == (64, 3, 12)
    idx = torch.randint(0, 320, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(back(idx, all_logits=True)[0].log_softmax(-1),
                                   ours(idx, all_logits=True)[0].log_softmax(-1), atol=2e-5, rtol=0)
    assert sorted(os.listdir(tmp_path)) == ["back", "hf", "ours", "padded.gguf"]


def test_peak_memory_is_the_programs_own_not_its_parents():
    """A timing runs in a fresh process started by a large one: its peak must be its own (getrusage's ru_maxrss
    is inherited across exec and would report the parent's)."""
    import subprocess
    ballast = bytearray(600 * 2 ** 20)  # the parent's peak: over 600 MB
    ballast[::4096] = b"x" * len(ballast[::4096])  # touched, so resident
    child = subprocess.run([sys.executable, "-c", "from lgpt.formats.llama_cpp import peak_rss_mb; "
                            "print(peak_rss_mb())"], capture_output=True, text=True, check=True,
                           cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    assert 0 < float(child.stdout) < 400, child.stdout
    del ballast


def test_speed_measures_prompt_and_generation(narrow, tmp_path):
    pytest.importorskip("llama_cpp")
    path = str(tmp_path / "m.gguf")
    convert(ConvertConfig(in_dir=narrow, to_gguf=path, gguf_type="Q8_0", pad_width=32))
    llm = lcpp.load(path, 48, threads=1)
    timing = lcpp.speed(llm, list(range(2, 34)), generate=8, repeats=1)
    llm.close()
    assert timing["prompt_tokens"] == 32 and timing["generated_tokens"] == 8
    assert timing["prompt_tokens_per_s"] > 0 and timing["generate_tokens_per_s"] > 0 and timing["peak_rss_mb"] > 0
