"""The real Gemma 3 270M as fetch.py gets it (GGUF, Q4_K_M, four chunks joined): imported as transformers reads the
same file, grown exactly by a map that mixes coordinates, and written back as GGUF and Hugging Face. A peri-LN
model whose output gains span four orders of magnitude (results/real_gemma3): what the paper's peri-LN argument is
about.

The model is read from the cache (``python fetch.py --what=gemma3``; .ci/run does it first). Without it these
tests are skipped locally, and fail under CI=true: CI must always run them.
"""
import os

import pytest
import torch

from fetch import GEMMA3_GGUF
from hf_models import fetched
from lgpt.plumbing.checkpoint import load_model
from lgpt.plumbing.dataset import Tokenizer

transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

from convert import ConvertConfig, convert  # noqa: E402

GGUF = fetched(GEMMA3_GGUF, "gemma3")

TEXT = "ROMEO: But, soft! what light through yonder window breaks? It is the east, and Juliet is the sun."


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("gemma3") / "ours")
    convert(ConvertConfig(from_gguf=GGUF, out_dir=out))
    return out


@pytest.fixture(scope="module")
def reference(imported):
    model, ckpt = load_model(imported)
    ids = torch.tensor([Tokenizer(ckpt["meta"]).encode(TEXT)])
    with torch.no_grad():
        return ids, model.eval()(ids, all_logits=True)[0].double().log_softmax(-1)


@pytest.fixture(scope="module")
def exported(imported, tmp_path_factory):
    """Our F32 GGUF export of the imported model (written once: 1 GB)."""
    path = str(tmp_path_factory.mktemp("gemma3-gguf") / "gemma3-f32.gguf")
    convert(ConvertConfig(in_dir=imported, to_gguf=path))
    return path


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def test_import_matches_transformers_on_the_same_file(imported, reference):
    """Our reader and transformers' read the same GGUF: the same architecture, tokens and log-probs."""
    model, ckpt = load_model(imported)
    cfg = model.config
    assert (cfg.n_embd, cfg.n_layer, cfg.n_head, cfg.kv_heads, cfg.head_dim, cfg.vocab_size, cfg.head,
            cfg.norm_placement, cfg.qk_norm) == (640, 18, 4, 1, 256, 262144, "tied", "peri", True)
    assert sum(p.numel() for p in model.parameters()) == 268_098_176
    folder, name = os.path.split(GGUF)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()
    their_ids = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)(TEXT, add_special_tokens=False)
    their_ids = their_ids["input_ids"]  # our datasets are one stream of text: no BOS (add_bos_token = false)
    ids, ours = reference
    assert ids[0].tolist() == their_ids
    with torch.no_grad():
        theirs_lp = theirs(ids).logits.double().log_softmax(-1)
    assert ours.std() > 1.0 and relative_error(ours, theirs_lp) <= 1e-4, relative_error(ours, theirs_lp)


def test_split_growth_to_768_is_exact_and_keeps_the_head_tied(imported, reference):
    """#73's goal: growth to m = 768 by a non-coordinate orthonormal map, exact to ≤ 1e-4 relative log-probs (a
    Haar-random orthogonal map cannot carry these gains: tests/formats/test_gemma3.py, on random weights)."""
    from conftest import spec
    from lgpt.method.pipeline import transform_model
    ids, ours = reference
    grown, record = transform_model(load_model(imported)[0].eval(), spec(768, kind="split"))
    assert record["exact"] and int(((record["T"] != 0).sum(1) == 2).sum()) == 2 * 128
    assert grown.lm_head.weight is grown.transformer.wte.weight
    with torch.no_grad():
        lp = grown(ids, all_logits=True)[0].double().log_softmax(-1)
    assert relative_error(lp, ours) <= 1e-4, relative_error(lp, ours)


def test_gguf_export_round_trips_bit_for_bit(imported, exported, tmp_path):
    """Our F32 GGUF export of the imported model, imported again, is the same checkpoint bit for bit, with the
    original file's vocabulary and layer pattern (transformers reads such exports: tests/formats/test_gemma3.py)."""
    from lgpt.formats.gguf_file import open_reader
    original = {key: open_reader(GGUF).fields[key].contents()
                for key in ("tokenizer.ggml.model", "gemma3.attention.sliding_window", "tokenizer.ggml.tokens")}
    reader = open_reader(exported)
    for key in ("tokenizer.ggml.model", "gemma3.attention.sliding_window"):
        assert reader.fields[key].contents() == original[key], key
    # known difference: the original file spells some whitespace tokens with spaces ('  '), our export with ▁
    # (SentencePiece's spelling, docs/real_models.md); the vocabulary is otherwise the same, token for token
    theirs = [t.replace(" ", "▁") for t in original["tokenizer.ggml.tokens"]]
    assert reader.fields["tokenizer.ggml.tokens"].contents() == theirs
    path = exported
    again = str(tmp_path / "again")
    convert(ConvertConfig(from_gguf=path, out_dir=again))
    a, b = load_model(imported)[0].state_dict(), load_model(again)[0].state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_llama_cpp_reads_our_gguf_as_our_model(exported, reference):
    """llama.cpp's logits of our F32 export give our losses (skipped where llama-cpp-python is not installed: it
    builds from source, so CI has no copy)."""
    pytest.importorskip("llama_cpp")
    import numpy as np

    from lgpt.formats import llama_cpp as lcpp
    ids, ours = reference
    path = exported
    x, y = ids[0, :-1].numpy(), ids[0, 1:].numpy()
    theirs = lcpp.window_losses(lcpp.load(path, 64, threads=1, logits_all=True, f32_cache=True), [(x, y)])
    # 1.5e-3 nats apart here (a mean loss near 9), not diagnosed: one candidate is ggml's fp16 table for GELU
    np.testing.assert_allclose(theirs, [float(-ours[0, np.arange(len(y)), y].mean())], rtol=0, atol=3e-3)
