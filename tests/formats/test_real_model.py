"""A real pretrained model: SmolLM2-135M-Instruct as fetch.py gets it (GGUF, Q4_1) — imported exactly, shrunk, and
written back as GGUF. About a minute on one core.

The model is read from the cache (``python fetch.py --what=smollm2``; .ci/run does it first). Without it these
tests are skipped locally, and fail under CI=true: CI must always run them.
"""
import math
import os

import pytest
import torch

from conftest import spec
from fetch import SMOLLM2_GGUF
from hf_models import fetched, shakespeare_text
from lgpt.plumbing.checkpoint import load_model
from lgpt.plumbing.dataset import BatchLoader, Tokenizer, evaluate_loss, prepare_text

transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

from convert import ConvertConfig, convert  # noqa: E402

GGUF = fetched(SMOLLM2_GGUF, "smollm2")

TEXT = ("ROMEO: But, soft! what light through yonder window breaks? It is the east, and Juliet is the sun. "
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>")


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("smollm2") / "ours")
    convert(ConvertConfig(from_gguf=GGUF, out_dir=out))
    return out


def test_import_matches_transformers_on_the_same_file(imported):
    """Our reader and transformers' read the same GGUF: the same architecture, tokens and log-probs (≤ 1e-4)."""
    model, ckpt = load_model(imported)
    cfg = model.config
    assert (cfg.n_embd, cfg.n_layer, cfg.n_head, cfg.kv_heads, cfg.mlp_hidden, cfg.vocab_size, cfg.head) == \
        (576, 30, 9, 3, 1536, 49152, "tied")
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    folder, name = os.path.split(GGUF)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()
    their_ids = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)(TEXT)["input_ids"]
    ids = Tokenizer(ckpt["meta"]).encode(TEXT)
    assert ids == their_ids and ckpt["meta"]["gguf_pre"] == "smollm"
    x = torch.tensor([ids])
    with torch.no_grad():
        a = theirs(x).logits.float().log_softmax(-1)
        b = model(x, all_logits=True)[0].float().log_softmax(-1)
    assert a.std() > 1.0 and (a - b).abs().max() <= 1e-4, (a - b).abs().max()


def test_it_is_a_trained_model_that_knows_the_capital_of_france(imported):
    model, ckpt = load_model(imported)
    tokenizer = Tokenizer(ckpt["meta"])
    prompt = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    ids = torch.tensor([tokenizer.encode(prompt)])
    answer = model.eval().generate(ids, 6, top_k=1)[0, ids.shape[1]:].tolist()
    assert "Paris" in tokenizer.decode(answer), tokenizer.decode(answer)


def test_gguf_export_round_trips_bit_for_bit(imported, tmp_path):
    from lgpt.formats.gguf_file import read_gguf
    path = str(tmp_path / "smollm2-f32.gguf")
    convert(ConvertConfig(in_dir=imported, to_gguf=path))
    reader = gguf.GGUFReader(path)
    original = gguf.GGUFReader(GGUF)
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.pre", "tokenizer.ggml.eos_token_id"):
        assert reader.fields[key].contents() == original.fields[key].contents(), key
    back = read_gguf(path).hf_state
    again = read_gguf(GGUF).hf_state
    assert back.keys() == again.keys() and all(torch.equal(back[k], again[k]) for k in back)


def test_a_pca_shrink_with_a_small_calibration_gives_a_working_model(imported, tmp_path):
    """m/d = 0.75 on 2 × 4 × 64 calibration tokens: heads and MLP kept, a loss far below uniform's log V."""
    from lgpt.method.pipeline import transform_model
    model, ckpt = load_model(imported)
    data = str(tmp_path / "data")
    prepare_text(shakespeare_text()[:60_000], data, ckpt["meta"])
    loader = BatchLoader(data, 64, 4, "cpu")
    small, record = transform_model(model, spec(432, kind="pca", calib_batches=2), loader)
    assert small.config.n_embd == 432 and small.config.head_dim == 64 and small.config.kv_heads == 3
    loss = evaluate_loss(small, loader, "val", 4)
    assert math.isfinite(loss) and loss < 0.75 * math.log(49152), loss
    assert record["jl_points"] > 49152


def test_a_hadamard_rotation_of_the_real_model_is_exact(imported, tmp_path):
    """QuaRot's rotation at m = d = 576 (16 × a Paley order 36) keeps SmolLM2's function, as the quantization study
    (scripts/real_quantization.py) relies on."""
    from transform import TransformConfig, transform_checkpoint
    out = str(tmp_path / "rotated")
    transform_checkpoint(TransformConfig(in_dir=imported, out_dir=out, width=576, kind="hadamard", eval_iters=0,
                                         seed=1))
    model, ckpt = load_model(imported)
    rotated, record = load_model(out)
    assert record["transform"]["exact"]
    idx = torch.tensor([Tokenizer(ckpt["meta"]).encode(TEXT)])
    with torch.no_grad():
        torch.testing.assert_close(rotated(idx, all_logits=True)[0], model(idx, all_logits=True)[0], atol=2e-3,
                                   rtol=1e-4)
